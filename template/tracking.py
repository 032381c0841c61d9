"""Trackers beside TensorBoard (MLflow, W&B): where they write, the run each continues, what they are told.

TensorBoard stays the first logger: it writes the run directory (config.yaml, env.json, checkpoints). Each
logger after it is a tracker, added by ``--config configs/logger/mlflow.yaml`` or ``wandb.yaml``. A tracker
run belongs to a run directory: the run directory records its id (``trackers.json``), a resumed fit logs on
into it, and a rerun from config.yaml or an evaluation of a checkpoint starts a new one, as it starts a new
run directory.
"""

import inspect
import json
import os
import pkgutil
import re
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import loggers  # each imports its tracker only when used
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from template.checkpoints import DamagedCheckpointError
from template.compat import logged_params

# In a run directory: the id of the run each tracker logs into, by logger class, for a resume to log on into it.
TRACKER_RUNS = "trackers.json"
# Logger arguments that name the run a logger writes into: TensorBoard's version, MLflow's run, W&B's.
RUN_IDS = ("version", "run_id", "id")
TRACKER_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")  # MLflow's hex ids, W&B's base-36 ones


class MLFlowLogger(loggers.MLFlowLogger):
    """Lightning's MLFlowLogger, which a resumed run may give changed hyper-parameters (another
    ``--data.num_workers`` on another machine, say). MLflow refuses a new value for a run's parameter,
    and Lightning logs the module's and data's hyper-parameters at every start: those already logged
    keep their first value, with a warning naming them (the run directory's config.yaml has the new)."""

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        params = logged_params(params)  # as Lightning's own does: the keys MLflow gets
        logged = self.experiment.get_run(self.run_id).data.params
        if changed := sorted(key for key, value in params.items() if key in logged and logged[key] != str(value)[:250]):
            rank_zero_warn(
                f"MLflow run {self.run_id} keeps the first value of {', '.join(changed)}: MLflow cannot change a "
                "parameter; config.yaml in the run directory holds this run's"
            )
        super().log_hyperparams({key: value for key, value in params.items() if key not in logged})


def resolve_trackers(trackers: list, runs_dir: str, name: str | None) -> list:
    """The trackers, each told where it writes, so that config.yaml records it and a resume finds its run.

    An MLFlowLogger without a ``tracking_uri`` logs to ``MLFLOW_TRACKING_URI`` when it is set (a server),
    as MLflow's own tools do, else to an SQLite store beside the run directories (``runs/mlflow.db``;
    MLflow 3 refuses its plain-file store by default). A WandbLogger without a ``save_dir`` writes there too
    (``runs/wandb/``). Without an experiment (project) name, each takes the run directories' ``name``.
    The same tracker twice (a resume given its --config again) is one: the first, which has the run's id.
    """
    runs = Path(runs_dir).resolve()
    for tracker in trackers:
        cls = pkgutil.resolve_name(tracker.class_path) if isinstance(tracker, Namespace) else None
        if not isinstance(cls, type) or (init_args := tracker.get("init_args")) is None:
            continue
        for argument in ("experiment_name", "project"):  # MLflow's, W&B's
            if argument in init_args and not init_args[argument]:
                init_args[argument] = name or "lightning_logs"  # Lightning's default
        environment = os.environ.get("MLFLOW_TRACKING_URI")
        if (
            issubclass(cls, loggers.MLFlowLogger)
            and init_args.get("run_id")
            and init_args.get("tracking_uri")
            and environment not in (None, "", init_args.get("tracking_uri"))
        ):
            rank_zero_warn(
                f"MLflow run {init_args.run_id} goes on in {init_args.tracking_uri}, where the run began, not in "
                f"MLFLOW_TRACKING_URI={environment}: a run lives in one store"
            )
        if issubclass(cls, loggers.MLFlowLogger) and not init_args.get("tracking_uri"):
            init_args.tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{runs / 'mlflow.db'}"
            if init_args.tracking_uri.startswith("sqlite:") and not init_args.get("artifact_location"):
                init_args.artifact_location = str(runs / "mlartifacts")  # MLflow's own: ./mlruns, wherever that is
        elif issubclass(cls, WandbLogger) and not init_args.get("save_dir") and not init_args.get("dir"):
            init_args.save_dir = str(runs)
    unique = [without_run_ids(tracker) for tracker in trackers]
    return [tracker for index, tracker in enumerate(trackers) if unique[index] not in unique[:index]]


def without_run_ids(tracker: Any) -> Any:
    if not isinstance(tracker, Namespace) or tracker.get("init_args") is None:
        return tracker
    init_args = {name: value for name, value in vars(tracker.init_args).items() if name not in RUN_IDS}
    return (tracker.class_path, init_args)


def class_key(cls: type) -> str:
    """A logger class by its defining module: one key for all the paths that import it."""
    return f"{cls.__module__}.{cls.__qualname__}"


def run_id_argument(tracker: Logger) -> str | None:
    """The argument that tells a tracker which run to log into (MLflow's ``run_id``, W&B's ``id``)."""
    parameters = inspect.signature(type(tracker)).parameters
    return next((name for name in ("run_id", "id") if name in parameters), None)


def record_trackers(trackers: list[Logger], configured: list, config: dict, run_dir: Path) -> None:
    """Start each tracker's run: a new one gets the run's configuration (as config.yaml holds it) as its
    parameters (a resumed one keeps those it started with: MLflow's cannot change, and config.yaml holds
    the new ones); and write each run's id into ``trackers.json`` in the run directory. ``configured``:
    each tracker's own section of the configuration."""
    record = {}
    for tracker, settings in zip(trackers, configured):
        if (argument := run_id_argument(tracker)) is None:
            continue
        init_args = settings.get("init_args") or Namespace()
        if not any(init_args.get(name) for name in RUN_IDS):
            tracker.log_hyperparams(flattened(config))
        _ = tracker.experiment  # starts the run (W&B's id is known only then)
        record[class_key(type(tracker))] = {argument: tracker.version}
    if record:
        (run_dir / TRACKER_RUNS).write_text(json.dumps(record, indent=2) + "\n")


def tracker_runs(run_dir: Path) -> dict[str, dict[str, str]]:
    """The tracker runs a run directory recorded, each as the logger arguments that continue it, by logger
    class; checked, as the config.yaml beside it is. None recorded: none."""
    source = run_dir / TRACKER_RUNS
    if not source.is_file():
        return {}
    try:
        record = json.loads(source.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise DamagedCheckpointError(f"{source}, the run's tracker runs, cannot be read: {error}") from None
    if not isinstance(record, dict) or not all(
        isinstance(ids, dict)
        and all(name in RUN_IDS and isinstance(id, str) and TRACKER_RUN_ID.match(id) for name, id in ids.items())
        for ids in record.values()
    ):
        raise DamagedCheckpointError(
            f"{source} is not a record of tracker runs ({{logger class: {{run_id or id: an id}}}}): delete it to "
            "resume into new tracker runs"
        )
    return record


def flattened(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested configuration as ``{"model.init_args.optimizer.init_args.lr": 0.003, ...}``: the names of
    the command-line options, with list items (callbacks, loggers) by index."""
    if isinstance(value, dict) and value:
        items = value.items()
    elif isinstance(value, list | tuple) and any(isinstance(item, dict) for item in value):
        items = enumerate(value)
    else:
        return {prefix: value}
    return {key: item for name, each in items for key, item in flattened(each, f"{prefix}.{name}".lstrip(".")).items()}


def where_to_look(tracker: Logger, settings: Namespace) -> str:
    """A line of the run summary: the tracker's run, and the command that shows it."""
    init_args = settings.get("init_args") or Namespace()
    if isinstance(tracker, loggers.MLFlowLogger):
        uri = init_args.get("tracking_uri") or ""
        if uri.startswith(("http://", "https://")):
            return f"mlflow:          {uri}/#/experiments/{tracker.experiment_id}/runs/{tracker.run_id}"
        return f"mlflow:          run {tracker.run_id}: mlflow ui --backend-store-uri {uri}"
    if isinstance(tracker, WandbLogger):
        run = tracker.experiment
        return f"wandb:           wandb sync {run.settings.sync_dir}" if run.offline else f"wandb:           {run.url}"
    return f"{type(tracker).__name__}: {tracker.name} {tracker.version}"
