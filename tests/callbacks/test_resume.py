"""Exact resume, pre-emption and reproducibility, on real runs of the CLI."""

import csv
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from template.callbacks.resume import REPEAT_AFTER_S
from template.checkpoints import CheckpointError, load_checkpoint

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DETERMINISTIC = ["--trainer.deterministic", "true", "--trainer.log_every_n_steps", "5"]


class StopAfterEpochs(L.Callback):
    """Ends fit after ``epochs`` epochs without changing max_epochs (and so the LR schedule)."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(checkpoint)["state_dict"]


def scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def epoch_rows(run_dir: Path) -> list[tuple[str, str]]:
    """(epoch, val/acc) of every row of the run's metrics.csv."""
    return [(row["epoch"], row["val/acc"]) for row in csv.DictReader((run_dir / "metrics.csv").open())]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
@pytest.mark.parametrize(
    "augmentation",
    [[], ["--data.policy", "trivialaugment", "--data.random_erasing", "0.5", "--data.mixup_alpha", "0.2"]],
    ids=["recipe", "strong augmentation"],
)
def test_k_epochs_then_resume_equals_a_straight_run(run_cli, tmp_path, augmentation):
    straight = run_cli("fit", "--trainer.max_epochs", "4", *DETERMINISTIC, *augmentation)
    straight_dir = Path(straight.trainer.log_dir)

    stop = tmp_path / "stop.yaml"
    stop.write_text(
        "trainer:\n  callbacks:\n    - class_path: test_resume.StopAfterEpochs\n      init_args: {epochs: 2}\n"
    )
    first = run_cli("fit", "--trainer.max_epochs", "4", *DETERMINISTIC, *augmentation, "--config", str(stop))
    resumed_dir = Path(first.trainer.log_dir)
    assert load_checkpoint(resumed_dir / "checkpoints" / "last.ckpt")["epoch"] == 1  # stopped after 2 of 4
    resumed = run_cli("fit", "--trainer.max_epochs", "4", *DETERMINISTIC, "--ckpt_path", "last")

    assert Path(resumed.trainer.log_dir) == resumed_dir  # logging went on in the same run directory
    assert epoch_rows(resumed_dir) == epoch_rows(straight_dir)  # metrics.csv kept the epochs before the resume
    assert (resumed_dir / "env.json").is_file() and (resumed_dir / "env-2.json").is_file()
    assert_same_weights(
        weights(straight_dir / "checkpoints" / "last.ckpt"), weights(resumed_dir / "checkpoints" / "last.ckpt")
    )
    logged, relogged = scalars(straight_dir), scalars(resumed_dir)
    assert {"val/acc", "val/loss", "train/loss", "train/grad_norm"} <= logged.keys()
    clock = {"train/epoch_time", "train/images_per_sec"}  # wall-clock measurements differ by nature
    assert logged.keys() == relogged.keys()
    assert {k: v for k, v in logged.items() if k not in clock} == {k: v for k, v in relogged.items() if k not in clock}
    assert all(logged[tag].keys() == relogged[tag].keys() for tag in clock)  # logged at the same steps


@pytest.mark.slow
def test_two_deterministic_runs_give_identical_weights(run_cli):
    runs = [run_cli("fit", "--trainer.max_epochs", "2", *DETERMINISTIC) for _ in range(2)]
    first, second = (Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt" for run in runs)
    assert_same_weights(weights(first), weights(second))
    record = json.loads((first.parent.parent / "env.json").read_text())
    assert record["seed"] == 42 and record["deterministic_algorithms"] is True and record["cudnn_benchmark"] is False
    assert record["packages"]["torch"] == torch.__version__.split("+")[0]


def test_a_run_resumed_at_an_epochs_end_trains_the_next_epoch_with_worker_processes(run_cli, tmp_path):
    """Lightning starts a resumed run's loader (its worker processes take their first indices) before it sets the
    sampler's next epoch: the epoch it resumes at must already be the next one, or that epoch runs no batch."""
    short = [*DETERMINISTIC, "--trainer.limit_train_batches", "3", "--data.num_workers", "1"]
    straight = run_cli("fit", "--trainer.max_epochs", "3", *short)
    stop = tmp_path / "stop.yaml"
    stop.write_text(
        "trainer:\n  callbacks:\n    - class_path: test_resume.StopAfterEpochs\n      init_args: {epochs: 1}\n"
    )
    first = run_cli("fit", "--trainer.max_epochs", "3", *short, "--config", str(stop))
    resumed = run_cli("fit", "--trainer.max_epochs", "3", *short, "--ckpt_path", "last")
    assert resumed.trainer.global_step == 9 and Path(resumed.trainer.log_dir) == Path(first.trainer.log_dir)
    assert_same_weights(
        *(weights(Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt") for run in (straight, resumed))
    )


def fit_command(runs_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "template", "fit",
        "--trainer.logger.init_args.save_dir", str(runs_dir),
        "--trainer.callbacks", "[]",
        "--trainer.enable_progress_bar", "false",
        "--trainer.max_epochs", "8",
        "--trainer.deterministic", "true",
        "--data.init_args.batch_size", "16",
        *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_exits_nonzero_and_the_run_resumes_exactly(tmp_path):
    straight = subprocess.run(fit_command(tmp_path / "straight"), capture_output=True, text=True, cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]

    runs = tmp_path / "preempted"
    process = subprocess.Popen(
        fit_command(runs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    checkpoints = runs / "digits" / "version_0" / "checkpoints"
    deadline = time.time() + 120
    while not (checkpoints / "last.ckpt").exists() and time.time() < deadline:
        time.sleep(0.02)  # the first epoch is done: training is under way
    time.sleep(0.15)  # somewhere inside the second epoch
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-3000:]
    preempted = checkpoints / "preempted.ckpt"
    assert "Stopped by SIGTERM after global step" in stderr and str(preempted) in stderr
    record = json.loads((runs / "digits" / "version_0" / "env.json").read_text())
    assert record["command"].startswith("python -m template fit --trainer.logger.init_args.save_dir")
    stopped_at = load_checkpoint(preempted)["global_step"]
    assert 0 < stopped_at < 8 * (1150 // 16)

    resumed = subprocess.run(
        fit_command(runs, "--ckpt_path", str(preempted)), capture_output=True, text=True, cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = load_checkpoint(checkpoints / "last.ckpt")
    assert final["epoch"] == 7
    assert [epoch for epoch, _ in epoch_rows(runs / "digits" / "version_0")] == [str(e) for e in range(8)]
    assert_same_weights(
        weights(tmp_path / "straight" / "digits" / "version_0" / "checkpoints" / "last.ckpt"), final["state_dict"]
    )
    # The epoch stopped within reports the accuracy of all its batches (it was of those after the resume alone).
    accuracy = [scalars(runs / "digits" / "version_0")["train/acc"] for runs in (tmp_path / "straight", runs)]
    assert len(accuracy[0]) == 8 and accuracy[1] == accuracy[0]


SIGTERM_AFTER = """import os, signal
import lightning as L


class SigtermAfter(L.Callback):
    def __init__(self, step: int, validating: bool = False) -> None:
        self.step, self.validating = step, validating

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == 1 and batch_idx == self.step and not self.validating:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if trainer.current_epoch == 1 and batch_idx == self.step and self.validating and not trainer.sanity_checking:
            os.kill(os.getpid(), signal.SIGTERM)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "after, validating, step",
    [("0", [], 3), ("2", ["--trainer.val_check_interval", "3"], 4)],  # the second: a validation within the group
    ids=["training", "a validation within the epoch"],
)
def test_a_sigterm_within_a_group_of_accumulated_gradients_stops_once_the_group_has_stepped(
    tmp_path, after, validating, step
):
    """Stopped half-way through a group, the resume stepped on the group's second batch alone: the first's
    gradients are in no checkpoint. The run finishes the group first, and resumes exactly."""
    (tmp_path / "sigterm_after.py").write_text(SIGTERM_AFTER)
    short = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "4", *validating]
    short += ["--trainer.accumulate_grad_batches", "2", "--trainer.limit_val_batches", "3"]
    straight = subprocess.run(fit_command(tmp_path / "straight", *short), capture_output=True, text=True, cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    runs = tmp_path / "stopped"
    stop = ["--trainer.callbacks+=sigterm_after.SigtermAfter", "--trainer.callbacks.step", after]
    stopped = subprocess.run(fit_command(runs, *short, *stop), capture_output=True, text=True, cwd=tmp_path)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert f"Stopped by SIGTERM after global step {step}" in stopped.stderr, stopped.stderr[-3000:]
    preempted = runs / "digits" / "version_0" / "checkpoints" / "preempted.ckpt"
    resumed = subprocess.run(fit_command(runs, *short, "--ckpt_path", str(preempted)), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_weights(
        weights(tmp_path / "straight" / "digits" / "version_0" / "checkpoints" / "last.ckpt"),
        weights(runs / "digits" / "version_0" / "checkpoints" / "last.ckpt"),
    )


@pytest.mark.slow
def test_a_sigterm_during_an_epochs_validation_stops_once_it_is_scored_and_the_resume_keeps_that_score(tmp_path):
    """Stopped within validation, the resume started the next epoch: the epoch stopped in had no val/ values, and was
    never a candidate for the best checkpoint. The validation finishes first, then the run stops at the epoch's end."""
    (tmp_path / "sigterm_after.py").write_text(SIGTERM_AFTER)
    short = ["--trainer.max_epochs", "3", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "3"]
    straight = subprocess.run(fit_command(tmp_path / "straight", *short), capture_output=True, text=True, cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    runs = tmp_path / "stopped"
    stop = ["--trainer.callbacks+=sigterm_after.SigtermAfter", "--trainer.callbacks.step", "0"]
    stop += ["--trainer.callbacks.validating", "true"]
    stopped = subprocess.run(fit_command(runs, *short, *stop), capture_output=True, text=True, cwd=tmp_path)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "Stopped by SIGTERM after global step 8" in stopped.stderr, stopped.stderr[-3000:]
    preempted = runs / "digits" / "version_0" / "checkpoints" / "preempted.ckpt"
    resumed = subprocess.run(fit_command(runs, *short, "--ckpt_path", str(preempted)), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    scored = [
        [row for row in epoch_rows(each / "digits" / "version_0") if row[1]] for each in (tmp_path / "straight", runs)
    ]
    assert len(scored[0]) == 3 and scored[1] == scored[0]
    last = [runs / "digits" / "version_0" / "checkpoints" / "last.ckpt" for runs in (tmp_path / "straight", runs)]
    assert_same_weights(*map(weights, last))


def test_a_sigterm_past_the_grace_stops_the_validation_under_way(tmp_path):
    """A scheduler kills a while after its SIGTERM: a validation longer than the grace is stopped, not waited for."""
    (tmp_path / "sigterm_after.py").write_text(SIGTERM_AFTER)
    no_grace = "import template.callbacks.resume\nfrom sigterm_after import SigtermAfter\n\n"
    no_grace += "template.callbacks.resume.VALIDATION_GRACE_S = 0.0\n\n\nclass NoGrace(SigtermAfter):\n    pass\n"
    (tmp_path / "no_grace.py").write_text(no_grace)
    short = ["--trainer.max_epochs", "3", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "3"]
    stop = ["--trainer.callbacks+=no_grace.NoGrace", "--trainer.callbacks.step", "0"]
    stop += ["--trainer.callbacks.validating", "true"]
    stopped = subprocess.run(fit_command(tmp_path, *short, *stop), capture_output=True, text=True, cwd=tmp_path)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    loops = load_checkpoint(tmp_path / "digits" / "version_0" / "checkpoints" / "preempted.ckpt")["loops"]
    assert loops["fit_loop"]["epoch_loop.val_loop.batch_progress"]["current"]["completed"] == 1  # of 3


@pytest.mark.slow
def test_a_mid_epoch_resume_does_not_relay_lightnings_warning_of_an_unresumable_loader(run_cli, recwarn):
    """The DataModule resumes the training order itself (its state: ResumableSampler), which Lightning cannot see."""
    run_cli("fit", "--trainer.max_steps", "3", "--trainer.limit_val_batches", "1")  # the digits: 18 steps an epoch
    run_cli("fit", "--ckpt_path", "last", "--trainer.max_steps", "5", "--trainer.limit_val_batches", "1")
    assert not [warning for warning in recwarn if "not resumable" in str(warning.message)]


def test_resuming_with_more_epochs_replans_the_schedule_over_the_new_total(run_cli):
    short = ["--trainer.limit_train_batches", "6", "--trainer.log_every_n_steps", "1"]
    run_cli("fit", "--trainer.max_epochs", "2", *short)
    longer = run_cli("fit", "--trainer.max_epochs", "4", *short, "--ckpt_path", "last")
    run_dir = Path(longer.trainer.log_dir)
    lr = scalars(run_dir)["lr/decay"]
    assert lr[11] < 1e-4  # the first run's schedule ended at its floor
    assert lr[12] > 0.001 and all(value > 0 for step, value in lr.items() if step >= 12)  # the new one trains on
    assert lr[12] == pytest.approx(0.003 * (0.5 + 0.5 * math.cos(math.pi * (12 - 1) / (24 - 1))), rel=1e-3)
    assert [epoch for epoch, _ in epoch_rows(run_dir)] == ["0", "1", "2", "3"]


@pytest.mark.slow
def test_resuming_with_fewer_steps_an_epoch_replans_over_the_steps_the_run_has_left(run_cli):
    """Resumed with a larger batch (here: fewer batches), Lightning's estimate counts every epoch at the new size
    from step 0: 4 epochs of 3 steps, 12, which the first run had already reached. The schedule plans over the
    steps done and those left (12 + 2 x 3), not from its floor (an LR of 0) for the rest of the run."""
    run_cli("fit", "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "6")
    fewer = ["--trainer.limit_train_batches", "3", "--trainer.log_every_n_steps", "1"]
    resumed = run_cli("fit", "--trainer.max_epochs", "4", *fewer, "--ckpt_path", "last")
    assert resumed.trainer.lr_scheduler_configs[0].scheduler.total_steps == 18
    lr = scalars(Path(resumed.trainer.log_dir))["lr/decay"]
    assert all(lr[step] > 1e-4 for step in range(12, 17)), lr


def test_a_schedule_length_you_set_is_kept_on_a_resume_of_another_length(run_cli):
    planned = ["--model.lr_scheduler.init_args.total_steps", "40", "--trainer.limit_val_batches", "1"]
    run_cli("fit", "--trainer.max_steps", "4", *planned)  # max_steps stops a longer plan early, on purpose
    resumed = run_cli("fit", "--trainer.max_steps", "6", *planned, "--ckpt_path", "last")
    assert resumed.trainer.lr_scheduler_configs[0].scheduler.total_steps == 40


def test_a_fine_tune_resumed_after_its_backbone_was_unfrozen_continues_with_every_group(run_cli):
    # The unfrozen backbone's groups joined the optimizer and the schedule during the run: a checkpoint then holds
    # more of them than a run just started keeps, and is no damaged one for that.
    short = ["--trainer.limit_train_batches", "3", "--trainer.callbacks+=template.callbacks.FreezeBackbone"]
    run_cli("fit", "--trainer.max_epochs", "2", *short)
    resumed = run_cli("fit", "--trainer.max_epochs", "3", *short, "--ckpt_path", "last")
    assert resumed.trainer.current_epoch == 3
    names = [group["name"] for group in resumed.trainer.optimizers[0].param_groups]
    assert names == ["decay", "no_decay", "backbone_decay", "backbone_no_decay"]
    assert len(resumed.trainer.lr_scheduler_configs[0].scheduler.base_lrs) == 4


def test_a_fine_tune_under_a_schedule_that_cycles_momentum_resumes(run_cli):
    """OneCycleLR moves Adam's betas in every group: a saved FreezeBackbone group's are not the optimizer's own."""
    cycled = ["--model.lr_scheduler", "torch.optim.lr_scheduler.OneCycleLR", "--model.lr_scheduler.max_lr", "0.01"]
    cycled += ["--trainer.limit_train_batches", "10", "--trainer.limit_val_batches", "1", "--trainer.max_epochs", "2"]
    cycled += ["--trainer.callbacks+=template.callbacks.FreezeBackbone"]
    run_cli("fit", *cycled)
    assert run_cli("fit", *cycled, "--ckpt_path", "last").trainer.current_epoch == 2  # its groups taken


def test_a_schedule_period_of_zero_in_a_checkpoint_is_refused_before_training(run_cli):
    """CosineAnnealingWarmRestarts' T_i of 0 trained an epoch, then failed on a modulo by zero, the epoch lost."""
    restarts = ["--model.lr_scheduler", "torch.optim.lr_scheduler.CosineAnnealingWarmRestarts"]
    restarts += [
        "--model.lr_scheduler.T_0",
        "2",
        "--trainer.limit_train_batches",
        "2",
        "--trainer.limit_val_batches",
        "1",
    ]
    run_cli("fit", "--trainer.max_epochs", "1", *restarts)
    last = next(run_cli.runs_dir.rglob("last.ckpt"))
    checkpoint = torch.load(last, weights_only=True)
    del checkpoint["integrity"]  # a digest detects damage, not intent
    checkpoint["lr_schedulers"][0]["T_i"] = 0
    torch.save(checkpoint, last)
    with pytest.raises(CheckpointError, match=r"its lr_schedulers\[0\].T_i is 0, where a schedule's length is at le"):
        run_cli("fit", "--trainer.max_epochs", "3", *restarts, "--ckpt_path", "last")


def test_a_fine_tunes_optimizer_groups_planted_in_its_state_are_refused(run_cli):
    """Lightning sets a resume's optimizer groups from FreezeBackbone's state: with the optimizer state planted alike
    (maximize: gradient ascent), it passed the resume's checks, and the run trained the wrong way, unsaid."""
    short = ["--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1"]
    short += ["--trainer.callbacks+=template.callbacks.FreezeBackbone"]
    run_cli("fit", "--trainer.max_epochs", "2", *short)
    last = next(run_cli.runs_dir.rglob("last.ckpt"))
    checkpoint = torch.load(last, weights_only=True)
    del checkpoint["integrity"]  # a digest detects damage, not intent
    planted = checkpoint["callbacks"]["FreezeBackbone"]["internal_optimizer_metadata"][0]
    for group in [*planted, *checkpoint["optimizer_states"][0]["param_groups"]]:
        group["maximize"] = True
    torch.save(checkpoint, last)
    with pytest.raises(CheckpointError, match=r"its FreezeBackbone state holds optimizer groups of maximize=True, "):
        run_cli("fit", "--trainer.max_epochs", "3", *short, "--ckpt_path", "last")


@pytest.mark.slow
def test_a_fine_tune_preempted_within_an_unfrozen_epoch_trains_its_backbone_as_a_straight_run(tmp_path):
    """Lightning starts no epoch on a resume within one (no on_train_epoch_start), where FreezeBackbone unfroze the
    backbone: frozen again by setup, it stayed frozen for the rest of that epoch, weights and BatchNorm statistics."""
    (tmp_path / "sigterm_after.py").write_text(SIGTERM_AFTER)
    short = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "1"]
    short += ["--trainer.callbacks+=template.callbacks.FreezeBackbone"]
    straight = subprocess.run(fit_command(tmp_path / "straight", *short), capture_output=True, text=True, cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    runs = tmp_path / "stopped"
    stop = ["--trainer.callbacks+=sigterm_after.SigtermAfter", "--trainer.callbacks.step", "0"]  # in epoch 1
    stopped = subprocess.run(fit_command(runs, *short, *stop), capture_output=True, text=True, cwd=tmp_path)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    preempted = runs / "digits" / "version_0" / "checkpoints" / "preempted.ckpt"
    resumed = subprocess.run(fit_command(runs, *short, "--ckpt_path", str(preempted)), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = [each / "digits" / "version_0" / "checkpoints" / "last.ckpt" for each in (tmp_path / "straight", runs)]
    assert_same_weights(*map(weights, last))


def test_a_fine_tune_resumed_without_its_frozen_backbone_is_told_to_resume_with_its_options(run_cli):
    short = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    run_cli("fit", "--trainer.max_epochs", "1", *short, "--trainer.callbacks+=template.callbacks.FreezeBackbone")
    lacking = (
        r"to resume: it was trained with callback\(s\) FreezeBackbone, whose state it holds, and this fit has none"
    )
    with pytest.raises(CheckpointError, match=f"{lacking}: give them again as the run was given them"):
        run_cli("fit", "--trainer.max_epochs", "2", *short, "--ckpt_path", "last")  # configs/finetune.yaml left out


def test_a_resume_in_a_precision_of_state_starts_its_state_anew_and_weights_only_is_named(run_cli, monkeypatch):
    short = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    run_cli("fit", "--trainer.max_epochs", "1", *short, "--last_checkpoint.save_weights_only", "true")
    with pytest.raises(CheckpointError, match=r"it holds no .*optimizer_states.*: saved with weights only"):
        run_cli("fit", "--trainer.max_epochs", "2", *short, "--ckpt_path", "last")
    run_cli("fit", "--trainer.max_epochs", "1", *short)
    # A precision with a state of its own (16-mixed's gradient scaler, on a GPU): the checkpoint has none, no damage.
    monkeypatch.setattr("lightning.pytorch.plugins.precision.Precision.state_dict", lambda self: {"scale": 1.0})
    assert run_cli("fit", "--trainer.max_epochs", "2", *short, "--ckpt_path", "last").trainer.current_epoch == 2


class Hang(L.Callback):
    """Blocks the last rank forever, as a deadlock would: inside the third training step
    (``in_step``) or at the first epoch's end. It writes its process id to ``blocked`` first."""

    def __init__(self, in_step: bool = False) -> None:
        self.in_step = in_step

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self.in_step and trainer.global_step == 2:
            self.block(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.in_step:
            self.block(trainer)

    @staticmethod
    def block(trainer: L.Trainer) -> None:
        if trainer.global_rank == trainer.world_size - 1:
            Path("blocked.tmp").write_text(str(os.getpid()))
            Path("blocked.tmp").rename("blocked")  # whole, when the test sees it
            threading.Event().wait()


def hung_run(cwd: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    """A tiny run with the defaults users get, started and left blocked by ``Hang``; the process
    and the process id of the blocked rank."""
    command = [
        sys.executable, "-m", "template", "fit", "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "4",
        "--trainer.limit_val_batches", "2", "--trainer.callbacks+=test_resume.Hang", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (cwd / "blocked").exists():
        if process.poll() is not None or time.time() > deadline:
            process.kill()
            pytest.fail(f"the run never blocked:\n{process.communicate()[1][-3000:]}")
        time.sleep(0.05)
    return process, int((cwd / "blocked").read_text())


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead and waiting to be reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def exit_status(process: subprocess.Popen, blocked_pid: int, seconds: float = 15) -> int:
    """The status ``process`` exits with within ``seconds``, the blocked rank gone with it; fails
    the test, ending every process of the run, otherwise."""
    try:
        process.communicate(timeout=seconds)  # its pipes close once the ranks it launched are gone too
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"still running {seconds} s after SIGTERM")
    finally:
        left_behind = alive(blocked_pid)
        if left_behind:
            os.kill(blocked_pid, signal.SIGKILL)
    assert not left_behind, "the blocked rank outlived the run"
    return process.returncode


@pytest.mark.slow
def test_sigterm_ends_a_run_blocked_outside_a_step_at_once(tmp_path):
    # Blocked in a Python wait at an epoch's end, where Lightning's handler only sets a flag that
    # nothing reads: `timeout` and schedulers could not stop such a run.
    process, blocked_pid = hung_run(tmp_path)
    process.send_signal(signal.SIGTERM)
    assert exit_status(process, blocked_pid) == 143


@pytest.mark.slow
def test_a_second_sigterm_during_a_step_exits_at_once(tmp_path):
    process, blocked_pid = hung_run(tmp_path, "--trainer.callbacks.in_step", "true")
    process.send_signal(signal.SIGTERM)
    time.sleep(REPEAT_AFTER_S + 0.5)
    assert process.poll() is None  # the first is left to Lightning: the step ends, then it saves
    process.send_signal(signal.SIGTERM)
    assert exit_status(process, blocked_pid) == 143


@pytest.mark.slow
def test_sigterm_ends_a_hung_ddp_run_and_the_ranks_it_launched(tmp_path):
    # Rank 1 blocks at the epoch's end; rank 0 then waits in its next collective, in C++, where
    # no Python signal handler runs. SIGTERM to rank 0 alone, as `kill PID` sends it.
    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    process, rank_1 = hung_run(tmp_path, *ddp)
    time.sleep(1)  # rank 0 into its collective
    process.send_signal(signal.SIGTERM)
    assert exit_status(process, rank_1) == 143
