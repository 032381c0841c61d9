"""The Lightning and torch internals the project leans on live in template/compat.py alone, and still work."""

import re
import signal
from pathlib import Path

import lightning as L
import pytest
import torch

from template.checkpoints import CheckpointError
from template.compat import (
    accumulating,
    at_last_batch,
    batches_done_in_epoch,
    is_compiled,
    kill_launched,
    logged_params,
    name_restore_errors,
    number_past_every_version,
)
from template.data import DigitsDataModule
from template.module import ClassificationModule
from template.nets import ResNetSmall

PACKAGE = Path(__file__).resolve().parents[1] / "template"
# A private name of Lightning or torch: imported (`from lightning... import _x`), or reached as an attribute
# of one of their objects (`trainer.fit_loop`, `._compiled_call_impl`, `._version`...).
PRIVATE = re.compile(
    r"from (lightning|torch)[\w.]* import [^#\n]*\b_[a-z]|\.(fit_loop|batch_progress|launcher)\b|\._(compiled_call_impl|version|checkpoint_connector)\b"
)


def test_no_private_lightning_or_torch_name_outside_the_compat_module():
    found = [f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
             for path in PACKAGE.rglob("*.py") if path.name != "compat.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if PRIVATE.search(line)]  # fmt: skip
    assert not found, "\n".join(found)


def test_each_internal_still_does_what_the_project_needs(monkeypatch, tmp_path):
    seen = {}

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.setdefault("train", []).append(at_last_batch(trainer, validating=False))
            seen.setdefault("accumulating", []).append(accumulating(trainer))

        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            if not trainer.sanity_checking:
                seen.setdefault("val", []).append(at_last_batch(trainer, validating=True))

    class Within(L.Callback):  # a checkpoint within the epoch, and what a fit resumed from it had run of the epoch
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 1:
                trainer.save_checkpoint(tmp_path / "within.ckpt")

        def on_train_start(self, trainer, pl_module):
            seen.setdefault("done", []).append(batches_done_in_epoch(trainer))

    trainer = L.Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=2, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, callbacks=[Probe(), Within()],
                        accumulate_grad_batches=2)  # fmt: skip
    trainer.fit(ClassificationModule(ResNetSmall(10, 1)), DigitsDataModule())
    assert seen == {
        "train": [False, False, True],
        "val": [False, True],
        "done": [0],
        "accumulating": [True, False, False],
    }
    resumed = L.Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=2, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, callbacks=[Within()])  # fmt: skip
    resumed.fit(ClassificationModule(ResNetSmall(10, 1)), DigitsDataModule(), ckpt_path=tmp_path / "within.ckpt")
    assert seen["done"] == [0, 2]
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    checkpoint = torch.load(tmp_path / "a.ckpt", weights_only=True)
    checkpoint["loops"].pop("validate_loop")
    torch.save(checkpoint, tmp_path / "a.ckpt")
    name_restore_errors(trainer)
    with pytest.raises(CheckpointError, match=f"refusing {tmp_path / 'a.ckpt'}: its state could not be restored"):
        trainer.validate(ClassificationModule(ResNetSmall(10, 1)), DigitsDataModule(), ckpt_path=tmp_path / "a.ckpt")
    killed = []
    monkeypatch.setattr(
        trainer.strategy, "_launcher", type("Launcher", (), {"kill": lambda self, s: killed.append(s)})()
    )
    kill_launched(trainer, signal.SIGKILL)
    assert killed == [signal.SIGKILL]
    (tmp_path / "runs" / "n").mkdir(parents=True)
    (tmp_path / "runs" / "n" / "version_0").symlink_to(tmp_path / "nowhere")
    logger = L.pytorch.loggers.TensorBoardLogger(tmp_path / "runs", name="n")
    number_past_every_version(logger)
    assert logger.version == 1
    net = torch.nn.Linear(2, 2)
    assert not is_compiled(net)
    net.compile()
    assert is_compiled(net)
    assert logged_params({"model": {"net": {"class_path": "x"}, "lr": 0.1}}) == {
        "model/net/class_path": "x",
        "model/lr": 0.1,
    }
