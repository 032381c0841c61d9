"""Shared fixtures: tiny, fast CLI settings on the CPU."""

from pathlib import Path

import pytest
import torch

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
    run.tiny_args = tiny_args(runs_dir)  # for commands run through main()
    return run


def write_image_folder(root: Path, classes=("cat", "dog", "owl"), per_class=12, splits=("train",), size=(20, 24)):
    """Small real image files (PNG and JPEG, alternately), each class a distinct colour plus noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    colours = [(200, 40, 40), (40, 200, 40), (40, 40, 200), (200, 200, 40)]
    for split in splits:
        for index, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for number in range(per_class):
                pixels = np.array(colours[index % 4])[None, None] + rng.normal(0, 30, (*size, 3))
                image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
                image.save(folder / f"{number:03d}.{'jpg' if number % 2 else 'png'}")
    return root


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return write_image_folder(tmp_path / "images", splits=("train", "test"))


class FakeTrainer:
    """What a DataModule's batch hook reads of its Trainer: whether it is training."""

    def __init__(self, training: bool) -> None:
        self.training = training


def on_device(data, batch: tuple, training: bool, seed: int = 0):
    """``batch`` as the model gets it: through the DataModule's hook, in training or not."""
    data.trainer = FakeTrainer(training)
    torch.manual_seed(seed)
    return data.on_after_batch_transfer(batch, 0)[0]
