import json
import subprocess
from pathlib import Path

import yaml

from template.callbacks.run_record import environment_record


def test_record_names_versions_devices_code_revision_and_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    git = ["git", "-c", "user.name=T", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q"], check=True)
    (tmp_path / "a.txt").write_text("a")
    subprocess.run(["git", "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr("sys.argv", ["/somewhere/template/__main__.py", "fit", "--trainer.max_epochs", "2"])
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")

    record = environment_record()
    assert record["git"] == {"commit": commit, "dirty": False}
    assert record["command"] == "python -m template fit --trainer.max_epochs 2"
    assert record["seed"] == 7
    assert {"torch", "torchvision", "lightning", "torchmetrics"} <= record["packages"].keys()
    assert record["devices"] and "cudnn_benchmark" in record and "deterministic_algorithms" in record
    json.dumps(record)  # plain JSON

    (tmp_path / "a.txt").write_text("changed")
    assert environment_record()["git"]["dirty"] is True


def test_a_resumed_runs_records_agree_on_the_settings_it_resumed_with(run_cli):
    quick = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    run_cli("fit", "--trainer.max_epochs", "1", *quick)
    resumed = run_cli(
        "fit", "--trainer.max_epochs", "2", *quick, "--model.label_smoothing", "0.0", "--ckpt_path", "last"
    )
    run_dir = Path(resumed.trainer.log_dir)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    hparams = yaml.load((run_dir / "hparams.yaml").read_text(), Loader=yaml.FullLoader)  # Lightning's: tuples
    assert config["model"]["init_args"]["label_smoothing"] == hparams["label_smoothing"] == 0.0  # was 0.1
