"""Any torch scheduler from YAML: its own arguments, and the run's total steps where it takes them."""

import csv
from functools import partial
from pathlib import Path

import pytest
import torch

from template.schedule import WarmupCosine, build_scheduler


def sgd() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)


def test_a_scheduler_that_plans_the_run_gets_its_total_steps_unless_given():
    one_cycle = {"class_path": "torch.optim.lr_scheduler.OneCycleLR", "init_args": {"max_lr": 1.0}}
    make = partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=1.0)
    assert build_scheduler(make, one_cycle, sgd(), 40).total_steps == 40
    given = {"class_path": "torch.optim.lr_scheduler.OneCycleLR", "init_args": {"max_lr": 1.0, "total_steps": 7}}
    assert build_scheduler(partial(make, total_steps=7), given, sgd(), 40).total_steps == 7
    assert build_scheduler(partial(WarmupCosine, warmup_fraction=0.1), None, sgd(), 50).total_steps == 50
    # StepLR's second argument is its step_size: never the run's total (which kept the LR constant).
    step = build_scheduler(partial(torch.optim.lr_scheduler.StepLR, step_size=2), None, sgd(), 1000)
    assert step.step_size == 2


@pytest.mark.parametrize(
    "scheduler",
    [
        [
            "--model.lr_scheduler",
            "torch.optim.lr_scheduler.StepLR",
            "--model.lr_scheduler.step_size",
            "1",
            "--model.lr_scheduler.gamma",
            "0.5",
        ],
        [
            "--model.lr_scheduler",
            "torch.optim.lr_scheduler.ReduceLROnPlateau",
            "--model.lr_scheduler.factor",
            "0.5",
            "--model.lr_scheduler.patience",
            "0",
            "--model.lr_scheduler.threshold",
            "10",
        ],
    ],  # fmt: skip
    ids=["StepLR", "ReduceLROnPlateau"],
)
def test_torch_schedulers_from_the_command_line_decay_as_asked(run_cli, scheduler):
    quick = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1", "--trainer.max_epochs", "3"]
    trained = run_cli("fit", *quick, *scheduler)
    # Halved after each of the 3 epochs (ReduceLROnPlateau: no val/loss improvement of 10 counts as none).
    assert trained.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.003 * 0.5**3)


def test_an_epoch_counted_schedule_steps_per_epoch_and_the_summary_shows_where_the_lr_went(run_cli, capsys):
    """StepLR's step_size counts epochs, as every PyTorch user reads it: stepped per batch, the LR was 0.0 from the
    first epoch on."""
    quick = ["--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "1", "--trainer.max_epochs", "3"]
    step = ["--model.lr_scheduler", "torch.optim.lr_scheduler.StepLR", "--model.lr_scheduler.step_size", "1"]
    trained = run_cli("fit", *quick, *step, "--model.lr_scheduler.gamma", "0.1")
    metrics = Path(trained.trainer.log_dir) / "metrics.csv"
    rates = [float(row["lr"]) for row in csv.DictReader(metrics.open())]
    assert rates == pytest.approx([0.003, 0.0003, 0.00003])
    assert "learning rate    0.003 at epoch 0, 3e-05 at epoch 2" in capsys.readouterr().out
    # The recipe's warmup-cosine is planned in optimizer steps: stepped per batch (warmup over 5% of 12 steps).
    cosine = run_cli("fit", *quick, "--trainer.logger.init_args.name", "cosine")
    assert cosine.trainer.lr_scheduler_configs[0].interval == "step"
