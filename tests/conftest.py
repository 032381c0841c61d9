"""Shared fixtures: tiny, fast CLI settings on the CPU."""

from pathlib import Path

import pytest

from template.cli import cli


def tiny_args(runs_dir: Path) -> list[str]:
    """Options that make any subcommand quick on 2 CPU cores and keep its files under ``runs_dir``."""
    return [
        "--trainer.logger.init_args.save_dir",
        str(runs_dir),
        "--trainer.accelerator",
        "cpu",
        "--trainer.callbacks",
        "[]",  # no progress bar in test logs
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
    ]


@pytest.fixture(autouse=True)
def program_name_only(monkeypatch):
    """In-process CLI runs see pytest's own arguments in sys.argv otherwise."""
    monkeypatch.setattr("sys.argv", ["template"])


@pytest.fixture
def run_cli(tmp_path: Path, monkeypatch):
    """Run the CLI in this process, in tmp_path, with runs under tmp_path/runs; returns the CLI object."""
    monkeypatch.chdir(tmp_path)
    runs_dir = tmp_path / "runs"

    def run(*args: str):
        subcommand, *rest = args
        return cli([subcommand, *tiny_args(runs_dir), *rest])

    run.runs_dir = runs_dir
    return run
