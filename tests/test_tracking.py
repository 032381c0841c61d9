"""Trackers beside TensorBoard: a real MLflow server and a W&B offline run get the run's configuration
and metrics, and a resumed fit logs on into the same tracker run."""

import json
import os
import shlex
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import warnings
from pathlib import Path

import pytest
import yaml
from conftest import tiny_args
from jsonargparse import Namespace

from template.checkpoints import DamagedCheckpointError
from template.cli import PROGRAM
from template.tracking import (
    TOKEN_TAG,
    TRACKER_RUNS,
    continue_tracker_runs,
    flattened,
    resolve_trackers,
    tracker_runs,
    where_to_look,
)

REPO = Path(__file__).resolve().parents[1]
TENSORBOARD = "lightning.pytorch.loggers.TensorBoardLogger"
MLFLOW = "lightning.pytorch.loggers.MLFlowLogger"
WANDB = "lightning.pytorch.loggers.WandbLogger"
QUICK = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]


def offline_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment in which nothing is written outside tmp_path and nothing reaches the network."""
    home = tmp_path / "home"
    return {
        **os.environ,
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(tmp_path / "wandb-elsewhere"),  # only if a run ignored its save_dir
        "WANDB_CONFIG_DIR": str(home / ".config" / "wandb"),
        "WANDB_CACHE_DIR": str(home / ".cache" / "wandb"),
        "WANDB_DATA_DIR": str(home / ".local" / "wandb"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "PYTHONPATH": str(REPO),
        **extra,
    }


def fit(tmp_path: Path, env: dict, *args: str, subcommand: str = "fit") -> None:
    """``template fit`` (or another subcommand) in a process of its own, in tmp_path: trackers keep
    process-wide state (W&B's current run, MLflow's tracking URI)."""
    command = [sys.executable, "-m", PROGRAM, subcommand, *tiny_args(tmp_path / "runs"), *args]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


def test_the_configuration_is_flattened_to_the_names_of_its_options():
    config = {"model": {"init_args": {"optimizer": {"init_args": {"lr": 0.1}}}}, "trainer": {"callbacks": [{"a": 1}]}}
    assert flattened({**config, "data": {"mean": [0.5]}}) == {
        "model.init_args.optimizer.init_args.lr": 0.1,
        "trainer.callbacks.0.a": 1,
        "data.mean": [0.5],
    }


ENV_URI = "http://127.0.0.1:5999"


def test_a_tracker_logs_to_mlflow_tracking_uri_when_set_else_beside_the_run_directories(tmp_path, monkeypatch):
    def resolved(**init_args) -> Namespace:
        trackers = [Namespace(class_path=MLFLOW, init_args=Namespace(**init_args)),
                    Namespace(class_path=WANDB, init_args=Namespace(save_dir=None, dir=None, project=None))]  # fmt: skip
        resolve_trackers(trackers, str(tmp_path / "runs"), "digits")
        return trackers

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow, wandb = resolved(tracking_uri=None, experiment_name=None)
    assert mlflow.init_args.tracking_uri == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    assert mlflow.init_args.experiment_name == "digits" and wandb.init_args.project == "digits"
    assert wandb.init_args.save_dir == str(tmp_path / "runs")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", ENV_URI)
    assert resolved(tracking_uri=None)[0].init_args.tracking_uri == ENV_URI
    assert resolved(tracking_uri="http://elsewhere:80")[0].init_args.tracking_uri == "http://elsewhere:80"
    with pytest.warns(UserWarning, match="MLflow run 0a1b goes on in http://elsewhere:80, where the run began"):
        assert resolved(tracking_uri="http://elsewhere:80", run_id="0a1b")[0].init_args.tracking_uri != ENV_URI
    # A resume given the tracker's --config again: the one that continues the recorded run, alone.
    recorded = Namespace(class_path=MLFLOW, init_args=Namespace(tracking_uri=None, run_id="0a1b"))
    again = Namespace(class_path=MLFLOW, init_args=Namespace(tracking_uri=None, run_id=None))
    assert resolve_trackers([recorded, again], str(tmp_path / "runs"), "digits") == [recorded]


def test_a_sqlite_mlflow_store_with_sql_mlflow_does_not_make_is_refused(tmp_path):
    """A runs/mlflow.db from elsewhere whose trigger rewrote each val/acc logged to 0.999: the run's summary said
    0.2, MLflow 0.999, unsaid. The triggers and views MLflow makes pass."""
    import sqlite3

    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    (tmp_path / "runs").mkdir()
    MlflowClient(uri).search_experiments()  # the store, made by MLflow
    tracker = Namespace(class_path=MLFLOW, init_args=Namespace(tracking_uri=None, experiment_name=None))
    resolve_trackers([tracker], str(tmp_path / "runs"), "digits")  # MLflow's own schema
    with sqlite3.connect(tmp_path / "runs" / "mlflow.db") as database:
        database.execute(
            "CREATE TRIGGER fake AFTER INSERT ON metrics BEGIN UPDATE metrics SET value = 0.999 WHERE key = NEW.key; END"
        )
    tracker.init_args.tracking_uri = None
    with pytest.raises(ValueError, match=r"refusing the MLflow store .*mlflow.db: it holds trigger 'fake' \(CREATE"):
        resolve_trackers([tracker], str(tmp_path / "runs"), "digits")


def test_a_resume_continues_the_tracker_runs_its_run_directory_recorded_and_nothing_else(tmp_path):
    run_dir = tmp_path / "runs" / "digits" / "version_0"
    run_dir.mkdir(parents=True)
    record = {"template.tracking.MLFlowLogger": {"run_id": "0123abcd"},
              "lightning.pytorch.loggers.wandb.WandbLogger": {"id": "j4wx0qr8"}}  # fmt: skip
    (run_dir / TRACKER_RUNS).write_text(json.dumps(record))
    wandb = Namespace(class_path=WANDB, init_args=Namespace(project="digits", id=None))
    own = Namespace(class_path=WANDB, init_args=Namespace(project="digits", id="mine"))  # given: it stays
    continue_tracker_runs([wandb], run_dir, tmp_path / "runs")  # MLflow's: the next test's, against a store
    assert wandb.init_args.id == "j4wx0qr8"
    continue_tracker_runs([own], run_dir, tmp_path / "runs")
    assert own.init_args.id == "mine"

    deep = "[" * 200_000 + "]" * 200_000  # deeper than Python's parser follows
    padded = json.dumps(record) + " " * (2 << 20)  # a right record, but past any cap: it would be read whole
    for damaged in ("{", '{"x": {"run_id": "../../etc"}}', '{"x": {"command": "abc"}}', "[1]", deep, padded):
        (run_dir / TRACKER_RUNS).write_text(damaged)
        with pytest.raises(DamagedCheckpointError, match=TRACKER_RUNS):
            tracker_runs(run_dir)


def test_a_resume_logs_on_only_into_the_mlflow_run_that_holds_its_run_directorys_token(tmp_path):
    """A run directory from elsewhere whose trackers.json names another run of a shared store (a colleague's): the
    resume starts a run of its own, and never writes into that one."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'shared.db'}"
    client = MlflowClient(uri)
    colleagues = client.create_run(client.create_experiment("production")).info.run_id
    ours = client.create_run(client.create_experiment("digits"), tags={TOKEN_TAG: "a1" * 16}).info.run_id
    run_dir = tmp_path / "runs" / "digits" / "version_0"
    run_dir.mkdir(parents=True)
    cases = [(colleagues, "a1" * 16, False), (ours, "b2" * 16, False), (ours, None, False), (ours, "a1" * 16, True)]
    cases += [(colleagues, None, True), ("0123abcd", None, False)]  # a record and run of before tokens; no such run
    for run_id, token, continued in cases:
        entry = {"run_id": run_id, **({"token": token} if token else {})}
        (run_dir / TRACKER_RUNS).write_text(json.dumps({"template.tracking.MLFlowLogger": entry}))
        mlflow = Namespace(
            class_path="template.tracking.MLFlowLogger", init_args=Namespace(tracking_uri=uri, run_id=None)
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            continue_tracker_runs([mlflow], run_dir, tmp_path / "runs")
        assert (mlflow.init_args.run_id == run_id) is continued
        said = ("does not hold this run directory's token", "cannot be read in")
        assert any(why in str(w.message) for w in caught for why in said) is not continued, (run_id, token)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` on a free loopback port, its runs in SQLite and its artifacts in tmp_path."""
    port = free_port()
    log = (tmp_path / "mlflow-server.log").open("w")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "server-artifacts")],
        env=offline_env(tmp_path), stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "mlflow-server.log").read_text()[-4000:]
            try:
                if rest(url, "/health", raw=True) == b"OK":
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow server did not answer within 120 s"
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def rest(url: str, path: str, raw: bool = False, post: dict | None = None, **query: str):
    """GET (or POST ``post`` to) ``path`` of the server's REST API: plain HTTP, no proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(
        f"{url}{path}?{urllib.parse.urlencode(query)}",
        data=None if post is None else json.dumps(post).encode(),
        headers={"Content-Type": "application/json"},
    )
    with opener.open(request, timeout=10) as response:
        body = response.read()
    return body if raw else json.loads(body)


@pytest.mark.slow
def test_mlflow_server_gets_the_config_and_val_acc_and_a_resume_logs_on_into_the_same_run(mlflow_server, tmp_path):
    env = offline_env(tmp_path, MLFLOW_TRACKING_URI=mlflow_server)
    config = str(REPO / "configs" / "logger" / "mlflow.yaml")
    fit(tmp_path, env, "--config", config, "--trainer.max_epochs", "1", *QUICK)
    run_dir = tmp_path / "runs" / "digits" / "version_0"
    recorded = json.loads((run_dir / TRACKER_RUNS).read_text())["template.tracking.MLFlowLogger"]
    run_id = recorded["run_id"]
    run = rest(mlflow_server, "/api/2.0/mlflow/runs/get", run_id=run_id)["run"]
    assert {tag["key"]: tag["value"] for tag in run["data"]["tags"]}[TOKEN_TAG] == recorded["token"]  # shared
    params = {param["key"]: param["value"] for param in run["data"]["params"]}
    assert params["model.init_args.optimizer.init_args.lr"] == "0.003" and params["trainer.max_epochs"] == "1"
    assert params["trainer.logger.1.init_args.tracking_uri"] == mlflow_server  # where it went, recorded
    assert 0.0 <= {m["key"]: m["value"] for m in run["data"]["metrics"]}["val/acc"] <= 1.0
    history = rest(mlflow_server, "/api/2.0/mlflow/metrics/get-history", run_id=run_id, metric_key="val/acc")
    assert len(history["metrics"]) == 1
    assert not any(tmp_path.glob("**/mlflow.db")) and not (tmp_path / "mlruns").exists()  # the server's alone

    # Another machine's loader workers: a hyper-parameter Lightning logs again, which MLflow cannot change.
    last = str(run_dir / "checkpoints" / "last.ckpt")
    again = ["--config", config, "--ckpt_path", last]  # the tracker is the user's to name again: never the run's
    fit(tmp_path, env, *again, "--trainer.max_epochs", "2", "--data.num_workers", "1", *QUICK)
    assert json.loads((run_dir / TRACKER_RUNS).read_text())["template.tracking.MLFlowLogger"] == recorded
    history = rest(mlflow_server, "/api/2.0/mlflow/metrics/get-history", run_id=run_id, metric_key="val/acc")
    steps = sorted(metric["step"] for metric in history["metrics"])
    assert len(steps) == 2 and steps[0] < steps[1]  # epoch 0's, then the resumed epoch 1's
    experiment = rest(mlflow_server, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="digits")
    experiment_id = experiment["experiment"]["experiment_id"]
    runs = rest(mlflow_server, "/api/2.0/mlflow/runs/search", post={"experiment_ids": [experiment_id]})
    assert [each["info"]["run_id"] for each in runs.get("runs", [])] == [run_id]  # no second run

    # Evaluating the checkpoint: a new MLflow run, as a new run directory; the training run's curves stay as they were.
    fit(tmp_path, env, *again, "--trainer.limit_test_batches", "1", subcommand="test")
    runs = rest(mlflow_server, "/api/2.0/mlflow/runs/search", post={"experiment_ids": [experiment_id]})["runs"]
    (evaluation,) = [each for each in runs if each["info"]["run_id"] != run_id]
    assert {param["key"]: param["value"] for param in evaluation["data"]["params"]}["ckpt_path"] == last
    assert "test/acc" in {metric["key"] for metric in evaluation["data"]["metrics"]}
    history = rest(mlflow_server, "/api/2.0/mlflow/metrics/get-history", run_id=run_id, metric_key="val/acc")
    assert len(history["metrics"]) == 2


def wandb_records(path: Path, block: int = 32768):
    """The records of a W&B transaction log (``run-<id>.wandb``), in wandb's own protobuf messages. Its
    framing is LevelDB's log format: 32 KiB blocks of chunks, each with a 7-byte header (CRC, length, type)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    position, pending = 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        length, kind = struct.unpack("<HB", data[position + 4 : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            yield Record.FromString(pending)
            pending = b""


@pytest.mark.slow
def test_a_wandb_offline_run_holds_the_config_and_metrics_and_a_resume_keeps_its_id(tmp_path):
    env = offline_env(tmp_path)
    wandb = ["--config", str(REPO / "configs" / "logger" / "wandb.yaml")]
    fit(tmp_path, env, *wandb, "--trainer.max_epochs", "1", *QUICK)
    run_dir = tmp_path / "runs" / "digits" / "version_0"
    run_id = json.loads((run_dir / TRACKER_RUNS).read_text())["lightning.pytorch.loggers.wandb.WandbLogger"]["id"]
    last = str(run_dir / "checkpoints" / "last.ckpt")
    fit(tmp_path, env, *wandb, "--ckpt_path", last, "--trainer.max_epochs", "2", *QUICK)
    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())  # as --config, a new run: no run id of this one
    tensorboard, tracker = (logger["init_args"] for logger in recorded["trainer"]["logger"])
    assert recorded["ckpt_path"] is None and tensorboard["version"] is None and tracker["id"] is None

    offline_runs = sorted((tmp_path / "runs" / "wandb").glob("offline-run-*"))
    assert [path.name.rsplit("-", 1)[1] for path in offline_runs] == [run_id, run_id]  # `wandb sync` joins them
    assert not (tmp_path / "wandb-elsewhere").exists() and not (tmp_path / "wandb").exists()
    epochs, config = [], {}
    for offline_run in offline_runs:
        for record in wandb_records(offline_run / f"run-{run_id}.wandb"):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {
                    item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
                }
                if "val/acc" in items:
                    assert 0.0 <= items["val/acc"] <= 1.0
                    epochs.append(items["epoch"])
            elif kind == "config":
                config.update(
                    {
                        item.key or ".".join(item.nested_key): json.loads(item.value_json)
                        for item in record.config.update
                    }
                )
    assert epochs == [0, 1]
    assert config["model.init_args.optimizer.init_args.lr"] == 0.003 and config["trainer.max_epochs"] == 1


def test_the_summary_command_of_a_tracker_quotes_its_store(tmp_path):
    """A store in a folder with a space (or any shell character) stays one argument of the command to paste."""
    from lightning.pytorch import loggers

    class Tracker(loggers.MLFlowLogger):
        run_id = "0123abcd"

        def __init__(self) -> None:  # what the summary reads of a run, without a store
            pass

    store = f"file:{tmp_path / 'my runs; rm -rf x'}"
    line = where_to_look(Tracker(), Namespace(init_args=Namespace(tracking_uri=store)))
    assert shlex.split(line.split(": ", 2)[-1]) == ["mlflow", "ui", "--backend-store-uri", store]
