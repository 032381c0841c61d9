"""A checkpoint's run: the configuration it was trained with, where its run directory is.

``template test --ckpt_path X`` (validate, predict, and a resumed fit alike) starts from the
configuration of X's run, as its first --config after the recipe's defaults: the run's own
``config.yaml`` (checked like the checkpoint beside it), or, for a checkpoint that left its run
directory, what the checkpoint records (the model's and the DataModule's arguments). Every
--config file and option given overrides it.
"""

import inspect
import pkgutil
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace
from lightning.pytorch.utilities import rank_zero_warn

from template.tracking import RUN_IDS, class_key, tracker_runs
from template.untrusted import DamagedCheckpointError, check_config

DEFAULT_RUNS_DIR = "runs"
# DataModule arguments that say where to write, what else to read and what to start, not what the
# data is: a checkpoint's values for them are not used.
NOT_RECORDED = ("cache_dir", "predict_path", "num_workers", "download")


def training_run(path: str | Path) -> Path | None:
    """The run directory (runs/<name>/<version>) a checkpoint in its checkpoints/ folder belongs to."""
    checkpoint = Path(path).resolve()
    run_dir = checkpoint.parent.parent
    return run_dir if checkpoint.parent.name == "checkpoints" and (run_dir / "config.yaml").is_file() else None


def recorded_datamodule(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The DataModule a checkpoint was trained with, as ``{"class_path", "init_args"}``, from the
    hyper-parameters LightningCLI saved in it; None when it holds none. For a checkpoint from
    ``read_checkpoint``: the class path is one it may name."""
    hparams = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    hparams.pop("_instantiator", None)
    for where_and_how in NOT_RECORDED:  # this machine's choices, not the data's: never a stranger's
        hparams.pop(where_and_how, None)
    class_path = hparams.pop("_class_path", None)
    return {"class_path": class_path, "init_args": hparams} if class_path else None


def trained_config(
    ckpt_path: str | Path, checkpoint: dict[str, Any], sections: dict[str, type], evaluating: bool
) -> dict:
    """The configuration the checkpoint's run was trained with, as a --config (see the module's doc).

    ``sections``: the class whose arguments each section of a config holds, for the checks.
    Evaluating, the run's logger writes a new version beside the trained one, and its trackers (MLflow,
    W&B) new runs; resuming, the trackers log on into the runs the run directory recorded.
    """
    if (run_dir := training_run(ckpt_path)) is not None:
        source = run_dir / "config.yaml"
        try:
            config = yaml.safe_load(source.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
            raise DamagedCheckpointError(f"{source}, the run's configuration, cannot be read: {error}") from None
        check_config(config, str(source), sections)  # before jsonargparse imports what it names
        logger = (config.get("trainer") or {}).get("logger")
        recorded = {} if evaluating else tracker_runs(run_dir)
        for index, each in enumerate(logger if isinstance(logger, list) else [logger]):
            if not isinstance(each, dict) or not isinstance(init_args := each.get("init_args"), dict):
                continue
            if evaluating:  # a new run directory, and new tracker runs: training's curves stay training's alone
                for argument in RUN_IDS:
                    init_args.pop(argument, None)
            elif index > 0 and isinstance(class_path := each.get("class_path"), str):
                # A resume: the trackers log on into their runs (and TensorBoard into its directory: the CLI's).
                init_args.update(recorded.get(class_key(pkgutil.resolve_name(class_path)), {}))
    else:
        hparams = dict(checkpoint.get("hyper_parameters") or {})
        class_path = hparams.pop("_class_path", None)  # a LightningModule subclass chosen from YAML
        init_args = {k: v for k, v in hparams.items() if not k.startswith("_")}
        config = {"model": {"class_path": class_path, "init_args": init_args} if class_path else init_args}
        if (data := recorded_datamodule(checkpoint)) is not None:
            config["data"] = data
    config.pop("ckpt_path", None)  # the checkpoint given is the one evaluated
    drop_retired_data_options(config)
    class_names = (checkpoint.get("hyper_parameters") or {}).get("class_names")
    data = config.get("data")
    if class_names and isinstance(data, dict) and "classes" in arguments_of(data.get("class_path")):
        # A DataModule that takes its classes (ImageFolderDataModule) labels its folders in the trained order,
        # and needs no training folder to know them.
        init_args = data.setdefault("init_args", {})
        if isinstance(init_args, dict) and not init_args.get("classes"):
            init_args["classes"] = list(class_names)
    return config


def drop_retired_data_options(config: dict) -> None:
    """Leave out, with a warning, the DataModule options a run recorded that its class no longer takes
    (a template update removed them: ``cache_max_size``, say): the rest of the run still evaluates."""
    data = config.get("data")
    init_args = data.get("init_args") if isinstance(data, dict) else None
    cls = pkgutil.resolve_name(data["class_path"]) if isinstance(init_args, dict) and data.get("class_path") else None
    if not isinstance(cls, type):
        return
    parameters = inspect.signature(cls.__init__).parameters.values()
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
        return  # takes any option: its base class decides
    retired = sorted(set(init_args) - {parameter.name for parameter in parameters})
    if retired:
        rank_zero_warn(f"the run's data options {', '.join(retired)} are no longer options of {cls.__name__}: left out")
        for name in retired:
            del init_args[name]


def arguments_of(class_path: Any) -> set[str]:
    """The argument names of the class a checked config names (so importing it is allowed)."""
    cls = pkgutil.resolve_name(class_path) if isinstance(class_path, str) else None
    return set(inspect.signature(cls.__init__).parameters) if isinstance(cls, type) else set()


def without_data_options(argv: list[str]) -> list[str]:
    """``argv`` less its --data options, each with its value (the next token, or after ``=``)."""
    kept, value_next = [], False
    for token in argv:
        if value_next:
            value_next = False
        elif token.split("=")[0] == "--data" or token.startswith("--data."):
            value_next = "=" not in token
        else:
            kept.append(token)
    return kept


def is_tensorboard(logger: Any) -> bool:
    """Whether a logger's configuration, parsed (a Namespace) or as YAML holds it (a dict), is TensorBoard's."""
    return isinstance(logger, Namespace | dict) and str(logger.get("class_path", "")).endswith("TensorBoardLogger")


def loggers_of(config: Namespace | dict) -> list:
    """The configured loggers, as a list: the first writes the run directory, any others are trackers."""
    logger = config.get("trainer", {}).get("logger")
    return list(logger) if isinstance(logger, list | tuple) else [logger]


def continue_run_directory(ckpt_path: str, logger: Namespace) -> None:
    """Resuming from runs/<name>/<version>/checkpoints/X.ckpt logs on into that same run directory."""
    if (run_dir := training_run(ckpt_path)) is not None:
        logger.init_args.save_dir = str(run_dir.parent.parent)
        logger.init_args.name = run_dir.parent.name
        logger.init_args.version = run_dir.name


def runs_dir(config: Namespace | dict) -> str:
    """Where the configured TensorBoard logger writes its runs."""
    logger = loggers_of(config)[0]
    if is_tensorboard(logger):
        return logger.get("init_args", {}).get("save_dir", DEFAULT_RUNS_DIR)
    return DEFAULT_RUNS_DIR
