import copy
import csv
import math
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from template.callbacks import NonFiniteGuard
from template.data import DigitsDataModule
from template.module import ClassificationModule, parameter_groups
from template.nets import ResNetSmall
from template.schedule import WarmupCosine


def make_module(**kwargs) -> ClassificationModule:
    net = ResNetSmall(num_classes=10, in_channels=1)
    return ClassificationModule(net, num_classes=10, **kwargs)


def test_no_weight_decay_on_norm_weights_and_biases():
    module = make_module(optimizer=partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.05), lr_scheduler=None)
    optimizer = module.configure_optimizers()["optimizer"]
    decay_of = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    assert len(decay_of) == sum(1 for _ in module.net.parameters())  # every parameter, exactly once
    for name, submodule in module.net.named_modules():
        if isinstance(submodule, nn.BatchNorm2d):
            assert decay_of[id(submodule.weight)] == 0.0, name
            assert decay_of[id(submodule.bias)] == 0.0, name
        elif isinstance(submodule, nn.Conv2d | nn.Linear):
            assert decay_of[id(submodule.weight)] == 0.05, name
    assert decay_of[id(module.net.head.bias)] == 0.0


def test_frozen_parameters_are_left_out_of_the_groups():
    net = ResNetSmall(num_classes=3, in_channels=1)
    net.stem.requires_grad_(False)
    grouped = {id(p) for group in parameter_groups(net) for p in group["params"]}
    assert not any(id(p) in grouped for p in net.stem.parameters())


class Tempered(ClassificationModule):
    """A customisation: a learnable temperature beside the network."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.temperature = nn.Parameter(torch.ones(1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return super().forward(images) / self.temperature


def test_a_subclass_own_parameters_are_trained_beside_the_network():
    net = ResNetSmall(num_classes=10, in_channels=1)
    module = Tempered(net, num_classes=10, optimizer=partial(torch.optim.AdamW, lr=0.05, weight_decay=0.05))
    trainer = L.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(module, DigitsDataModule(batch_size=32))
    decay_of = {id(p): group["weight_decay"] for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert decay_of[id(module.temperature)] == 0.0  # in a group, without weight decay (one dimension)
    assert module.temperature.item() != 1.0


def lrs(scheduler: WarmupCosine, steps: int) -> list[float]:
    values = []
    for _ in range(steps):
        values.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return values


def sgd() -> torch.optim.Optimizer:
    return torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)


def test_warmup_then_cosine_at_known_steps():
    values = lrs(WarmupCosine(sgd(), total_steps=100, warmup_fraction=0.1), 100)
    assert values[0] == pytest.approx(0.1)  # (0 + 1) / 10: the first step already learns
    assert values[4] == pytest.approx(0.5)
    assert values[9] == pytest.approx(1.0)
    assert values[10] == pytest.approx(1.0)  # cosine starts at the peak
    assert values[55] == pytest.approx(0.5)  # half way through the 90 decay steps
    assert values[99] == pytest.approx(0.5 * (1 + math.cos(math.pi * 89 / 90)))
    assert all(a >= b for a, b in zip(values[10:], values[11:]))


def test_warm_restarts_and_floor():
    values = lrs(WarmupCosine(sgd(), total_steps=100, warmup_fraction=0.0, cycles=2, min_lr_ratio=0.1), 100)
    assert values[0] == pytest.approx(1.0)
    assert values[25] == pytest.approx(0.1 + 0.9 * 0.5)
    assert values[49] < 0.11 and values[50] == pytest.approx(1.0)  # the restart
    assert min(values) >= 0.1


@pytest.mark.parametrize(
    "kwargs, message",
    [({"total_steps": 0}, "total_steps"), ({"warmup_fraction": 1.0}, "warmup_fraction"), ({"cycles": 0}, "cycles")],
)
def test_scheduler_refuses_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WarmupCosine(sgd(), **{"total_steps": 10, **kwargs})


def test_loss_is_cross_entropy_on_raw_logits_with_label_smoothing():
    torch.manual_seed(0)
    logits, labels = torch.randn(8, 10), torch.randint(0, 10, (8,))
    assert make_module()._loss(logits, labels) == pytest.approx(F.cross_entropy(logits, labels).item())
    log_probs = logits.log_softmax(dim=1)
    smoothed = 0.9 * F.nll_loss(log_probs, labels) + 0.1 * (-log_probs.mean(dim=1)).mean()
    assert make_module(label_smoothing=0.1)._loss(logits, labels).item() == pytest.approx(smoothed.item(), rel=1e-5)


def test_objects_passed_from_python_stay_out_of_the_hyperparameters():
    module = make_module(class_names=[f"c{k}" for k in range(10)], input_shape=(1, 8, 8))
    switches = {
        "channels_last",
        "compile",
        "flip_tta",
        "tta_translate",
        "layer_decay",
        "scheduler_interval",
        "scheduler_monitor",
    }
    assert set(module.hparams) == {"num_classes", "class_names", "input_shape", "label_smoothing", *switches}
    assert module.example_input_array.shape == (2, 1, 8, 8)
    with pytest.raises(ValueError, match=r"'3 names' is not one for each of its 10 classes \(num_classes=10\)"):
        make_module(class_names=["a", "b", "c"])
    twice = [(["a", "b", "a"], "'a' is a class name given twice"), (["a", "b\n"], r"'b\\n' is a class name")]
    twice.append((["caf\u00e9", "cafe\u0301"], r"'café' is a class name given twice \(or as two Unicode forms"))
    for names, why in twice:
        with pytest.raises(ValueError, match=why):  # a checkpoint of the run would be refused: said before it trains
            make_module(class_names=[*names, *map(str, range(10 - len(names)))])


def test_flip_tta_averages_the_logits_of_each_image_and_its_mirror():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))  # not mirror-symmetric: a flip changes its output
    images, labels = torch.randn(2, 1, 3, 4), torch.tensor([0, 2])
    module = ClassificationModule(net, num_classes=3, flip_tta=True)
    expected = (net(images) + net(images.flip(-1))) / 2
    assert not torch.allclose(expected, net(images))
    torch.testing.assert_close(module.validation_step((images, labels), 0), expected)
    torch.testing.assert_close(module.predict_step((images,), 0), expected.softmax(1))


def test_train_acc_is_logged_every_epoch_of_every_fit_of_the_same_module():
    module = ClassificationModule(ResNetSmall(10, 1), lr_scheduler=None)
    for _ in range(2):  # e.g. Tuner.lr_find, then fit: both start at epoch 0
        trainer = L.Trainer(
            max_epochs=1, limit_train_batches=2, limit_val_batches=0, logger=False, accelerator="cpu",
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(module, datamodule=DigitsDataModule())
        assert "train/acc" in trainer.callback_metrics


class Outputs(L.Callback):
    def __init__(self):
        self.seen = []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.seen.append((outputs, batch[1]))


def test_validation_reports_the_loss_and_accuracy_of_the_whole_split_and_a_nan_loss_as_nan(monkeypatch):
    torch.manual_seed(0)
    module, outputs, logged = make_module(label_smoothing=0.1), Outputs(), []
    log = ClassificationModule.log

    def counted(self, name, *args, **kwargs):
        logged.append(name)
        return log(self, name, *args, **kwargs)

    monkeypatch.setattr(ClassificationModule, "log", counted)
    trainer = L.Trainer(
        logger=False, accelerator="cpu", callbacks=[outputs],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    [result] = trainer.validate(module, datamodule=DigitsDataModule(batch_size=100))
    logits, labels = (torch.cat(parts) for parts in zip(*outputs.seen))
    assert len(outputs.seen) > 1 and len(labels) % 100  # a last, smaller batch: a mean of batch means would differ
    loss = F.cross_entropy(logits, labels)  # without the training loss's label smoothing
    assert result["val/loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert result["val/acc"] == pytest.approx((logits.argmax(1) == labels).float().mean().item())
    assert sorted(logged) == ["val/acc", "val/loss"]  # once a validation, not once a batch (~0.3 ms a call)
    with torch.no_grad():
        module.net.head.weight.fill_(float("nan"))
    [result] = trainer.validate(module, datamodule=DigitsDataModule(batch_size=100))
    assert math.isnan(result["val/loss"])  # shown, not dropped as torchmetrics' mean does by default


def test_val_and_test_loss_are_the_same_whatever_the_label_smoothing():
    """The sweep varies label_smoothing: with it in val/loss, a smoother run's loss read higher for the same
    predictions, and runs were compared on different scales."""
    trainer = L.Trainer(
        logger=False, accelerator="cpu", limit_val_batches=2, limit_test_batches=2,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    torch.manual_seed(0)
    plain, smoothed = make_module(), make_module(label_smoothing=0.3)
    smoothed.load_state_dict(plain.state_dict())
    for evaluate in (trainer.validate, trainer.test):
        [[plain_result], [smoothed_result]] = (evaluate(m, datamodule=DigitsDataModule()) for m in (plain, smoothed))
        assert plain_result == pytest.approx(smoothed_result, rel=1e-6)


class FirstBatch(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch = batch


def test_gradient_clip_val_clips_exactly_as_torch_does_with_the_nan_guard_on():
    L.seed_everything(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    before = copy.deepcopy(net)
    module = ClassificationModule(net, optimizer=partial(torch.optim.SGD, lr=1.0), lr_scheduler=None)
    first = FirstBatch()
    trainer = L.Trainer(
        max_steps=1, gradient_clip_val=0.01, callbacks=[NonFiniteGuard(), first], limit_val_batches=0, logger=False,
        accelerator="cpu", enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, datamodule=DigitsDataModule(crop_padding=0))

    images, labels = first.batch
    F.cross_entropy(before(images), labels).backward()
    total = torch.nn.utils.clip_grad_norm_(before.parameters(), 0.01)
    assert total > 0.01  # the clip bites
    with torch.no_grad():
        for parameter in before.parameters():
            parameter -= parameter.grad  # SGD, lr 1
    for ours, reference in zip(net.parameters(), before.parameters()):
        torch.testing.assert_close(ours, reference)


@pytest.mark.parametrize("accumulate, expected", [(1, [4, 9, 14]), (2, [1, 3, 5, 7])])
def test_step_metrics_land_once_at_each_step_lightning_logs_at(run_cli, accumulate, expected):
    # 18 batches an epoch: 18 optimizer steps, or 9 when two batches are accumulated into each.
    run = run_cli(
        "fit", "--trainer.max_epochs", "1", "--trainer.log_every_n_steps", str(5 if accumulate == 1 else 2),
        "--trainer.accumulate_grad_batches", str(accumulate),
    )  # fmt: skip
    events = EventAccumulator(run.trainer.log_dir)
    events.Reload()
    steps = {
        tag: [event.step for event in events.Scalars(tag)] for tag in ("train/loss", "train/grad_norm", "lr/decay")
    }
    assert steps["train/loss"] == steps["train/grad_norm"] == expected
    assert sorted(set(steps["lr/decay"])) == expected  # (LearningRateMonitor writes each micro-batch's)
    rows = list(csv.DictReader((Path(run.trainer.log_dir) / "metrics.csv").open()))
    assert float(rows[-1]["train/loss"]) > 0 and float(rows[-1]["train/grad_norm"]) > 0  # in callback_metrics too


def test_a_fit_with_mixup_and_cutmix_has_a_finite_loss_and_an_accuracy_on_the_larger_share(run_cli):
    # Labels arrive as class probabilities (B, K): the loss takes them, train/acc their argmax.
    run = run_cli(
        "fit", "--data.mixup_alpha", "0.4", "--data.cutmix_alpha", "1.0", "--data.policy", "trivialaugment",
        "--data.random_erasing", "0.25", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4",
        "--trainer.limit_val_batches", "2", "--trainer.log_every_n_steps", "2",
    )  # fmt: skip
    rows = list(csv.DictReader((Path(run.trainer.log_dir) / "metrics.csv").open()))
    assert math.isfinite(float(rows[-1]["train/loss"])) and float(rows[-1]["train/loss"]) > 0
    assert 0 <= float(rows[-1]["train/acc"]) <= 1 and 0 <= float(rows[-1]["val/acc"]) <= 1
    assert run.trainer.callback_metrics["train/images_per_sec"] > 0  # the monitor counted the images
