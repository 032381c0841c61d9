"""``template lr-find [fit options]``: Lightning's learning-rate range test on the configured run.

It saves the loss-vs-LR curve (``lr_find.png``, ``lr_find.csv``) in a run directory and prints the LR where the
smoothed loss falls fastest. Read the curve too: a warm-up + cosine schedule's peak LR often sits several times above.
"""

import argparse
import csv
from pathlib import Path

import numpy as np
from lightning.pytorch.tuner import Tuner
from rich.console import Console

from template.cli import PROGRAM, cli
from template.files import replaced_atomically


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{PROGRAM} lr-find",
        description="Learning-rate range test; every other option is a `fit` option (see `fit --help`).",
    )
    parser.add_argument("--min_lr", type=float, default=1e-6, help="learning rate of the first step")
    parser.add_argument("--max_lr", type=float, default=1.0, help="learning rate of the last step")
    parser.add_argument("--num_training", type=int, default=100, help="steps of the test")
    return parser


def steepest(lrs: list[float], losses: list[float], skip_begin: int = 10, skip_end: int = 1) -> float | None:
    """The LR where the smoothed loss falls fastest per decade of LR, as the curve is read on its log axis. Lightning's
    suggestion differentiates by the LR itself, which magnifies each small wobble at the lowest rates (by 1 / lr):
    it suggested 6.3e-05 on the digits, where the loss still rose, for a descent steepest at 3.5e-03."""
    end = len(lrs) - skip_end
    lrs, losses = np.asarray(lrs[skip_begin:end], float), np.asarray(losses[skip_begin:end], float)
    kept = np.isfinite(losses) & (lrs > 0)
    if kept.sum() < 3:
        return None
    slopes = np.gradient(losses[kept], np.log(lrs[kept]))
    return float(lrs[kept][np.argmin(slopes)]) if slopes.min() < 0 else None  # a loss that never falls: none


def main(args: list[str]) -> None:
    parser = build_parser()
    options, fit_args = parser.parse_known_args(args)
    if not 0 < options.min_lr < options.max_lr:
        parser.error(f"need 0 < min_lr < max_lr, got {options.min_lr} and {options.max_lr}")
    built = cli(fit_args, run=False, command="lr-find")
    # The options are named as lr_find's. No update_attr: the LR lives in the optimizer's config, set knowingly.
    finder = Tuner(built.trainer).lr_find(built.model, datamodule=built.datamodule, update_attr=False, **vars(options))
    if not built.trainer.is_global_zero:
        return
    run_dir = Path(built.trainer.log_dir or ".")
    run_dir.mkdir(parents=True, exist_ok=True)
    with replaced_atomically(run_dir / "lr_find.csv") as temporary, temporary.open("w", newline="") as file:
        csv.writer(file).writerows([("lr", "loss"), *zip(finder.results["lr"], finder.results["loss"])])
    suggestion = steepest(finder.results["lr"], finder.results["loss"])
    figure = finder.plot(suggest=False)
    if suggestion is not None:
        figure.axes[0].axvline(suggestion, color="red", linestyle="--", label=f"steepest descent: {suggestion:.3g}")
        figure.axes[0].legend()
    with replaced_atomically(run_dir / "lr_find.png") as temporary:
        figure.savefig(temporary, dpi=120, format="png")  # the temporary's name says no format
    console = Console(soft_wrap=True)
    console.print(f"loss-vs-LR curve: {run_dir / 'lr_find.png'} (values in lr_find.csv)", highlight=False)
    if suggestion is None:
        console.print("no suggestion: the loss never fell steadily; read the curve, or widen min_lr / max_lr")
        raise SystemExit(1)
    console.print(f"suggested lr: {suggestion:.3g}  (set it with --model.optimizer.init_args.lr {suggestion:.3g})")
