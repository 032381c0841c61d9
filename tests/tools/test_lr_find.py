import csv
import re
from pathlib import Path

import numpy as np
import pytest

from template.commands import main
from template.tools.lr_find import steepest


def test_the_suggestion_is_the_steepest_descent_per_decade_not_a_wobble_at_the_lowest_rates():
    lrs = np.logspace(-6, 0, 100)
    wobble = 0.003 * np.sin(np.arange(100)) * (lrs < 1e-4)  # noise where the loss has not started to fall
    losses = 2.5 - 1 / (1 + np.exp(-3 * (np.log10(lrs) + 2.5))) + wobble  # falls fastest at 10 ** -2.5
    assert 2e-3 < steepest(list(lrs), list(losses)) < 5e-3
    assert steepest(list(lrs), list(np.linspace(1, 3, 100))) is None  # a loss that only rises: no rate to suggest
    assert 2e-3 < steepest(list(lrs), list(losses), skip_end=0) < 5e-3


def test_lr_find_prints_and_draws_the_steepest_descent_of_its_curve(run_cli, capsys):
    main(["lr-find", *run_cli.tiny_args, "--num_training", "60"])
    suggested = float(re.search(r"suggested lr: (\S+)", capsys.readouterr().out)[1])
    (curve,) = run_cli.runs_dir.glob("*/*/lr_find.csv")
    rows = list(csv.DictReader(curve.open()))
    best = steepest([float(row["lr"]) for row in rows], [float(row["loss"]) for row in rows])
    assert suggested == float(f"{best:.3g}") and 3e-4 < suggested < 0.3  # not Lightning's 6e-05 on the digits
    assert (curve.parent / "lr_find.png").stat().st_size > 10_000


def test_an_error_while_rates_are_tried_is_said_and_leaves_no_temporary_checkpoint(run_cli, capsys, monkeypatch):
    """The tuner's restore of its own checkpoint, after the error, was refused as a resume lacking the run's callbacks
    (Lightning swaps them for its own while it tries rates): that refusal replaced the error, the file stayed."""
    from template.module import ClassificationModule

    step = ClassificationModule.training_step

    def failing(self, batch, batch_idx):
        if batch_idx == 3:
            raise RuntimeError("out of memory (simulated)")
        return step(self, batch, batch_idx)

    monkeypatch.setattr(ClassificationModule, "training_step", failing)
    with pytest.raises(SystemExit, match="1"):
        main(["lr-find", *run_cli.tiny_args, "--num_training", "20"])
    assert "error: out of memory (simulated)" in capsys.readouterr().err
    assert not list(Path.cwd().glob(".lr_find_*.ckpt"))
