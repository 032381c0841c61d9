"""Many fits from one command (``template sweep``, ``template cv``): each an ordinary ``template fit``
run, in a run directory of its own, with its config.yaml, env.json and checkpoints."""

import argparse
import contextlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from template.callbacks.run_record import run_directory
from template.cli import cli
from template.runs import DEFAULT_RUNS_DIR, is_tensorboard, loggers_of, run_name_of, runs_dir
from template.summary import kept_checkpoints


@dataclass
class Fit:
    score: float | None  # the monitored validation metric of the best checkpoint
    run_dir: str
    best_checkpoint: str


def at_least(least: int):
    """An argparse type: a whole number, ``least`` or more."""

    def number(text: str) -> int:
        if int(text) < least:
            raise argparse.ArgumentTypeError(f"{text}: at least {least}")
        return int(text)

    return number


def resolved_config(fit_args: list[str]) -> dict:
    """The configuration ``template fit`` would run with these options, nothing built (``--print_config``)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        try:
            cli(["fit", *fit_args, "--print_config"])
        except SystemExit as exit:
            if exit.code not in (0, None):  # a parse error, already said on stderr
                raise
    return yaml.safe_load(printed.getvalue())


def checked_config(fit_args: list[str], extra: list[str], blame: str) -> dict:
    """The configuration of ``fit_args``, checked with the tool's ``extra`` fit options too: a parse error of the
    fit options alone is theirs, one that ``extra`` adds is said by ``blame``."""
    config = resolved_config(fit_args)
    try:
        resolved_config([*fit_args, *extra])
    except SystemExit:
        print(blame, file=sys.stderr)
        raise
    return config


def runs_place(config: dict) -> tuple[Path, str]:
    """The runs folder and run name of the configuration's first logger, TensorBoard, which places the runs."""
    logger = loggers_of(config)[0]
    if not is_tensorboard(logger):
        raise ValueError(
            "sweep and cv place each run under the TensorBoard logger's save_dir; this configuration's first "
            "logger (trainer.logger) is not lightning.pytorch.loggers.TensorBoardLogger: keep it first"
        )
    return Path(runs_dir(config) or DEFAULT_RUNS_DIR).resolve(), run_name_of(config) or "default"


def monitored(config: dict) -> tuple[str, str]:
    """The metric and mode (min / max) the best checkpoint is chosen by: what the fits are compared by."""
    checkpoint = config.get("checkpoint") or {}
    if not checkpoint.get("monitor"):
        raise ValueError("checkpoint.monitor is not set: sweep and cv compare runs by the metric it names (val/acc)")
    if (config.get("trainer") or {}).get("enable_checkpointing") is False or checkpoint.get("save_top_k") == 0:
        raise ValueError(
            "sweep and cv compare runs by their best checkpoints: trainer.enable_checkpointing false (checkpoint."
            "save_top_k 0) keeps none"
        )
    return checkpoint["monitor"], checkpoint.get("mode") or "min"


def fit(fit_args: list[str], run_name: tuple[str, str], callbacks: tuple = ()) -> Fit:
    """Run ``template fit`` with ``fit_args`` in runs/<run_name[0]>/<run_name[1]>."""
    built = cli(["fit", *fit_args], run_name=run_name, callbacks=callbacks)
    trainer = built.trainer
    best = kept_checkpoints(built)[0]
    if best is None or not best.monitor:
        raise ValueError("the run kept no best checkpoint (trainer.enable_checkpointing false?): nothing to compare")
    score = None if best.best_model_score is None else float(best.best_model_score)
    return Fit(score, str(run_directory(trainer)), best.best_model_path)
