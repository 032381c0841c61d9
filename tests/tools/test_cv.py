"""template cv and the folds under it: stratified, seeded, disjoint, covering train + val, test apart."""

import csv
import statistics

import numpy as np
import pytest
import torch
import yaml
from conftest import tiny_args

from template.commands import main
from template.data import DigitsDataModule, ImageFolderDataModule
from template.data.base import ImageDataModule


@pytest.mark.slow
def test_cv_runs_every_fold_and_reports_mean_and_std_over_disjoint_folds_covering_the_training_data(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    quick = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4", "--trainer.enable_progress_bar",
             "false", "--trainer.enable_model_summary", "false", "--trainer.callbacks", "[]"]  # fmt: skip
    main(["cv", "--folds", "3", *quick])
    out = capsys.readouterr().out
    rows = list(csv.reader((tmp_path / "runs" / "digits" / "cv_0" / "cv.csv").open()))
    assert rows[0][:2] == ["fold", "val/acc"] and [row[0] for row in rows[1:]] == ["0", "1", "2", "mean", "std"]
    scores = [float(row[1]) for row in rows[1:4]]
    assert float(rows[4][1]) == pytest.approx(statistics.mean(scores), abs=1e-6)
    assert float(rows[5][1]) == pytest.approx(statistics.stdev(scores), abs=1e-6)
    assert f"{statistics.mean(scores):.4f} +- {statistics.stdev(scores):.4f} (over 3 folds)" in out
    validated = []
    for fold, row in enumerate(rows[1:4]):
        config = yaml.safe_load((tmp_path / row[2] / "config.yaml").read_text())["data"]["init_args"]
        assert (config["folds"], config["fold"]) == (3, fold)  # each fold's run records which it was
        data = DigitsDataModule(**config)
        data.setup("fit")
        validated.append(data.fold_indices["val"])
    pooled = len(np.concatenate([DigitsDataModule().load_split(split)[1] for split in ("train", "val")]))
    every = np.concatenate(validated)
    assert len(every) == len(set(every.tolist())) == pooled  # disjoint, and together all of train + val
    main(["cv", "--folds", "2", *quick])
    assert (tmp_path / "runs" / "digits" / "cv_1" / "cv.csv").is_file()  # a rerun leaves the first alone


def test_a_run_name_linked_out_of_the_runs_directory_is_refused_before_any_fold_is_written(tmp_path, capsys):
    """runs/<name> a link (an unpacked stranger's): cv's folds and cv.csv, at runs/<name>/cv_0, went where it led."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "digits").symlink_to(outside)
    with pytest.raises(SystemExit, match="1"):
        main(["cv", "--folds", "2", *tiny_args(tmp_path / "runs"), "--trainer.max_epochs", "1"])
    assert f"{tmp_path / 'runs' / 'digits'} is a symbolic link (to {outside})" in capsys.readouterr().err
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("given", [["--data.fold", "1"], ["--data.folds", "3"]])
def test_fold_options_cv_would_set_over_are_refused_before_any_fit(tmp_path, capsys, given):
    """`cv --folds 5 --data.fold 2` ran all five folds, the option ignored in silence (cv set its own after it)."""
    with pytest.raises(SystemExit, match="2"):
        main(["cv", "--folds", "5", *tiny_args(tmp_path / "runs"), *given])
    assert f"leave out {given[0]}\n" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_folds_of_no_checkpoint_are_refused_before_any_fit(tmp_path, capsys):
    """With enable_checkpointing false, fold 0 trained whole, then "recorded no val/acc": cv scores best checkpoints."""
    with pytest.raises(SystemExit, match="1"):
        main(["cv", "--folds", "2", *tiny_args(tmp_path / "runs"), "--trainer.enable_checkpointing", "false"])
    assert "sweep and cv compare runs by their best checkpoints" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_folds_are_stratified_seeded_and_leave_the_test_split_alone():
    folds = [DigitsDataModule(folds=4, fold=fold) for fold in range(4)]
    for data in folds:
        data.setup("fit")
    counts = [np.bincount(data.datasets["val"].labels.numpy(), minlength=10) for data in folds]
    assert max(abs(a - b).max() for a in counts for b in counts) <= 1  # every class shared out evenly
    again = DigitsDataModule(folds=4, fold=1)
    again.setup("validate")
    assert torch.equal(again.datasets["val"].images, folds[1].datasets["val"].images)
    other_seed = DigitsDataModule(folds=4, fold=1, split_seed=1)
    other_seed.setup("fit")
    assert not np.array_equal(other_seed.fold_indices["val"], folds[1].fold_indices["val"])
    test = DigitsDataModule(folds=4, fold=1)
    test.setup("test")
    assert torch.equal(
        test.datasets["test"].labels.sort().values, DigitsDataModule().load_split("test")[1].sort().values
    )


def test_streamed_image_folders_cut_folds_of_files(image_folder):
    data = ImageFolderDataModule(str(image_folder), image_size=8, cache=False, folds=3, fold=2, num_workers=0)
    data.setup("fit")
    train, val = data.datasets["train"], data.datasets["val"]
    assert not set(train.files) & set(val.files)
    assert len(train) + len(val) == 3 * 12  # train/ and the val share held out of it, pooled; test/ apart
    images, labels = next(iter(data.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape[1:] == (3, 8, 8)


def test_more_folds_than_a_class_has_images_names_the_class_and_the_most_folds_possible(image_folder):
    data = ImageFolderDataModule(str(image_folder), image_size=8, folds=13, num_workers=0, cache=False)
    with pytest.raises(ValueError, match=r"folds=13: class 'cat' has 12 .* use at most 12 folds"):
        data.setup("fit")


@pytest.mark.parametrize("folds, fold", [(1, 0), (3, 3), (3, -1)])
def test_impossible_folds_are_refused_naming_both_values(folds, fold):
    with pytest.raises(ValueError, match=f"folds={folds}, fold={fold}"):
        DigitsDataModule(folds=folds, fold=fold)


def test_a_source_of_other_datasets_says_k_fold_cannot_pool_it():
    class Listed(ImageDataModule):
        num_classes, in_channels, class_names = 2, 1, ["a", "b"]

        def __init__(self):
            super().__init__(folds=2)
            self.image_size = 4

        def load_split(self, split):
            raise AssertionError("not used")

        def make_dataset(self, split):
            return [torch.zeros(1, 4, 4)] * 4

    with pytest.raises(TypeError, match="k-fold cross-validation pools TensorImageDataset or FileDataset"):
        Listed().setup("fit")
