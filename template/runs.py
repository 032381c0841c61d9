"""Where a configuration's runs go: its loggers, its runs directory, the tracker runs a resume continues."""

import os
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from template.options import data_run_name, recipe_run_name, trained_run_name
from template.tracking import continue_tracker_runs, resolve_trackers

DEFAULT_RUNS_DIR = "runs"


def is_tensorboard(logger: Any) -> bool:
    """Whether a logger's configuration, parsed (a Namespace) or as YAML holds it (a dict), is TensorBoard's."""
    return isinstance(logger, Namespace | dict) and str(logger.get("class_path", "")).endswith("TensorBoardLogger")


def loggers_of(config: Namespace | dict) -> list:
    """The configured loggers, as a list: the first writes the run directory, any others are trackers."""
    logger = config.get("trainer", {}).get("logger")
    return list(logger) if isinstance(logger, list | tuple) else [logger]


def runs_dir(config: Namespace | dict) -> str:
    logger = loggers_of(config)[0]
    return logger.get("init_args", {}).get("save_dir", DEFAULT_RUNS_DIR) if is_tensorboard(logger) else DEFAULT_RUNS_DIR


def run_name_of(config: Namespace | dict, data: str | None = None) -> str | None:
    """The configured TensorBoard logger's run name (None: no TensorBoard logger); where that is the recipe's
    (runs/digits) and the data (``data``, else the configuration's) another DataModule, the DataModule's
    (runs/imagefolder, runs/photos for ``--data my_module.Photos``)."""
    if not is_tensorboard(logger := loggers_of(config)[0]):
        return None
    name = (logger.get("init_args") or {}).get("name")
    data = data or (config.get("data") or {}).get("class_path")
    recipe_name, recipe_data = recipe_run_name()
    return data_run_name(data) if name == recipe_name and isinstance(data, str) and data != recipe_data else name


def place_run(
    config: Namespace,
    run_name: tuple[str, str] | None,
    resumed: Path | None,
    ckpt_path: Path | None,
    fitting: bool = False,
) -> None:
    """Place a command's run under the runs directory: at ``run_name`` (a command running many fits), in the run a
    resumed fit continues (``resumed``), or as a new version of the run ``ckpt_path`` came from (unless the user named
    one), never into another run's directory; and tell the trackers where to write and which run a resume continues.
    A new fit with no logger (``fitting``) writes into no folder of another's checkpoints either."""
    logger, *trackers = loggers_of(config)  # TensorBoard first: it writes the run directory
    # Lightning's folder with no logger, where the recipe's last.ckpt goes unless placed elsewhere (not to resume).
    last = Path(config.trainer.get("default_root_dir") or ".", "checkpoints", "last.ckpt")
    writes_last = (config.get("last_checkpoint") or {}).get("dirpath") is None and not config.trainer.fast_dev_run
    if fitting and logger is False and ckpt_path is None and writes_last and last.exists():
        raise ValueError(
            f"{last.resolve()} is another run's: a new fit with --trainer.logger false writes its own last.ckpt there, "
            "over it; move it away, resume it (--ckpt_path), or keep the logger (runs/<name>/version_N each)"
        )
    if is_tensorboard(logger):
        # Absolute: a resumed run's ModelCheckpoint then sees the directory it recorded, and restores its best so far.
        logger.init_args.save_dir = str(Path(logger.init_args.save_dir).resolve())
        if resumed is not None:  # logs on into the run directory the checkpoint lies in
            logger.init_args.name, logger.init_args.version = resumed.parent.name, resumed.name
        elif run_name is not None:
            logger.init_args.name, logger.init_args.version = run_name
        else:
            evaluated = ckpt_path is not None and logger.init_args.name == recipe_run_name()[0]
            logger.init_args.name = (trained_run_name(ckpt_path) if evaluated else None) or run_name_of(config)
        name, version = logger.init_args.name, logger.init_args.get("version")
        folders = [str(f) for f in (name, f"version_{version}" if type(version) is int else version) if f]
        run = Path(logger.init_args.save_dir, *folders)  # save_dir resolved: a link there is the user's choice
        check_own_folders(Path(logger.init_args.save_dir), run)
        # Lightning only warns, then writes over its config.yaml, metrics and last.ckpt, and `best` finds the old best.
        if resumed is None and version not in (None, "") and run.is_dir() and any(run.iterdir()):
            fix = "move it away (sweep: or give another --study_name)"
            if run_name is None:
                fix = "leave --trainer.logger.init_args.version out (null after a --config) for a new version_N, give "
                fix += f"one not taken, or resume that run with --ckpt_path {run / 'checkpoints' / 'last.ckpt'}"
            raise ValueError(
                f"{run} holds a run already: a command that does not resume it writes a run directory of its own, not "
                f"into that run's config.yaml, metrics and checkpoints; {fix}"
            )
    if trackers:
        name = logger.init_args.get("name") if is_tensorboard(logger) else None
        if resumed is not None:
            continue_tracker_runs(trackers, resumed, Path(runs_dir(config)).resolve())
        config.trainer.logger = [logger, *resolve_trackers(trackers, runs_dir(config), name)]


def check_own_folders(save_dir: Path, run: Path) -> None:
    """Refuse a link, or no folder, from ``save_dir`` down to ``run``: it would lead a run's writes out of the runs."""
    for folder in sorted(f for f in (run, *run.parents) if save_dir in f.parents):
        if folder.is_symlink() or folder.exists() and not folder.is_dir():
            what = f"a symbolic link (to {os.readlink(folder)})" if folder.is_symlink() else "no folder"
            raise ValueError(
                f"{folder} is {what}; a run writes only into folders of its own: remove it, or set "
                "--trainer.logger.init_args.save_dir (which may be a link) to the folder you mean"
            )
