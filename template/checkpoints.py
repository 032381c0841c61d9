"""Checkpoints that survive a killed process, load without running code, are found by name, and
say what data and run they came from."""

import errno
import os
import pickle
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from torch import nn

from template.untrusted import (
    CheckpointError,
    DamagedCheckpointError,
    UnsafeCheckpointError,
    check_class_paths,
    drop_foreign_paths,
    tensor_bytes,
    verify_digest,
    with_digest,
)

CHECKPOINT_ALIASES = ("best", "last")
__all__ = ["CheckpointError", "DamagedCheckpointError", "UnsafeCheckpointError"]  # raised from here too


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file in the same directory, then renames it into place,
    with a digest of its tensors; reading one back verifies the digest and drops the file paths of
    its ModelCheckpoint states that lie outside its directory.

    A reader never sees a partial file under a final name, whenever the process dies: the
    rename is atomic, and the data is flushed and fsynced to disk before it. A write that
    fails (a full disk, say) raises an error that says so and leaves the previous file intact.

    The best and the last checkpoint are often saved one after the other with nothing changed
    in between (an epoch that improved): the second is then a hard link to the first file, not a
    second write (~15 ms for a small network), when the first file is still the one written and
    the two checkpoints have the same ``content_key``. Names are only ever replaced by rename, so
    a later last.ckpt never changes the best file it was linked to.
    """

    def __init__(self) -> None:
        super().__init__()
        self._written: tuple[Path, bytes, tuple[int, int]] | None = None  # the last file written: key, inode

    def load_checkpoint(self, path: str | Path, map_location: Any | None = None, weights_only: bool | None = None):
        checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        if "://" not in str(path):
            verify_digest(checkpoint, str(path))
            drop_foreign_paths(checkpoint, path)
        return checkpoint

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: fsspec's own semantics
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a process killed mid-write
            if stale.name != f".{path.name}.{os.getpid()}.tmp":
                stale.unlink(missing_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        key, written = content_key(checkpoint), self._written
        self._written = None  # until this write has succeeded
        same = written is not None and written[1] == key and inode(written[0]) == written[2]
        if same and inode(path) == written[2]:  # this very checkpoint is already on disk under this name
            self._written = written
            return None
        try:
            temporary.unlink(missing_ok=True)
            if not (same and written[0].parent == path.parent and linked(written[0], temporary)):
                with temporary.open("wb") as file:
                    torch.save(with_digest(checkpoint), file)
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
        self._written = (path, key, inode(path))
        return None


def content_key(checkpoint: dict) -> bytes:
    """What a checkpoint holds, as bytes that compare equal when nothing in it has changed: its plain
    values, the bytes of small tensors (random states are new tensors at every save), and for the
    others their memory, layout and version counter. A Lightning checkpoint's plain values include
    the loops' progress (global step, batches), so two keys are equal only between two saves of
    one step; the version counter (incremented by in-place operations, though not by writes to
    ``.data`` or fused optimizers) guards against a callback changing weights between them."""

    def key(value):
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.nbytes <= 65536:
            return ("bytes", value.dtype, tuple(value.shape), bytes(tensor_bytes(value)))
        if isinstance(value, torch.Tensor):
            return ("tensor", value.device.type, value.data_ptr(), value.dtype, tuple(value.shape), value.stride(),
                    value.storage_offset(), value._version)  # fmt: skip
        if isinstance(value, dict):
            return {name: key(item) for name, item in value.items()}
        if isinstance(value, list | tuple):
            return [key(item) for item in value]
        return value

    try:
        return pickle.dumps(key(checkpoint))
    except Exception:  # something pickle cannot copy: never equal, always written
        return os.urandom(16)


def inode(path: Path) -> tuple[int, int] | None:
    """The file a name stands for (device and inode), or None where there is none."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def linked(source: Path, link: Path) -> bool:
    """Hard-link ``link`` to ``source``; False where the file is gone or the filesystem has no hard links."""
    try:
        os.link(source, link)
        return True
    except OSError:
        return False


def check_checkpoint_is_safe(path: str | Path) -> None:
    """Refuse a checkpoint that needs arbitrary pickled objects, without unpickling anything from it."""
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception:  # not a zip checkpoint: torch's legacy format, or no torch.save file at all
        try:  # the weights_only unpickler refuses every object it does not know, in either format
            torch.load(path, map_location="cpu", weights_only=True)
            return
        except pickle.UnpicklingError as error:
            unsafe = [str(error).split("Unsupported global: GLOBAL ")[-1].split(" ")[0]]
        except Exception as error:
            raise DamagedCheckpointError(f"{path} is not a readable checkpoint: {error}") from None
    if unsafe:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it needs arbitrary pickled objects ({', '.join(unsafe[:5])}), and "
            "unpickling them can run any code the file's author chose. Nothing from it was run. Load only "
            "checkpoints you trust, and share weights as a state_dict of tensors or as safetensors."
        )


# What a Lightning checkpoint holds at its top level, with the type each entry must have.
LAYOUT = {
    "pytorch-lightning_version": str,
    "state_dict": dict,
    "epoch": int,
    "global_step": int,
    "hyper_parameters": dict,
    "datamodule_hyper_parameters": dict,
    "optimizer_states": list,
    "lr_schedulers": list,
    "callbacks": dict,
    "loops": dict,
}


def read_checkpoint(path: str | Path, model_class: type | None = None, tensors: bool = True) -> dict[str, Any]:
    """A Lightning checkpoint, on the CPU, after every check of an untrusted file: no pickled objects,
    the layout of a checkpoint, no class it may not name (see ``template.untrusted``) and, when its
    ``tensors`` are read (not only memory-mapped), tensors equal to the digest written with them.

    ``model_class`` is the LightningModule that the hyper-parameters are the arguments of, where
    the checkpoint does not name one itself.
    """
    check_checkpoint_is_safe(path)
    try:  # memory-mapped where the format allows: only the pickled dictionary is read now
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=not tensors)
    except RuntimeError as error:
        if "mmap" not in str(error):
            raise DamagedCheckpointError(f"{path} is not a readable checkpoint: {error}") from None
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)  # legacy format
    return check_contents(checkpoint, path, model_class, tensors)


def check_contents(checkpoint: Any, path: str | Path, model_class: type | None, tensors: bool) -> dict[str, Any]:
    """``checkpoint`` after the checks of its layout, the classes it names and (``tensors``) its digest."""
    check_layout(checkpoint, path)
    check_class_paths(checkpoint, str(path), model_class or default_model_class())
    if tensors:
        verify_digest(checkpoint, str(path))
    return checkpoint


def default_model_class() -> type:
    """The LightningModule whose arguments a checkpoint's hyper-parameters are, unless they name one."""
    # Imported here: the module loads checkpoints too.
    from template.module import ClassificationModule

    return ClassificationModule


def check_layout(checkpoint: Any, path: str | Path) -> None:
    """Refuse a file that is not a Lightning checkpoint, or whose entries have the wrong types."""
    if not isinstance(checkpoint, dict) or "pytorch-lightning_version" not in checkpoint:
        raise CheckpointError(
            f"{path} is not a Lightning checkpoint (no pytorch-lightning_version: a plain state_dict, or another "
            "tool's file). --ckpt_path takes the .ckpt files of a run; to start from these weights, load them into "
            "the network with template.checkpoints.load_weights."
        )
    for key, kind in LAYOUT.items():
        if key in checkpoint and not isinstance(checkpoint[key], kind):
            raise DamagedCheckpointError(
                f"{path} is malformed: its {key} is a {type(checkpoint[key]).__name__}, not a {kind.__name__}"
            )
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in checkpoint["state_dict"].items()):
        raise DamagedCheckpointError(f"{path} is malformed: its state_dict holds more than named tensors")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a file saved with ``torch.save`` on the CPU with ``weights_only=True``, after the safety
    check; a Lightning checkpoint also after every check of ``read_checkpoint``."""
    check_checkpoint_is_safe(path)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(checkpoint, dict) and "pytorch-lightning_version" in checkpoint:
        check_contents(checkpoint, path, None, tensors=True)
    return checkpoint


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


def match_keys(net: nn.Module, state_dict: dict) -> tuple[dict[str, torch.Tensor], list[str], list[str], list[str]]:
    """``state_dict`` keyed as ``net``'s own (wrapper and ``net.`` prefixes dropped), and the keys it lacks,
    the keys ``net`` lacks, and the keys of both whose shapes differ."""
    state_dict = state_dict.get("state_dict", state_dict)
    stripped = strip_prefixes(state_dict, "net.")
    if not stripped:  # a plain network state_dict, without the module's prefix
        stripped = strip_prefixes(state_dict)
    expected = net.state_dict()
    missing = sorted(set(expected) - set(stripped))
    unexpected = sorted(set(stripped) - set(expected))
    mismatched = sorted(k for k in set(stripped) & set(expected) if stripped[k].shape != expected[k].shape)
    return stripped, missing, unexpected, mismatched


def load_weights(net: nn.Module, source: str | Path | dict, strict: bool = True) -> None:
    """Load network weights from a Lightning checkpoint, a state_dict file or a state_dict.

    Keys are matched after dropping ``module.``/``_orig_mod.`` wrapper prefixes and the
    LightningModule's ``net.`` prefix. With ``strict`` any missing or unexpected key is an
    error that lists them by name; without, they are printed and the rest is loaded.
    """
    state_dict = load_checkpoint(source) if isinstance(source, str | Path) else source
    stripped, missing, unexpected, mismatched = match_keys(net, state_dict)
    report = []
    if missing:
        report.append(f"missing from the checkpoint: {', '.join(missing)}")
    if unexpected:
        report.append(f"not in the network: {', '.join(unexpected)}")
    if mismatched:
        expected = net.state_dict()
        shapes = (f"{k} {tuple(stripped[k].shape)} vs {tuple(expected[k].shape)}" for k in mismatched)
        report.append(f"different shapes (checkpoint vs network): {', '.join(shapes)}")
    if report and strict:
        raise RuntimeError("weights do not match the network; " + "; ".join(report) + " (strict: false loads the rest)")
    for line in report:
        print(f"not loaded, {line}")
    net.load_state_dict({k: v for k, v in stripped.items() if k not in mismatched}, strict=False)


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file, read without running any code it could carry: safetensors, or a
    ``torch.save`` file (a state_dict, or a Lightning checkpoint) after ``load_checkpoint``'s checks."""
    path = Path(path)
    if path.suffix == ".safetensors":
        try:
            return safetensors.torch.load_file(path, device="cpu")
        except (OSError, safetensors.SafetensorError) as error:
            raise DamagedCheckpointError(f"{path} is not a readable safetensors file: {error}") from None
    checkpoint = load_checkpoint(path)
    state_dict = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not state_dict or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state_dict.items()):
        raise DamagedCheckpointError(
            f"{path} holds no state_dict of named tensors: save one with torch.save(net.state_dict(), path), "
            "or safetensors.torch.save_file"
        )
    return state_dict


def load_pretrained(net: nn.Module, path: str | Path, head: str) -> None:
    """Start ``net`` from the weights in ``path`` (fine-tuning from a file), printing a report.

    Every tensor is loaded but the classifier ``head``'s (a module name, such as ``fc``), which keeps
    its fresh weights when the file's are another shape (another class count) or absent. Anything
    else that does not match (another shape, a tensor the network lacks or the file lacks, no tensor
    in common) means the file holds another network (resnet34's weights for a resnet18 share the
    first 120 tensors): an error naming the tensors, not a network half trained and half new.
    """
    state_dict = read_weights(path)
    stripped, missing, unexpected, mismatched = match_keys(net, state_dict)
    in_common = set(stripped) & set(net.state_dict())
    outside_head = []  # (what, keys): the mismatches that are not the classifier's
    for what, keys in (("other shapes", mismatched), ("not in the network", unexpected), ("not in the file", missing)):
        if others := [key for key in keys if not key.startswith(f"{head}.")]:
            outside_head.append((what, others))
    if outside_head or not in_common:
        found = "; ".join(
            f"{len(keys)} {what} ({', '.join(keys[:5])}{', ...' if len(keys) > 5 else ''})"
            for what, keys in outside_head
        )
        raise ValueError(
            f"weights_file {path} is not of this network ({type(net).__name__}): {found or 'no tensor in common'}. "
            "Give the weights of the same architecture as model.net, or choose the network they belong to"
        )
    loaded = len(in_common) - len(mismatched)
    print(f"weights_file {path}: {loaded} of {len(net.state_dict())} tensors loaded")
    load_weights(net, stripped, strict=False)
    if mismatched or missing:
        print(f"new classifier ({head}): {net.get_submodule(head)}, for this data's class count")


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
    bests = list(checkpoint_dir.glob("best*.ckpt"))
    if not bests:
        raise FileNotFoundError(f"--ckpt_path best: {checkpoint_dir} holds no best*.ckpt")
    # The best monitored value (with save_top_k > 1 the newest file is not the best); ties: the newest.
    return max(bests, key=lambda path: (*monitored_score(path), path.stat().st_mtime))


def monitored_score(path: Path) -> tuple[bool, float]:
    """(found, score oriented so that higher is better) of the monitored metric a checkpoint was saved
    for, from the state of the ModelCheckpoint that wrote it: its score when it was saved."""
    check_checkpoint_is_safe(path)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    for name, state in (checkpoint.get("callbacks") or {}).items():
        if str(name).startswith("ModelCheckpoint") and isinstance(state, dict) and state.get("monitor"):
            score = state.get("current_score")
            if isinstance(score, torch.Tensor | float | int) and torch.isfinite(torch.as_tensor(score)):
                return True, float(score) * (-1.0 if "'mode': 'min'" in name else 1.0)
    return False, 0.0
