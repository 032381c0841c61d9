"""Any torch scheduler from YAML: its own arguments, the run's total steps where it takes them, its plan checked."""

import csv
import math
import warnings
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.utilities.types import LRSchedulerConfig

from template.commands import main
from template.schedule import WarmupCosine, build_scheduler, check_plan


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


# The schedules that take total_steps, which the template fills with the run's where they are left out.
planning_schedulers = pytest.mark.parametrize(
    "scheduler",
    [
        ["template.schedule.WarmupCosine"],
        ["torch.optim.lr_scheduler.OneCycleLR", "--model.lr_scheduler.max_lr", "0.01"],
    ],
    ids=["WarmupCosine", "OneCycleLR"],
)


@planning_schedulers
def test_a_schedule_the_template_plans_counts_epochs_when_it_steps_per_epoch(run_cli, scheduler):
    """Stepped per epoch, warmup-cosine was planned over the run's 12 optimizer steps: its 3 epoch steps only warmed
    it up, the LR rose all run, and the warning named a total_steps=12 the user never set."""
    quick = ["--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "1", "--trainer.max_epochs", "3"]
    epochs = ["--model.lr_scheduler", *scheduler, "--model.scheduler_interval", "epoch"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trained = run_cli("fit", *quick, *epochs)
    assert not [str(warning.message) for warning in caught if "total_steps" in str(warning.message)]
    assert trained.trainer.lr_scheduler_configs[0].scheduler.total_steps == 3
    rates = [float(row["lr"]) for row in csv.DictReader((Path(trained.trainer.log_dir) / "metrics.csv").open())]
    assert rates[-1] < 0.5 * max(rates)  # the last epoch trains in the decay, not at the warmup's top
    # max_steps ends the run within its second epoch: the plan is over the 2 epochs the run reaches.
    short = run_cli("fit", *quick, *epochs, "--trainer.max_steps", "6", "--trainer.logger.init_args.name", "short")
    assert short.trainer.lr_scheduler_configs[0].scheduler.total_steps == 2


@planning_schedulers
def test_a_schedule_shorter_than_the_run_is_refused_before_training(run_cli, capsys, scheduler):
    """8 planned steps of a 12-step run: warmup-cosine trained the last 4 at its floor (LR 0) in silence, OneCycleLR
    failed mid-run with torch's "Tried to step" text."""
    quick = ["--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "1", "--trainer.max_epochs", "3"]
    short = ["--model.lr_scheduler", scheduler[0], *scheduler[1:], "--model.lr_scheduler.total_steps", "8"]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *run_cli.tiny_args, *quick, *short])
    error = capsys.readouterr().err
    assert exit_info.value.code == 1 and "Traceback" not in error
    assert "model.lr_scheduler.init_args.total_steps=8 optimizer steps, but this run has 12" in error
    assert "Leave total_steps out" in error
    assert not list(run_cli.runs_dir.glob("*/version_*"))  # refused before anything was trained or kept


def plan_warnings(scheduler, interval: str = "epoch", max_epochs: int = 3) -> list[str]:
    """What ``check_plan`` warns of ``scheduler`` in a run of ``max_epochs`` epochs of 4 optimizer steps each."""
    config = LRSchedulerConfig(scheduler, interval=interval)
    steps = 4 * max_epochs if max_epochs > 0 else math.inf  # Lightning's estimate of a run of no set length
    trainer = SimpleNamespace(
        max_epochs=max_epochs, estimated_stepping_batches=steps, lr_scheduler_configs=[config],
        num_training_batches=4, accumulate_grad_batches=1, callbacks=[],
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_plan(trainer)
    return [str(warning.message) for warning in caught]


def test_stochastic_weight_averaging_trains_with_the_recipes_schedule(run_cli):
    """SWA adds an epoch (its BatchNorm update, no optimizer step) once the schedule has planned the run: the plan's
    check counted it as 4 steps the schedule did not cover, and refused the run, blaming a total_steps never given."""
    swa = ["--trainer.callbacks+=StochasticWeightAveraging", "--trainer.callbacks.swa_lrs", "0.001"]
    built = run_cli("fit", "--trainer.max_epochs", "3", "--trainer.limit_train_batches", "4", *swa)
    assert built.trainer.current_epoch == 4 and "val/acc" in built.trainer.callback_metrics  # 3 epochs, and SWA's


def test_a_schedule_the_run_cannot_play_out_as_written_is_named_in_a_warning():
    lr = torch.optim.lr_scheduler
    unfit = {
        "step_size=3 epochs, but this run has 3": lr.StepLR(sgd(), step_size=3),  # never decays
        "milestones=[1, 4] epochs, but this run has 3": lr.MultiStepLR(sgd(), milestones=[1, 4]),
        "T_max=10 epochs, but this run has 3": lr.CosineAnnealingLR(sgd(), T_max=10),  # never reaches its floor
        "T_max=2 epochs, but this run has 3": lr.CosineAnnealingLR(sgd(), T_max=2),  # climbs again after it
    }
    for said, scheduler in unfit.items():
        assert [message for message in plan_warnings(scheduler) if said in message], said
    longer = plan_warnings(WarmupCosine(sgd(), total_steps=20), "step")  # legitimate: max_steps stopping it early
    assert "model.lr_scheduler.init_args.total_steps=20 optimizer steps, but this run has 12" in longer[0]
    fitting = [lr.StepLR(sgd(), step_size=2), lr.MultiStepLR(sgd(), [1, 2]), lr.CosineAnnealingLR(sgd(), T_max=3)]
    assert not [warning for scheduler in fitting for warning in plan_warnings(scheduler)]
    assert not plan_warnings(WarmupCosine(sgd(), total_steps=12), "step")
    assert not plan_warnings(lr.StepLR(sgd(), step_size=5), max_epochs=-1)  # max_epochs -1: no length to hold it to


def test_a_onecycle_run_resumed_for_longer_is_told_its_schedule_keeps_its_length(run_cli, tmp_path, capsys):
    """The refusal quoted OneCycleLR's internal _schedule_phases and said nothing of the run's length."""
    quick = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    one_cycle = ["--model.lr_scheduler", "torch.optim.lr_scheduler.OneCycleLR", "--model.lr_scheduler.max_lr", "0.01"]
    run_cli("fit", *quick, "--trainer.max_epochs", "1", *one_cycle)
    with pytest.raises(SystemExit):
        main(["fit", *run_cli.tiny_args, *quick, "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    error = capsys.readouterr().err
    assert "_schedule_phases" in error and "resume with the run's max_epochs" in error and "--weights_file" in error
