"""Checkpoints that survive a killed process, load without running code, are found by name, and
say what data and run they came from."""

import errno
import importlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

CHECKPOINT_ALIASES = ("best", "last")


class UnsafeCheckpointError(RuntimeError):
    """The checkpoint needs arbitrary pickled objects, which could run code when loaded."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file in the same directory, then renames it into place.

    A reader never sees a partial file under a final name, whenever the process dies: the
    rename is atomic, and the data is flushed and fsynced to disk before it. A write that
    fails (a full disk, say) raises an error that says so and leaves the previous file intact.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: fsspec's own semantics
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a process killed mid-write
            if stale.name != f".{path.name}.{os.getpid()}.tmp":
                stale.unlink(missing_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with temporary.open("wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException as error:
            temporary.unlink(missing_ok=True)
            if isinstance(error, OSError):
                kept = f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written"
                reason = "the disk is full" if error.errno == errno.ENOSPC else (error.strerror or str(error))
                raise OSError(error.errno, f"could not write checkpoint {path}: {reason}; {kept}") from error
            raise
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # make the rename itself durable
        finally:
            os.close(directory)


def check_checkpoint_is_safe(path: str | Path) -> None:
    """Refuse a checkpoint that needs arbitrary pickled objects, without unpickling anything from it."""
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception as error:  # not a torch.save file at all
        raise UnsafeCheckpointError(f"{path} is not a readable checkpoint: {error}") from error
    if unsafe:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it needs arbitrary pickled objects ({', '.join(unsafe[:5])}), and "
            "unpickling them can run any code the file's author chose. Nothing from it was run. Load only "
            "checkpoints you trust, and share weights as a state_dict of tensors or as safetensors."
        )


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint on the CPU with ``weights_only=True``, after the safety check."""
    check_checkpoint_is_safe(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def recorded_datamodule(path: str | Path) -> dict[str, Any] | None:
    """The DataModule a checkpoint was trained with, as ``{"class_path", "init_args"}``, from the
    hyper-parameters LightningCLI saved in it; None when it holds none.

    Memory-mapped: only the pickled dictionary is read, not the tensors (Lightning reads the
    whole file twice more). ``weights_only`` refuses pickled objects; for a clear error first,
    the CLI runs ``check_checkpoint_is_safe`` before this."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    hparams = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    hparams.pop("_instantiator", None)
    class_path = hparams.pop("_class_path", None)
    return {"class_path": class_path, "init_args": hparams} if class_path else None


def training_run(path: str | Path) -> Path | None:
    """The run directory (runs/<name>/<version>) a checkpoint in its checkpoints/ folder belongs to."""
    checkpoint = Path(path).resolve()
    run_dir = checkpoint.parent.parent
    return run_dir if checkpoint.parent.name == "checkpoints" and (run_dir / "config.yaml").is_file() else None


def recorded_arguments(path: str | Path, evaluating: bool) -> list[str]:
    """Command-line options for what a checkpoint knows of its run: the DataModule it was trained
    with and, when ``evaluating`` it, the runs directory and name of that run (a new version is
    logged beside it; a resumed fit continues the run itself)."""
    arguments = []
    data = recorded_datamodule(path)
    if data is not None and importable(data["class_path"]):
        arguments += ["--data", json.dumps(data)]
    elif data is not None:
        rank_zero_warn(f"{path} was trained with {data['class_path']}, which cannot be imported here: the "
                       "configured data is used instead")  # fmt: skip
    if evaluating and (run_dir := training_run(path)) is not None:
        logger = "--trainer.logger.init_args"
        arguments += [f"{logger}.save_dir", str(run_dir.parent.parent), f"{logger}.name", run_dir.parent.name]
    return arguments


def importable(class_path: str) -> bool:
    module, _, name = class_path.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def strip_prefixes(state_dict: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """Keep the keys under ``prefix`` (without it), minus wrapper prefixes (``module.``, ``_orig_mod.``)."""
    stripped = {}
    for key, value in state_dict.items():
        while key.startswith("module."):  # DataParallel / DistributedDataParallel
            key = key[len("module.") :]
        key = key.replace("_orig_mod.", "")  # torch.compile, wherever the compiled module sat
        if key.startswith(prefix):
            stripped[key[len(prefix) :]] = value
    return stripped


def load_weights(net: nn.Module, source: str | Path | dict, strict: bool = True, prefix: str = "net.") -> None:
    """Load network weights from a Lightning checkpoint, a state_dict file or a state_dict.

    Keys are matched after dropping ``module.``/``_orig_mod.`` wrapper prefixes and the
    LightningModule's ``net.`` prefix. With ``strict`` any missing or unexpected key is an
    error that lists them by name; without, they are printed and the rest is loaded.
    """
    state_dict = load_checkpoint(source) if isinstance(source, str | Path) else source
    state_dict = state_dict.get("state_dict", state_dict)
    stripped = strip_prefixes(state_dict, prefix)
    if not stripped:  # a plain network state_dict, without the module's prefix
        stripped = strip_prefixes(state_dict)
    expected = net.state_dict()
    missing = sorted(set(expected) - set(stripped))
    unexpected = sorted(set(stripped) - set(expected))
    mismatched = sorted(k for k in set(stripped) & set(expected) if stripped[k].shape != expected[k].shape)
    report = []
    if missing:
        report.append(f"missing from the checkpoint: {', '.join(missing)}")
    if unexpected:
        report.append(f"not in the network: {', '.join(unexpected)}")
    if mismatched:
        shapes = (f"{k} {tuple(stripped[k].shape)} vs {tuple(expected[k].shape)}" for k in mismatched)
        report.append(f"different shapes (checkpoint vs network): {', '.join(shapes)}")
    if report and strict:
        raise RuntimeError("weights do not match the network; " + "; ".join(report) + " (strict: false loads the rest)")
    for line in report:
        print(f"not loaded, {line}")
    net.load_state_dict({k: v for k, v in stripped.items() if k not in mismatched}, strict=False)


def find_checkpoint(alias: str, runs_dir: str | Path) -> Path:
    """Return the best or last checkpoint of the most recent run under ``runs_dir``.

    The most recent run is the one whose ``checkpoints/last.ckpt`` was written last, so a
    `validate` or `test` run (which writes no checkpoints) never hides the run it evaluated.
    """
    if alias not in CHECKPOINT_ALIASES:
        raise ValueError(f"unknown checkpoint alias {alias!r}; use one of {CHECKPOINT_ALIASES} or a path")
    runs_dir = Path(runs_dir)
    lasts = sorted(runs_dir.glob("**/checkpoints/last.ckpt"), key=lambda path: path.stat().st_mtime)
    if not lasts:
        raise FileNotFoundError(
            f"--ckpt_path {alias}: no run with checkpoints/last.ckpt under {runs_dir.resolve()}; "
            f"train one with `{__package__} fit` first, or pass the path of a .ckpt file"
        )
    checkpoint_dir = lasts[-1].parent
    if alias == "last":
        return lasts[-1]
    bests = sorted(checkpoint_dir.glob("best*.ckpt"), key=lambda path: path.stat().st_mtime)
    if not bests:
        raise FileNotFoundError(f"--ckpt_path best: {checkpoint_dir} holds no best*.ckpt")
    return bests[-1]
