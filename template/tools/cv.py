"""``template cv --folds K [fit options]``: k-fold cross-validation, one ``template fit`` run a fold.

Train and val images are pooled into K stratified, seeded folds (``data.folds``, ``data.fold`` of any
ImageDataModule; test stays out); fold i validates a run trained on the others, in runs/<name>/cv_N/fold_i.
The monitored metric's mean and std over the folds are printed and, with each fold's, written to cv.csv there.
"""

import argparse
import csv
import io
import itertools
import re
import statistics

from rich.console import Console

from template.cli import PROGRAM
from template.files import write_atomic
from template.tools import fits


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{PROGRAM} cv",
        usage=f"{PROGRAM} cv --folds K [fit options]",
        description="k-fold cross-validation; every other option is a fit option (--config ...).",
    )
    parser.add_argument("--folds", type=fits.at_least(2), required=True, help="number of folds, at least 2")
    return parser


def main(args: list[str]) -> None:
    parser = build_parser()
    options, fit_args = parser.parse_known_args(args)
    blame = f"{parser.prog}: error: the DataModule takes no folds: pass **kwargs on to ImageDataModule (README, Swap the data)"
    config = fits.checked_config(fit_args, [f"--data.init_args.folds={options.folds}"], blame)
    # Given on its command line, they would be set over in silence; a --config's (a fold run's record) are cv's to set.
    if given := [token.split("=")[0] for token in fit_args if re.match(r"--data\.(init_args\.)?folds?(=|$)", token)]:
        parser.error(f"cv sets data.folds (from --folds) and data.fold for each of its fits: leave out {given[0]}")
    runs_dir, name = fits.runs_place(config)
    monitor, _ = fits.monitored(config)
    # runs/<name>/cv_N for the first N not taken: a rerun never mixes its folds with an earlier one's.
    cv_dir = next(runs_dir / name / f"cv_{n}" for n in itertools.count() if not (runs_dir / name / f"cv_{n}").exists())
    folds = []
    for fold in range(options.folds):
        fold_args = [*fit_args, f"--data.init_args.folds={options.folds}", f"--data.init_args.fold={fold}"]
        result = fits.fit(fold_args, (f"{name}/{cv_dir.name}", f"fold_{fold}"))
        if result.score is None:
            raise ValueError(f"fold {fold} recorded no {monitor}: does validation run (limit_val_batches)?")
        folds.append(result)
    scores = [result.score for result in folds]
    mean, std = statistics.mean(scores), statistics.stdev(scores)  # the sample standard deviation
    text = io.StringIO()
    rows = [["fold", monitor, "run_dir", "best_checkpoint"]]
    rows += [[fold, f"{r.score:.6f}", r.run_dir, r.best_checkpoint] for fold, r in enumerate(folds)]
    rows += [["mean", f"{mean:.6f}", "", ""], ["std", f"{std:.6f}", "", ""]]
    csv.writer(text).writerows(rows)
    write_atomic(cv_dir / "cv.csv", text.getvalue())
    console = Console(soft_wrap=True, highlight=False)
    console.rule(f"{options.folds}-fold cross-validation")
    for fold, score in enumerate(scores):
        console.print(f"fold {fold}           {monitor} {score:.4f}")
    console.print(f"mean +- std      {monitor} {mean:.4f} +- {std:.4f} (over {options.folds} folds)")
    console.print(f"per fold         {cv_dir / 'cv.csv'}")
