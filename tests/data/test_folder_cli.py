import csv

import pytest

from template.checkpoints import load_checkpoint


@pytest.mark.slow
def test_fit_on_a_folder_keeps_class_names_in_the_checkpoint_and_predict_names_files(run_cli, image_folder, tmp_path):
    data = ["--data", "template.data.ImageFolderDataModule", "--data.init_args.root", str(image_folder),
            "--data.init_args.image_size", "16", "--data.init_args.batch_size", "8",
            "--data.init_args.num_workers", "0", "--data.init_args.cache_dir", str(tmp_path / "cache")]  # fmt: skip
    trained = run_cli("fit", *data, "--trainer.max_epochs", "2")
    best = trained.trainer.checkpoint_callback.best_model_path
    assert load_checkpoint(best)["hyper_parameters"]["class_names"] == ["cat", "dog", "owl"]

    run_cli("predict", *data, "--data.init_args.predict_path", str(image_folder / "test"), "--ckpt_path", best)
    predictions = next(run_cli.runs_dir.glob("digits/version_*/predictions.csv"))
    rows = list(csv.DictReader(predictions.open()))
    assert len(rows) == 36
    assert {row["sample"] for row in rows} == {str(path) for path in (image_folder / "test").rglob("*.*")}
    assert {row["class_name"] for row in rows} <= {"cat", "dog", "owl"}
