"""Trackers after TensorBoard, the first logger (MLflow, W&B: ``--config configs/logger/mlflow.yaml``): where they
write, and the run each logs into. A run directory records its trackers' run ids (``trackers.json``); a resumed
fit logs on into them, a rerun or an evaluation starts new ones, as it starts a new run directory."""

import contextlib
import functools
import inspect
import io
import json
import os
import pkgutil
import re
import secrets
import shlex
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import loggers  # each imports its tracker only when used
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from template.checkpoints import DamagedCheckpointError
from template.compat import logged_params
from template.files import foreign_sql, read_at_most, schema_of, write_atomic
from template.text import printable

TRACKER_RUNS = "trackers.json"
# Logger arguments that name the run a logger writes into: TensorBoard's version, MLflow's run, W&B's.
RUN_IDS = ("version", "run_id", "id")
TRACKER_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")  # MLflow's hex ids, W&B's base-36 ones
# A token a run directory shares with its MLflow run (a tag there, "token" in trackers.json): a resume logs on into
# an MLflow run only if it holds the token, not into whichever run a trackers.json names (a colleague's run's id).
TOKEN_TAG = "template.run_token"
# The most trackers.json may take, read whole: a tracker's entry (its class, an id) takes under 300 bytes.
MAX_TRACKER_RUNS_BYTES = 1 << 16


class MLFlowLogger(loggers.MLFlowLogger):
    """Lightning's MLFlowLogger, resumable with changed hyper-parameters: MLflow refuses a new value for a run's
    parameter, so those already logged keep their first, named in a warning."""

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        params = logged_params(params)
        logged = self.experiment.get_run(self.run_id).data.params
        if changed := sorted(key for key, value in params.items() if key in logged and logged[key] != str(value)[:250]):
            rank_zero_warn(
                f"MLflow run {self.run_id} keeps the first value of {', '.join(changed)}: MLflow cannot change a "
                "parameter; config.yaml in the run directory holds this run's"
            )
        super().log_hyperparams({key: value for key, value in params.items() if key not in logged})


def configured_class(tracker: Any) -> tuple[type, Namespace] | tuple[None, None]:
    cls = pkgutil.resolve_name(tracker.class_path) if isinstance(tracker, Namespace) else None
    init_args = tracker.get("init_args") if isinstance(cls, type) else None
    return (cls, init_args) if init_args is not None else (None, None)


def resolve_trackers(trackers: list, runs_dir: str, name: str | None) -> list:
    """The trackers told where they write (config.yaml records it): MLflow to ``MLFLOW_TRACKING_URI``, else to SQLite
    beside the runs (MLflow refuses its plain-file store), W&B there too. A tracker given twice is one, the first."""
    runs, environment = Path(runs_dir).resolve(), os.environ.get("MLFLOW_TRACKING_URI")
    for tracker in trackers:
        cls, init_args = configured_class(tracker)
        if cls is None:
            continue
        for argument in ("experiment_name", "project"):  # MLflow's, W&B's
            if argument in init_args and not init_args[argument]:
                init_args[argument] = name or "lightning_logs"  # Lightning's default
        mlflow = issubclass(cls, loggers.MLFlowLogger)
        if mlflow and not init_args.get("tracking_uri"):
            init_args.tracking_uri = mlflow_uri(init_args, runs)
            if init_args.tracking_uri.startswith("sqlite:") and not init_args.get("artifact_location"):
                init_args.artifact_location = str(runs / "mlartifacts")  # MLflow's own: ./mlruns, wherever that is
        elif mlflow and init_args.get("run_id") and environment not in (None, "", init_args.tracking_uri):
            rank_zero_warn(
                f"MLflow run {init_args.run_id} goes on in {init_args.tracking_uri}, where the run began, not "
                f"in MLFLOW_TRACKING_URI={environment}: a run lives in one store"
            )
        elif issubclass(cls, WandbLogger) and not init_args.get("save_dir") and not init_args.get("dir"):
            init_args.save_dir = str(runs)
        if mlflow:
            check_store(init_args.tracking_uri)
    unique = [without_run_ids(tracker) for tracker in trackers]
    return [tracker for index, tracker in enumerate(trackers) if unique[index] not in unique[:index]]


def without_run_ids(tracker: Any) -> Any:
    if not isinstance(tracker, Namespace) or tracker.get("init_args") is None:
        return tracker
    return tracker.class_path, {key: value for key, value in vars(tracker.init_args).items() if key not in RUN_IDS}


def check_store(uri: str) -> None:
    """Refuse a SQLite MLflow store that holds a trigger or view the installed MLflow does not make: its SQL would run
    inside MLflow's reads and writes (a trigger may rewrite each val/acc logged). Tables and indexes may be an older
    MLflow's, upgraded."""
    path = Path(uri.removeprefix("sqlite:///"))
    if not uri.startswith("sqlite:///") or not path.is_file():
        return
    from mlflow import __version__

    known = mlflow_sql()
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as database:
            unknown = foreign_sql(runs_sql(database), known)
    except sqlite3.DatabaseError as error:
        raise ValueError(f"the MLflow store {path} is not a readable SQLite database ({error})") from None
    if unknown:
        raise ValueError(
            f"refusing the MLflow store {path}: it holds {unknown}, which MLflow {__version__} does not make: its SQL "
            "would run inside MLflow's writes. Use a store MLflow made, or another tracking_uri"
        )


def runs_sql(database: sqlite3.Connection) -> set[tuple]:
    """A SQLite database's triggers and views: the schema entries whose SQL runs inside others' queries."""
    return {entry for entry in schema_of(database) if entry[0] in ("trigger", "view")}


@functools.cache
def mlflow_sql() -> frozenset[tuple]:
    """The triggers and views of a new store as the installed MLflow makes it (its migrations' head), once a process."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stderr(io.StringIO()):  # its migrations' log
        SqlAlchemyStore(f"sqlite:///{folder}/reference.db", folder).engine.dispose()
        with contextlib.closing(sqlite3.connect(Path(folder, "reference.db"))) as reference:
            return frozenset(runs_sql(reference))


def mlflow_uri(init_args: Namespace, runs: Path) -> str:
    """Where MLflow logs: as given, else ``MLFLOW_TRACKING_URI``, else SQLite beside the runs."""
    return init_args.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{runs / 'mlflow.db'}"


def continue_tracker_runs(trackers: list[Namespace], run_dir: Path, runs: Path) -> None:
    recorded = tracker_runs(run_dir)
    for tracker in trackers:
        cls, init_args = configured_class(tracker)
        entry = dict(recorded.get(class_key(cls), {})) if cls is not None else {}
        token = entry.pop("token", None)
        for argument, run_id in entry.items():
            if argument not in init_args or init_args.get(argument):
                continue
            if issubclass(cls, loggers.MLFlowLogger) and (why := not_ours(mlflow_uri(init_args, runs), run_id, token)):
                rank_zero_warn(
                    f"MLflow run {run_id}, which {run_dir / TRACKER_RUNS} names, {why}: the resume logs into a new "
                    "MLflow run"
                )
                continue
            init_args[argument] = run_id


def not_ours(uri: str, run_id: str, token: str | None) -> str | None:
    """Why the MLflow run ``run_id`` is not the one a trackers.json holding ``token`` began (None: it is): its tag
    is another token, or the record has none where the run has one. A run and record of before tokens agree."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        tag = MlflowClient(uri).get_run(run_id).data.tags.get(TOKEN_TAG)
    except MlflowException as error:  # deleted, or on another server
        return f"cannot be read in {uri} ({printable(str(error).splitlines()[0][:200])})"
    return None if tag == token else f"does not hold this run directory's token (its tag {TOKEN_TAG})"


def class_key(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def record_trackers(trackers: list[Logger], configured: list, config: dict, run_dir: Path) -> None:
    """Start each tracker's run (a new one gets ``config``) and record its id; ``configured``: their sections."""
    record = {}
    for tracker, settings in zip(trackers, configured):
        parameters = inspect.signature(type(tracker)).parameters
        if (argument := next((name for name in ("run_id", "id") if name in parameters), None)) is None:
            continue
        init_args = settings.get("init_args") or Namespace()
        if not any(init_args.get(name) for name in RUN_IDS):
            tracker.log_hyperparams(flattened(config))
        _ = tracker.experiment  # starts the run (W&B's id is known only then)
        record[class_key(type(tracker))] = {argument: tracker.version}
        if isinstance(tracker, loggers.MLFlowLogger):  # the run's token: its own, or a new one
            token = tracker.experiment.get_run(tracker.run_id).data.tags.get(TOKEN_TAG)
            if token is None:
                token = secrets.token_hex(16)
                tracker.experiment.set_tag(tracker.run_id, TOKEN_TAG, token)
            record[class_key(type(tracker))]["token"] = token
    if record:
        write_atomic(run_dir / TRACKER_RUNS, json.dumps(record, indent=2) + "\n")


def tracker_runs(run_dir: Path) -> dict[str, dict[str, str]]:
    """The tracker runs a run directory recorded, checked: {logger class: {argument: run id}}."""
    source = run_dir / TRACKER_RUNS
    if not source.is_file():
        return {}
    try:
        record = json.loads(read_at_most(source, MAX_TRACKER_RUNS_BYTES))
    except (OSError, ValueError, RecursionError) as error:  # RecursionError: nested past the parser's depth
        raise DamagedCheckpointError(f"{source}, the run's tracker runs, cannot be read: {error}") from None
    if not isinstance(record, dict) or not all(
        isinstance(ids, dict)
        and all(
            name in (*RUN_IDS, "token") and isinstance(id, str) and TRACKER_RUN_ID.match(id) for name, id in ids.items()
        )
        for ids in record.values()
    ):
        raise DamagedCheckpointError(
            f"{source} is not a record of tracker runs ({{logger class: {{run_id or id: an id}}}}): delete it to "
            "resume into new tracker runs"
        )
    return record


def flattened(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested configuration by the names of its command-line options (list items by index)."""
    if isinstance(value, list | tuple) and any(isinstance(item, dict) for item in value):
        value = dict(enumerate(value))
    if not isinstance(value, dict) or not value:
        return {prefix: value}
    named = {f"{prefix}.{name}".lstrip("."): each for name, each in value.items()}
    return {key: item for name, each in named.items() for key, item in flattened(each, name).items()}


def where_to_look(tracker: Logger, settings: Namespace) -> str:
    init_args = settings.get("init_args") or Namespace()
    if isinstance(tracker, loggers.MLFlowLogger):
        uri = init_args.get("tracking_uri") or ""
        if uri.startswith(("http://", "https://")):
            return f"mlflow:          {uri}/#/experiments/{tracker.experiment_id}/runs/{tracker.run_id}"
        return f"mlflow:          run {tracker.run_id}: mlflow ui --backend-store-uri {shlex.quote(uri)}"
    if isinstance(tracker, WandbLogger):
        run = tracker.experiment
        sync = f"wandb sync {shlex.quote(str(run.settings.sync_dir))}"
        return f"wandb:           {sync}" if run.offline else f"wandb:           {run.url}"
    return f"{type(tracker).__name__}: {tracker.name} {tracker.version}"
