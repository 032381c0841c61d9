import json
import subprocess

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
