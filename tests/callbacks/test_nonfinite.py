from pathlib import Path

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, TensorDataset

from template.callbacks import NonFiniteError, NonFiniteGuard
from template.checkpoints import load_checkpoint
from template.data import DigitsDataModule


class NaNDigits(DigitsDataModule):
    """The digits, with NaN pixels in the training batch of one global step."""

    def __init__(self, nan_at_step: int = 30, nan_on_rank: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.nan_at_step = nan_at_step
        self.nan_on_rank = nan_on_rank

    def on_after_batch_transfer(self, batch, dataloader_idx):
        if isinstance(batch, torch.Tensor):  # the model summary's example input
            return super().on_after_batch_transfer(batch, dataloader_idx)
        images, labels = super().on_after_batch_transfer(batch, dataloader_idx)
        rank_matches = self.nan_on_rank is None or self.trainer.global_rank == self.nan_on_rank
        if self.trainer.training and self.trainer.global_step == self.nan_at_step and rank_matches:
            images = images.clone()
            images[0, 0, 0, 0] = float("nan")
        return images, labels


def test_a_nan_stops_training_naming_the_step_and_the_last_checkpoint_stays_good(run_cli):
    # Its run is named after its DataModule, NaNDigits: runs/nandigits.
    # 1,168 training digits in batches of 64: 18 steps an epoch, so step 30 is epoch 1, batch 12.
    with pytest.raises(
        NonFiniteError, match=r"non-finite loss, gradient norm at global step 30, epoch 1, batch index 12"
    ):
        run_cli("fit", "--data", "test_nonfinite.NaNDigits", "--trainer.max_epochs", "3")
    last = next(run_cli.runs_dir.glob("nandigits/version_0/checkpoints/last.ckpt"))
    checkpoint = load_checkpoint(last)
    assert checkpoint["epoch"] == 0 and checkpoint["global_step"] == 18
    assert all(torch.isfinite(value).all() for value in checkpoint["state_dict"].values())


def test_a_nan_in_16_true_precision_names_adams_eps_that_float16_rounds_to_0(run_cli):
    """Lowering the learning rate, the advice given, changed nothing: Adam's eps of 1e-8 is 0 in float16."""
    with pytest.raises(NonFiniteError, match=r"In 16-true precision, Adam's default eps \(1e-8\) is 0 in float16"):
        run_cli(
            "fit", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4", "--trainer.precision", "16-true"
        )


def test_skip_mode_skips_the_step_counts_it_and_training_goes_on(run_cli):
    run = run_cli("fit", "--data", "test_nonfinite.NaNDigits", "--trainer.max_epochs", "3", "--nonfinite.skip", "true")
    run_dir = Path(run.trainer.log_dir)
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert checkpoint["epoch"] == 2
    assert all(torch.isfinite(value).all() for value in checkpoint["state_dict"].values())  # BN statistics too
    assert run.trainer.callback_metrics["val/acc"] > 0.5
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert [event.value for event in events.Scalars("train/skipped_steps")][-1] == 1.0


def test_checking_every_n_steps_names_the_first_bad_step_and_writes_no_checkpoint_after_it(run_cli):
    # Checks fall at steps 8, 16, the epoch's end (18), 26 and 34: step 30's NaN is found at 34.
    with pytest.raises(NonFiniteError, match=r"global step 30, epoch 1, batch index 12 .*check every 8 steps"):
        run_cli(
            "fit", "--data", "test_nonfinite.NaNDigits", "--trainer.max_epochs", "3",
            "--nonfinite.check_every_n_steps", "8",
        )  # fmt: skip
    checkpoint = load_checkpoint(next(run_cli.runs_dir.glob("nandigits/version_0/checkpoints/last.ckpt")))
    assert checkpoint["epoch"] == 0 and checkpoint["global_step"] == 18
    assert all(torch.isfinite(value).all() for value in checkpoint["state_dict"].values())


def test_check_every_n_steps_refuses_skip_mode():
    with pytest.raises(ValueError, match="1 with skip"):
        NonFiniteGuard(skip=True, check_every_n_steps=4)


class PlainModule(L.LightningModule):
    """A plain LightningModule, nothing of the template's; its loss is NaN at step 3."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).square().mean()
        return loss * float("nan") if self.global_step == 3 else loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_guard_stops_any_lightning_module_at_the_bad_step_before_it_touches_the_weights():
    data = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=4)
    trainer = L.Trainer(
        max_steps=6, logger=False, callbacks=[NonFiniteGuard()], accelerator="cpu",
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    module = PlainModule()
    with pytest.raises(NonFiniteError, match="non-finite loss, gradient norm at global step 3"):
        trainer.fit(module, data)
    assert trainer.global_step == 3 and all(torch.isfinite(p).all() for p in module.parameters())
