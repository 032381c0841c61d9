"""The README is the front door: its commands must stay true."""

import inspect
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_args, write_image_folder
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from template.cli import PROGRAM, cli
from template.commands import main
from template.data import ImageDataModule
from template.tools.cv import build_parser as cv_parser
from template.tools.export import build_parser
from template.tools.lr_find import build_parser as lr_find_parser
from template.tools.sweep import build_parser as sweep_parser

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_readme_starts_with_exactly_the_two_setup_commands():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    assert first_block.split("\n")[:-1] == ["make fit", "make test"]


COMMANDS = [
    line.split("#")[0].strip()
    for block in re.findall(r"```bash\n(.*?)```", README, re.S)
    for line in block.splitlines()
    if line.startswith(f"{PROGRAM} ")
]


def test_readme_shows_cli_commands():
    assert len(COMMANDS) >= 8


SWEEP_OUTPUT = "best.yaml"  # a file the sweep writes: its command runs after the sweep's, below


@pytest.fixture(scope="module")
def a_run(tmp_path_factory) -> dict[str, Path]:
    """Folders like a clone's after a short `template fit`: configs/, and runs/ with a checkpoint; of the
    digits, and of an image folder (for the commands that name one)."""
    quick = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    folders = {}
    for kind in ("digits", "images"):
        folders[kind] = folder = tmp_path_factory.mktemp(kind)
        (folder / "configs").symlink_to(REPO / "configs")
        images = write_image_folder(folder / "images", per_class=10) if kind == "images" else None
        data = ["--config", str(REPO / "configs" / "imagefolder.yaml"), "--data.root", str(images)] if images else []
        cli(["fit", *tiny_args(folder / "runs"), *quick, *data, "--data.num_workers", "0"])
    return folders


@pytest.mark.parametrize("command", [command for command in COMMANDS if SWEEP_OUTPUT not in command])
def test_readme_command_parses(command, monkeypatch, a_run):
    # --print_config parses every option and config file (a checkpoint's record too), then exits before any work.
    monkeypatch.chdir(a_run["images" if "--data." in command and "--ckpt_path" in command else "digits"])
    args = shlex.split(command)[1:]
    if args[0] == "export":  # its own parser: check the options without exporting anything
        build_parser().parse_args(args[1:])
        return
    if args[0] in ("sweep", "cv"):  # their own options, then fit's
        parser = sweep_parser() if args[0] == "sweep" else cv_parser()
        args = ["fit", *parser.parse_known_args(args[1:])[1]]
    elif args[0] in ("doctor", "lr-find"):  # fit's options without a subcommand, plus lr-find's own
        fit_args = lr_find_parser().parse_known_args(args[1:])[1]
        with pytest.raises(SystemExit) as exit_info:
            cli([*fit_args, "--print_config"], run=False)
        assert exit_info.value.code in (0, None)
        return
    with pytest.raises(SystemExit) as exit_info:
        cli([*args, "--print_config"])
    assert exit_info.value.code in (0, None)


@pytest.mark.slow
def test_the_sweep_and_cross_validate_commands_run_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    quick = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
             "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]  # fmt: skip
    sweep = next(shlex.split(command)[1:] for command in COMMANDS if command.split()[1] == "sweep")
    refit = next(shlex.split(command)[1:] for command in COMMANDS if SWEEP_OUTPUT in command)
    main([*sweep, *quick, "--n_trials", "2"])
    assert len(list((tmp_path / "runs" / "optimizer").glob("trial_*/config.yaml"))) == 2
    assert "test it, once" not in capsys.readouterr().out  # no trial's test split: the chosen one's, once
    main([*refit, *quick])
    assert len(list((tmp_path / "runs" / "optimizer").glob("version_0/checkpoints/best*"))) == 1
    cv = next(shlex.split(command)[1:] for command in COMMANDS if command.split()[1] == "cv")
    main([*cv, *quick, "--folds", "2"])
    assert "(over 2 folds)" in capsys.readouterr().out
    assert (tmp_path / "runs" / "digits" / "cv_0" / "cv.csv").is_file()


def section(title: str) -> str:
    """The README's text under a heading, up to the next heading."""
    return re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^##)", README, re.S | re.M).group(1)


@pytest.mark.slow
def test_the_swap_the_data_example_trains_as_written(run_cli, tmp_path, monkeypatch):
    text = section("Swap the data")
    assert "augmentation is off (`crop_padding=0`, `hflip=False`)" in text
    base = inspect.signature(ImageDataModule).parameters
    assert base["crop_padding"].default == 0 and base["hflip"].default is False
    (tmp_path / "my_data.py").write_text(re.search(r"```python\n(.*?)```", text, re.S).group(1))
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` puts the current folder first
    monkeypatch.delitem(sys.modules, "my_data", raising=False)
    args = shlex.split(re.search(r"^python -m template (fit .*)$", text, re.M).group(1))
    labels = np.arange(60) % 3  # three classes of 12x10 RGB images, told apart by brightness
    images = np.random.default_rng(0).integers(0, 60, (60, 12, 10, 3)) + 80 * labels[:, None, None, None]
    np.savez(tmp_path / args[args.index("--data.path") + 1], images=images.astype(np.uint8), labels=labels)

    fitted = run_cli(*args, "--data.batch_size", "16", "--trainer.max_epochs", "2")
    data = fitted.datamodule
    assert type(data).__module__ == "my_data" and data.input_shape == (3, 12, 10)
    assert fitted.model.hparams.input_shape == (3, 12, 10) and fitted.model.hparams.num_classes == 3
    assert fitted.trainer.global_step == 2 * 3  # 48 training images in batches of 16
    for split in ("train", "val", "test", "predict"):
        images, labels = data.load_split(split)
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 12, 10) and len(images) == len(labels)
    # The base's options came through **kwargs: the folds of `template cv` too.
    folded = type(data)(data.hparams.path, folds=3, fold=1)
    folded.setup("fit")
    assert len(folded.datasets["train"]) + len(folded.datasets["val"]) == 54 and len(folded.datasets["val"]) == 18
    sys.modules.pop("my_data", None)


def importable_module_from_readme(tmp_path: Path, monkeypatch, edit=lambda code: code) -> None:
    """The README's "Subclass the module" code, edited, as tmp_path/my_module.py, importable afresh."""
    code = re.search(r"```python\n(.*?)```", section("Subclass the module"), re.S).group(1)
    (tmp_path / "my_module.py").write_text(edit(code))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_module", raising=False)


@pytest.mark.slow
def test_the_module_subclass_example_trains_and_evaluates_as_written(run_cli, tmp_path, monkeypatch):
    text = section("Subclass the module")
    importable_module_from_readme(tmp_path, monkeypatch)
    args = shlex.split(re.search(r"^python -m template (fit .*)$", text, re.M).group(1))
    quick = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2"]
    fitted = run_cli(*args, *quick, "--model.label_smoothing", "0.2")
    assert type(fitted.model).__name__ == "F1Module" and fitted.model.label_smoothing == 0.2
    assert {f"val/f1_{digit}" for digit in range(10)} | {"val/acc", "val/loss"} <= set(fitted.trainer.callback_metrics)
    again = shlex.split(re.search(r"`python -m template (validate [^`]*)`", text).group(1))  # named again
    evaluated = run_cli(*again, "--trainer.limit_val_batches", "2")
    assert type(evaluated.model).__name__ == "F1Module"
    assert {"val/f1_3", "val/acc"} <= set(evaluated.trainer.callback_metrics)
    sys.modules.pop("my_module", None)


def test_a_subclass_that_forgets_super_in_an_epoch_end_hook_is_told_to_call_it(run_cli, tmp_path, capsys, monkeypatch):
    def forget_super(code: str) -> str:
        assert "        super().on_validation_epoch_end()" in code
        return code.replace("        super().on_validation_epoch_end()", "        pass")

    importable_module_from_readme(tmp_path, monkeypatch, forget_super)
    with pytest.raises(SystemExit):
        main(["fit", *run_cli.tiny_args, "--model", "my_module.F1Module", "--trainer.max_epochs", "1",
              "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2"])  # fmt: skip
    error = capsys.readouterr().err
    assert "watches val/acc" in error and "overrides on_validation_epoch_end" in error and "calls super()" in error
    sys.modules.pop("my_module", None)


def readme_tags() -> set[str]:
    """The TensorBoard tags the README names: the run directory's list, and every `train/...`-like name."""
    listing = re.search(r"TensorBoard curves: (.*?)\n\s*hparams\.yaml", README, re.S).group(1)
    listed = {name.strip() for name in re.sub(r"\(.*?\)", "", listing).split(",")}
    return listed | set(re.findall(r"`((?:train|val|test|lr)/\w+)`", README))


# Named in the README, but written only in some runs, where their own tests read them back.
SOMETIMES = {"train/skipped_steps"}  # a step the NaN guard skipped: tests/callbacks/test_nonfinite.py


@pytest.mark.slow
def test_every_tensorboard_tag_the_readme_names_is_in_a_runs_event_file(run_cli):
    run = run_cli("fit", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
                  "--trainer.limit_val_batches", "1", "--trainer.log_every_n_steps", "1")  # fmt: skip
    events = EventAccumulator(run.trainer.log_dir)
    events.Reload()
    written = set(events.Tags()["scalars"]) | set(events.Tags()["images"])
    named = readme_tags() - SOMETIMES
    assert {"train/loss", "lr/decay", "val/confusion_matrix"} <= named
    assert named <= written, f"named in the README, not in the event file: {sorted(named - written)}"
