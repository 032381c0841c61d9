import csv
import shutil
from pathlib import Path

import pytest
import torch
from conftest import write_image_folder

from template.checkpoints import load_checkpoint
from template.commands import main
from template.data import ImageFolderDataModule
from template.summary import print_summary

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "imagefolder.yaml"


@pytest.mark.slow
def test_fit_with_the_imagefolder_config_keeps_class_names_and_predict_names_files(run_cli, tmp_path):
    # Names a spreadsheet would run as a formula, or that a joined top-k column could not be split at.
    classes = ("cat;tabby", "dog: pug", "=owl")
    image_folder = write_image_folder(tmp_path / "images", classes=classes, splits=("train", "test"))
    # The acceptance command, `fit --config configs/imagefolder.yaml --data.root DIR`, made small.
    data = ["--config", str(CONFIG), "--data.root", str(image_folder), "--data.image_size", "16",
            "--data.batch_size", "8", "--data.num_workers", "0", "--data.cache_dir", str(tmp_path / "cache")]  # fmt: skip
    trained = run_cli("fit", *data, "--trainer.max_epochs", "2")
    best = trained.trainer.checkpoint_callback.best_model_path
    assert Path(best).parent.parent.parent.name == "imagefolder"
    assert load_checkpoint(best)["hyper_parameters"]["class_names"] == sorted(classes)

    # Evaluating needs only where the images are: the checkpoint's DataModule is the default. Options
    # given still override it, its own ones too (the default digits have no image_size).
    where = ["--data.root", str(image_folder)]
    tested = run_cli("test", "--ckpt_path", best, *where, "--data.batch_size", "4", "--data.image_size=16")
    assert isinstance(tested.datamodule, ImageFolderDataModule) and tested.datamodule.root == image_folder
    assert tested.datamodule.batch_size == 4 and tested.datamodule.image_size == (16, 16)
    assert "test/acc" in tested.trainer.callback_metrics
    assert Path(tested.trainer.log_dir).parent == Path(best).parents[2]  # a new version beside the run
    (tmp_path / "evaluate.yaml").write_text(f"ckpt_path: {best}\n")  # the checkpoint named in a config file
    validated = run_cli("validate", "--config", str(tmp_path / "evaluate.yaml"), *where)
    assert isinstance(validated.datamodule, ImageFolderDataModule) and "val/acc" in validated.trainer.callback_metrics

    # The config's own image size (32) is not the one it was trained at (16): an error, not a silent resize, naming
    # the option that made it (the config's `image_size: null` over the recorded 16), not only the shapes.
    with pytest.raises(ValueError) as error:
        run_cli("predict", "--config", str(CONFIG), "--data.root", str(image_folder), "--data.num_workers", "0",
                "--data.predict_path", str(image_folder / "test"), "--ckpt_path", best)  # fmt: skip
    assert "inputs (channels, height, width): trained on [3, 16, 16], the data gives [3, 32, 32]" in str(error.value)
    assert "data.image_size 16 recorded, None given" in str(error.value)
    formula = image_folder / "test" / "=owl" / "=HYPERLINK(1)|x.png"
    shutil.copy(next((image_folder / "test" / "=owl").glob("*.png")), formula)
    run_cli("predict", *data, "--data.predict_path", str(image_folder / "test"), "--ckpt_path", best)
    predictions = next(run_cli.runs_dir.glob("imagefolder/version_*/predictions.csv"))
    rows = list(csv.DictReader(predictions.open()))
    assert len(rows) == 37
    assert {row["sample"] for row in rows} == {str(path) for path in (image_folder / "test").rglob("*.*")}
    safe = {"cat;tabby", "dog: pug", "'=owl"}  # a leading apostrophe: shown as text, never run
    assert {row["class_name"] for row in rows} <= safe
    assert all(
        {row["top2_class"], row["top3_class"]} <= safe and row["class_name"] != row["top2_class"] for row in rows
    )
    assert all(
        float(row["probability"]) >= float(row["top2_probability"]) >= float(row["top3_probability"]) for row in rows
    )
    assert not any(cell.startswith(("=", "+", "-", "@")) for row in csv.reader(predictions.open()) for cell in row)

    # Only the checkpoint and the images: the training folder gone, predict and export still work, with
    # the class names and the normalisation the model was trained with.
    new_images = shutil.copytree(image_folder / "test", tmp_path / "new")
    shutil.rmtree(image_folder / "train")  # test/ alone: evaluated with the trained classes and statistics
    assert "test/acc" in run_cli("test", "--ckpt_path", best, *where).trainer.callback_metrics
    shutil.rmtree(image_folder)
    run_cli("predict", "--ckpt_path", best, "--data.predict_path", str(new_images))
    again = sorted(run_cli.runs_dir.glob("imagefolder/version_*/predictions.csv"))[-1]
    by_name = {Path(row["sample"]).relative_to(image_folder / "test"): row for row in rows}
    for row in csv.DictReader(again.open()):
        before = by_name[Path(row["sample"]).relative_to(new_images)]
        assert row["class_name"] == before["class_name"]
        assert float(row["probability"]) == pytest.approx(float(before["probability"]), abs=1e-5)
    with pytest.raises(SystemExit) as exit_info:  # what needs the training images says so
        main(["test", *run_cli.tiny_args, "--ckpt_path", best])
    assert exit_info.value.code == 1
    main(["export", "--ckpt_path", best, "--format", "torchscript", "--output", str(tmp_path / "model.pt")])
    assert (tmp_path / "model.pt").is_file()


@pytest.mark.slow
def test_a_folder_of_train_and_val_alone_is_tested_on_a_share_held_out_of_train(run_cli, tmp_path, capsys):
    root = write_image_folder(tmp_path / "images", per_class=10, splits=("train", "val"))
    data = ["--config", str(CONFIG), "--data.root", str(root), "--data.image_size", "16", "--data.num_workers", "0",
            "--data.cache_dir", str(tmp_path / "cache")]  # fmt: skip
    fitted = run_cli("fit", *data, "--trainer.max_epochs", "1")  # the config's batch and test_fraction
    best = fitted.trainer.checkpoint_callback.best_model_path
    assert f"test it, once:   template test --ckpt_path {best} --data.root {root}" in capsys.readouterr().out
    tested = run_cli("test", "--ckpt_path", best, "--data.root", str(root))
    assert "test/acc" in tested.trainer.callback_metrics
    test_files = tested.datamodule.split_files["test"]
    assert len(test_files) == 3 and {path.parent.name for path in test_files} == {"cat", "dog", "owl"}
    assert not set(test_files) & set(fitted.datamodule.split_files["train"])

    fitted.datamodule.test_fraction = 0  # no test/ and none held out: no test split to suggest
    print_summary(fitted, Path(fitted.trainer.log_dir))
    summary = capsys.readouterr().out
    assert "best checkpoint" in summary and "test --ckpt_path" not in summary


def test_a_checkpoint_recording_a_data_option_since_removed_still_evaluates(run_cli, tmp_path):
    root = write_image_folder(tmp_path / "images", per_class=8, splits=("train", "val", "test"))
    data = ["--config", str(CONFIG), "--data.root", str(root), "--data.image_size", "12", "--data.num_workers", "0",
            "--data.batch_size", "8", "--data.cache_dir", str(tmp_path / "cache")]  # fmt: skip
    fitted = run_cli("fit", *data, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2")
    # As a run before the template's photo cache recorded it: an option ImageFolderDataModule has lost.
    checkpoint = torch.load(fitted.trainer.checkpoint_callback.best_model_path, weights_only=True)
    checkpoint["datamodule_hyper_parameters"]["cache_max_size"] = 64
    torch.save(checkpoint, tmp_path / "older.ckpt")
    with pytest.warns(UserWarning, match="cache_max_size .* no longer options of ImageFolderDataModule: left out"):
        tested = run_cli("test", "--ckpt_path", str(tmp_path / "older.ckpt"), "--data.root", str(root))
    assert "test/acc" in tested.trainer.callback_metrics


def test_held_out_images_drawn_again_from_a_changed_train_folder_are_not_scored(run_cli, tmp_path):
    """val and test drawn from train/ (no val/ or test/ folders) are drawn again by every command: an image added to
    train/ later reshuffles them, and the test split then holds images the run trained on. The checkpoint records
    which files each drawn split held; scoring other ones is refused, naming them, and resuming on them warns."""
    root = write_image_folder(tmp_path / "images", per_class=12)
    data = ["--data", "template.data.ImageFolderDataModule", "--data.root", str(root), "--data.image_size", "16",
            "--data.num_workers", "0", "--data.test_fraction", "0.2", "--data.cache_dir", str(tmp_path / "cache")]  # fmt: skip
    best = run_cli("fit", *data, "--trainer.max_epochs", "1").trainer.checkpoint_callback.best_model_path
    assert "test/acc" in run_cli("test", "--ckpt_path", best, *data).trainer.callback_metrics  # the same files
    with pytest.raises(Exception, match=r"draw other splits than its run's, .*: data.split_seed 0 in its run, 7 given"):
        run_cli("validate", "--ckpt_path", best, *data, "--data.split_seed", "7")  # another draw, refused at once
    shutil.copy(root / "train" / "cat" / "000.png", root / "train" / "cat" / "100.png")  # one more, added later
    with pytest.raises(Exception, match=r"the (val and )?test images drawn from .* are not the ones the checkpoint"):
        run_cli("test", "--ckpt_path", best, *data)
    with pytest.warns(UserWarning, match="are not the ones the checkpoint's run held out"):
        run_cli("fit", "--ckpt_path", best, *data, "--trainer.max_epochs", "2")
