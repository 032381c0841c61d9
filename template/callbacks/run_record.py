"""Writes config.yaml and env.json into the run directory: what a rerun needs to reproduce the run."""

import contextlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import lightning as L
import torch
import yaml
from jsonargparse import Namespace
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from template.files import replaced_atomically, write_atomic
from template.runs import loggers_of
from template.text import shown
from template.tracking import RUN_IDS, TRACKER_RUNS, record_trackers

PACKAGES = ("torch", "torchvision", "lightning", "torchmetrics", "numpy", "jsonargparse")


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def environment_record(trainer: L.Trainer | None = None) -> dict:
    """Versions, devices, code revision, seed, determinism settings and the command line."""
    commit = _git("rev-parse", "HEAD")
    program = Path(sys.argv[0])
    program_name = f"python -m {program.parent.name}" if program.name == "__main__.py" else program.name
    return {
        "command": " ".join([program_name, shlex.join(sys.argv[1:])]).strip(),
        "cwd": os.getcwd(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {package: version(package) for package in PACKAGES},
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] or ["cpu"],
        "accelerator": type(trainer.accelerator).__name__ if trainer else None,
        "world_size": trainer.world_size if trainer else 1,
        "precision": trainer.precision if trainer else None,
        "git": {"commit": commit, "dirty": bool(_git("status", "--porcelain")) if commit else None},
        "seed": int(os.environ["PL_GLOBAL_SEED"]) if "PL_GLOBAL_SEED" in os.environ else None,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
    }


def run_directory(trainer: L.Trainer) -> str | None:
    """``trainer.log_dir`` without its broadcast (a collective), for code only rank 0 runs."""
    if not trainer.loggers:
        return trainer.default_root_dir
    logger = trainer.loggers[0]
    return logger.log_dir if isinstance(logger, TensorBoardLogger | CSVLogger) else logger.save_dir  # as Lightning


class RunRecord(SaveConfigCallback):
    """Writes the run's ``config.yaml`` (as LightningCLI's SaveConfigCallback does), ``env.json`` (``env-2.json``...
    on a resume) and, with trackers beside TensorBoard, ``trackers.json`` (``template.tracking``). A resumed run's
    config.yaml is replaced only with its first checkpoint: it records the settings of the run's latest checkpoint
    (a plain ``--ckpt_path last`` resumes with them), never those of a resume that failed; it names no checkpoint
    nor run to log into: given as --config, it trains the run anew."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{**kwargs, "save_to_log_dir": False})  # config.yaml: written here
        self.pending: Path | None = None  # config.yaml, until written
        self.training = self.fitting = False

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Lightning's hook for records: on rank 0 only, once a run.
        if not trainer.loggers or (log_dir := run_directory(trainer)) is None:
            return
        run_dir = Path(log_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.pending, self.fitting = run_dir / self.config_filename, stage == "fit"
        if not self.pending.exists():  # a new run's: at once
            self.write_config()
        path, number = run_dir / "env.json", 1
        while path.exists():  # a resumed run keeps the record of the first
            number += 1
            path = run_dir / f"env-{number}.json"
        write_atomic(path, json.dumps(environment_record(trainer), indent=2) + "\n")
        if trackers := trainer.loggers[1:]:  # MLflow, W&B... beside TensorBoard (template.tracking)
            config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))  # config.yaml's values
            record_trackers(trackers, loggers_of(self.config)[1:], config, run_dir)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.training = True  # a restore asks for a checkpoint's state too, to compare: no checkpoint is saved then

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if self.training and trainer.is_global_zero:
            self.write_config()

    def write_config(self) -> None:
        if self.pending is None:
            return
        # As --config, it runs anew: into a new run and new tracker runs (a version a sweep or cv placed it at, a
        # resume's), and a fit from no checkpoint.
        config, resumed = self.config.clone(), self.config.get("ckpt_path") if self.fitting else None
        if resumed:
            config.ckpt_path = None
        for logger in loggers_of(config):  # TensorBoard's version, MLflow's and W&B's run ids
            init_args = logger.get("init_args") if isinstance(logger, Namespace) else None
            for name in [name for name in RUN_IDS if init_args and name in init_args]:
                init_args[name] = None
        if resumed:  # Lightning's logger writes hparams.yaml only where there is none: this run's, not the first's
            (self.pending.parent / "hparams.yaml").unlink(missing_ok=True)
        with replaced_atomically(self.pending) as temporary:
            self.parser.save(config, temporary, skip_none=False, overwrite=True, multifile=self.multifile)
            if resumed:
                said = f"# resumed from {shown(Path(resumed).resolve(), markup=False)} (fit --ckpt_path it: resumed "
                said += "again); as --config, "
                said += "this file trains the run anew\n"
                temporary.write_text(said + temporary.read_text())
        self.pending = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Remove the run directory of a command that failed before it produced anything (a checkpoint, a step)."""
        if not trainer.is_global_zero or not trainer.loggers or (log_dir := run_directory(trainer)) is None:
            return
        run_dir = Path(log_dir)
        started = {"config.yaml", "hparams.yaml", "checkpoints", TRACKER_RUNS}
        names = [path.name for path in run_dir.iterdir()] if run_dir.is_dir() else []
        if (
            not names
            or any(name not in started and not name.startswith(("env", "events.out.tfevents.")) for name in names)
            or any((run_dir / "checkpoints").glob("*"))
            or (trainer.state.fn == "fit" and trainer.global_step > 0)
        ):
            return
        shutil.rmtree(run_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # runs/<name>, then runs/, if now empty
            run_dir.parent.rmdir()
            run_dir.parent.parent.rmdir()
