"""Checkpoints that survive a killed process, load without running code, are found by name, and
say what data and run they came from."""

import contextlib
import errno
import glob
import hashlib
import io
import itertools
import os
import pickle
import re
import stat
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from template.files import NotARegularFile, open_regular, remove_stale_temporaries, replaced_atomically
from template.text import printable, shown

CHECKPOINT_ALIASES = ("best", "last")
INTEGRITY_KEY = "integrity"
MAX_TENSORS = 100_000  # in a whole checkpoint (the biggest real networks' hold a few thousand, states included)
MAX_VIEWS_SHARE = 16  # bytes all tensors claim over the bytes they are views of (tied weights: a few times)
MAX_DEPTH = 32  # how deep a checkpoint's values nest (Lightning's loops, the deepest, go 9 levels)
MAX_VALUES = 1 << 22  # values and containers in a whole checkpoint (Adam's state: a few per parameter tensor)
# Whole numbers in a checkpoint are counts, indices and seeds (numpy's and sklearn's stop below 2**32): from 0, or in
# a record of arguments (a schedule's last_epoch=-1), from -2**32.
MAX_COUNT, RECORDS = 1 << 32, ("/hyper_parameters/", "/datamodule_hyper_parameters/")
# Checked by template.restore against the registry and the network, and changed by the user's options: not compared.
OWN_CHECKS = {"state_dict", "hyper_parameters", "datamodule_hyper_parameters"}
# What training moves in an optimizer's groups and a schedule's state (steps, rates, a length re-planned to the run,
# ids, ReduceLROnPlateau's and warm restarts' counters, the momentum OneCycleLR and CyclicLR cycle): all else is held.
SETTINGS = re.compile(r"(param_groups\[\d+\]|^lr_schedulers\[\d+\])$")
MOVED = re.compile(r"param_groups\[\d+\]/(lr)$|^/lr_schedulers.*/(last_epoch|_step_count)$")  # bounded: check_resume
PROGRESS = {"params", "lr", "last_epoch", "_step_count", "_last_lr", "total_steps", "warmup_steps", "best", "T_i"}
PROGRESS |= {"num_bad_epochs", "cooldown_counter", "T_cur"}
# A schedule but warmup-cosine (re-planned) keeps what the run's length made of it (OneCycleLR's phases).
LENGTH_KEYS = re.compile(r"^lr_schedulers\[\d+\]\.(_schedule_phases|T_max|total_size|step_size_up|total_iters)")
LENGTH_HELD = (
    ", with the length of its run: a schedule other than warmup-cosine is planned once, so resume with the run's "
    "max_epochs, max_steps and batch size; to train longer, start a new run from its weights (--weights_file)"
)
# torch's optimizers' per-parameter states of the parameter's shape (Adam's moments, SGD's momentum, Adagrad's sum...).
LENGTHS = re.compile(r"^\[\d+\]/(T_i|T_0|T_max|T_mult|step_size|total_steps)$")  # of lr_schedulers[i]
SHAPED = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "exp_inf", "momentum_buffer", "square_avg", "grad_avg", "sum"}
SHAPED |= {"acc_delta", "ax", "prev", "step_size", "slow"}
SQUARES = {"exp_avg_sq", "max_exp_avg_sq", "exp_inf", "square_avg", "sum", "acc_delta"}  # never below 0 (rooted)
STEPS_COUNTED = ("optim_progress/optimizer/step/total/completed", "optim_step_progress/total/completed")
CYCLED, RATE = {"momentum", "betas"}, re.compile(r"lrs?(\[\d+\])?$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used as it is; the message says which file, which key and why."""


class UnsafeCheckpointError(CheckpointError):
    """The checkpoint asks for something that could run code: a pickled object or a class it may not name."""


class DamagedCheckpointError(CheckpointError):
    """The checkpoint's tensors differ from the digest written with them, or its layout is not a checkpoint's."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, whose save a kill can leave half done, written as ``replaced_atomically`` does;
    a failed write says why, the previous file intact; dead writers' files removed; a digest of the tensors."""

    def load_checkpoint(self, path: str | Path, map_location: Any | None = None, weights_only: bool | None = None):
        checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        if "://" not in str(path):
            verify_digest(checkpoint, str(path))
            check_checkpoint_states(checkpoint, path)
        return checkpoint

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: fsspec's own semantics
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        buffer = io.BytesIO()  # serialised first, as Lightning does: a failed write is then the file's, with its errno
        torch.save({**checkpoint, INTEGRITY_KEY: {"algorithm": "sha256", "tensors": tensor_digest(checkpoint)}}, buffer)
        remove_stale_temporaries(path.parent, ".*.ckpt.*.tmp")  # a dead writer's, of any checkpoint of the run
        try:
            with replaced_atomically(path) as temporary:
                temporary.write_bytes(buffer.getbuffer())
        except OSError as error:
            kept = f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written"
            full = error.errno in (errno.ENOSPC, errno.EDQUOT)
            reason = f"the disk is full ({path.parent})" if full else (error.strerror or str(error))
            raise OSError(error.errno, f"could not write checkpoint {path}: {reason}; {kept}") from error


def check_checkpoint_is_safe(path: str | Path) -> None:
    """Refuse a checkpoint that needs arbitrary pickled objects, without unpickling anything from it; and first, a
    file torch.save did not write (whose bytes the unpickler would misread as objects), named for what it is."""
    if (what := not_torch_saved(Path(path))) is not None:
        give = "the .ckpt of the run it came from (exported files are for deployment)"
        if what == "a directory":
            found = sorted(
                str(p) for where in ("", "checkpoints/", "*/checkpoints/") for p in Path(path).glob(f"{where}*.ckpt")
            )
            give = f"one of its checkpoints ({', '.join(found[:3])})" if found else "a .ckpt file"
        raise CheckpointError(
            f"{path} is not a Lightning checkpoint (.ckpt written by fit) nor any torch.save file: it is {what}; "
            f"give {give}, or --ckpt_path best / last: the latest run's"
        )
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


def not_torch_saved(path: Path) -> str | None:
    """What ``path`` is, if torch.save did not write it; None for a zip (its format) or a pickle (its legacy one)."""
    try:
        with open_regular(path) as file:
            head = file.read(9)
            entries = zipfile.ZipFile(file).infolist() if zipfile.is_zipfile(file) else []
    except NotARegularFile as error:
        return str(error).removeprefix(f"{path} is ")
    except OSError:  # unreadable: said by the reading itself
        return None
    if head[8:] == b"{":  # an 8-byte header length, then JSON
        return "a safetensors file"
    names = [entry.filename for entry in entries]
    if any(name.endswith("/constants.pkl") for name in names):
        return "a TorchScript archive"
    if any(entry.compress_type != zipfile.ZIP_STORED for entry in entries):  # a few bytes may inflate to gigabytes
        return "a zip archive of compressed entries (torch.save stores its entries as they are)"
    if names and not any(name.rpartition("/")[2] == "data.pkl" for name in names):
        return "a zip archive"
    return None if head.startswith((b"PK", b"\x80")) else "no file torch.save wrote"


# What a Lightning checkpoint holds at its top level, with the type each entry must have.
LAYOUT = {"pytorch-lightning_version": str, "epoch": int, "global_step": int}
LAYOUT |= dict.fromkeys(("optimizer_states", "lr_schedulers"), list)
LAYOUT |= dict.fromkeys(("state_dict", "hyper_parameters", "datamodule_hyper_parameters", "callbacks", "loops"), dict)
LAYOUT |= dict.fromkeys(("current_model_state", "averaging_state"), dict)  # WeightAveraging's (EMA)


def recipe_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a checkpoint of this template's module (its class names recorded), read memory-mapped."""
    checkpoint = load_checkpoint(path, tensors=False) if not_torch_saved(Path(path)) is None else None
    return isinstance(checkpoint, dict) and "class_names" in (checkpoint.get("hyper_parameters") or {})


def read_checkpoint(path: str | Path, tensors: bool = True) -> dict[str, Any]:
    """``load_checkpoint``, for a Lightning checkpoint only (what it names is ``template.restore``'s to read)."""
    checkpoint = load_checkpoint(path, tensors)
    if not isinstance(checkpoint, dict) or "pytorch-lightning_version" not in checkpoint:
        raise CheckpointError(
            f"{path} is not a Lightning checkpoint (no pytorch-lightning_version: a plain state_dict, or another "
            "tool's file). --ckpt_path takes the .ckpt files of a run; to start a run from these weights, give them "
            f"as --weights_file {path} (README: fine-tuning)."
        )
    return checkpoint


def load_checkpoint(path: str | Path, tensors: bool = True) -> Any:
    """A ``torch.save`` file on the CPU, with ``weights_only=True`` after the safety check; a Lightning checkpoint
    also after a check of its layout and, when its ``tensors`` are read (not only memory-mapped), of its digest."""
    check_checkpoint_is_safe(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=not tensors)
    except RuntimeError as error:
        if tensors or "mmap" not in str(error):
            raise DamagedCheckpointError(f"{path} is not a readable checkpoint: {error}") from None
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)  # legacy format: no mmap
    check_values(checkpoint, str(path))
    if not isinstance(checkpoint, dict) or "pytorch-lightning_version" not in checkpoint:
        return checkpoint
    for key, kind in LAYOUT.items():
        if key in checkpoint and not isinstance(checkpoint[key], kind):
            raise DamagedCheckpointError(
                f"{path} is malformed: its {key} is a {type(checkpoint[key]).__name__}, not a {kind.__name__}"
            )
    if "state_dict" not in checkpoint:
        raise DamagedCheckpointError(f"{path} is malformed: a Lightning checkpoint without a state_dict (no weights)")
    if not named_tensors(checkpoint["state_dict"]):
        raise DamagedCheckpointError(f"{path} is malformed: its state_dict holds more than named tensors")
    check_unwrapped(checkpoint["state_dict"], path)
    check_finite(checkpoint["state_dict"], path)
    check_averaging(checkpoint, path)
    if tensors:
        verify_digest(checkpoint, str(path))
    return checkpoint


def check_averaging(checkpoint: dict, path: str | Path) -> None:
    """Refuse WeightAveraging's (EMA's) states but as it saves them: the trained weights (``current_model_state``) of
    the average's (``state_dict``) tensors, and the AveragedModel's counters (``averaging_state``), each one number.
    Lightning loads the average from both, the counters' entries last: a ``module.`` one would replace a weight."""
    shapes = {key: value.shape for key, value in checkpoint["state_dict"].items()}
    if (current := checkpoint.get("current_model_state")) is not None:
        if not (named_tensors(current) and {key: value.shape for key, value in current.items()} == shapes):
            raise DamagedCheckpointError(
                f"refusing {path}: its current_model_state (weight averaging's trained weights) is not of the tensors "
                "of its state_dict: damaged or made up"
            )
        check_finite({f"current_model_state.{key}": value for key, value in current.items()}, path)
    if (counters := checkpoint.get("averaging_state")) is not None:
        if not named_tensors(counters) or any(
            key.startswith("module.") or v.numel() != 1 for key, v in counters.items()
        ):
            raise DamagedCheckpointError(
                f"refusing {path}: its averaging_state holds more than weight averaging's counters (one number each, "
                "none a module. weight, which would replace the average's): damaged or made up"
            )
        check_finite({f"averaging_state.{key}": value for key, value in counters.items()}, path)


def strip_prefixes(state_dict: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """Keep the keys under ``prefix`` (without it), minus wrapper prefixes (``module.``, ``_orig_mod.``)."""
    named = {unwrapped(key): value for key, value in state_dict.items()}  # one key a name: check_unwrapped
    return {key.removeprefix(prefix): value for key, value in named.items() if key.startswith(prefix)}


def unwrapped(key: str) -> str:
    """``key`` without DataParallel / DDP's leading ``module.``s and torch.compile's ``_orig_mod.``, wherever it sat."""
    return re.sub(r"^(module\.)*", "", key).replace("_orig_mod.", "")


def check_unwrapped(state_dict: dict, source: str | Path) -> None:
    """Refuse two keys of one name without wrapper prefixes: one would silently stand in for the other."""
    seen: dict[str, str] = {}
    for key in state_dict:
        if (name := unwrapped(key)) in seen:
            raise DamagedCheckpointError(
                f"refusing {source}: its {seen[name]!r} and {key!r} are both {name!r} without wrapper prefixes "
                "(module., _orig_mod.): which one the network's is, is not known; damaged or made up"
            )
        seen[name] = key


def match_keys(net: nn.Module, state_dict: dict) -> tuple[dict[str, torch.Tensor], list[str], list[str], list[str]]:
    """``state_dict`` keyed as ``net``'s (wrapper prefixes dropped, and a module's ``net.`` where that matches more of
    ``net``'s keys: a network may have a child called net); its missing, extra and other-shaped keys."""
    state_dict, expected = state_dict.get("state_dict", state_dict), net.state_dict()
    by_module, whole = strip_prefixes(state_dict, "net."), strip_prefixes(state_dict)
    common = [len(expected.keys() & keys.keys()) for keys in (by_module, whole)]
    stripped = by_module if by_module and common[0] >= common[1] else whole
    missing = sorted(set(expected) - set(stripped))
    unexpected = sorted(set(stripped) - set(expected))
    mismatched = sorted(k for k in set(stripped) & set(expected) if stripped[k].shape != expected[k].shape)
    return stripped, missing, unexpected, mismatched


def load_weights(net: nn.Module, source: str | Path | dict, strict: bool = True) -> None:
    """Load network weights from a Lightning checkpoint, a state_dict file or a state_dict, matched as
    ``match_keys`` does. With ``strict`` a key that does not match is an error naming it; without, a line."""
    state_dict = read_weights(source, weights_limit(net)) if isinstance(source, str | Path) else source
    stripped, missing, unexpected, mismatched = match_keys(net, state_dict)
    expected = net.state_dict()
    shapes = [f"{k} {tuple(stripped[k].shape)} vs {tuple(expected[k].shape)}" for k in mismatched]
    named = (("missing from the checkpoint", missing), ("not in the network", unexpected))
    named += (("different shapes (checkpoint vs network)", shapes),)
    report = [f"{what}: {', '.join(keys)}" for what, keys in named if keys]
    if report and strict:
        raise RuntimeError("weights do not match the network; " + "; ".join(report) + " (strict: false loads the rest)")
    for line in report:
        print(shown(f"not loaded, {line}", markup=False))  # key names from the file
    net.load_state_dict({k: v for k, v in stripped.items() if k not in mismatched}, strict=False)


def read_weights(path: str | Path, limit: int) -> dict[str, torch.Tensor]:
    """The finite tensors of a safetensors or ``torch.save`` file (``load_checkpoint``'s checks), read without running
    code; at most ``limit`` bytes of them, counted before any is read: a file of holes is refused, not allocated."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path}: {'not a regular file' if path.exists() else 'no such file'}")
    safe = (what := not_torch_saved(path)) == "a safetensors file"  # by its bytes: it may be called weights.bin
    if what is not None and not safe:
        raise DamagedCheckpointError(
            f"{path} is {what}, no weights file: save a state_dict with torch.save or safetensors"
        )
    if safe:
        declared = path.stat().st_size  # safetensors refuses tensors that do not cover the file exactly
    else:
        checkpoint = load_checkpoint(path, tensors=False)  # memory-mapped: nothing read yet
        state_dict = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
        if not (state_dict and named_tensors(state_dict)):
            raise DamagedCheckpointError(
                f"{path} holds no state_dict of named tensors: save one with torch.save(net.state_dict(), path), "
                "or safetensors.torch.save_file"
            )
        declared = sum(tensor.numel() * tensor.element_size() for tensor in state_dict.values())
    if declared > limit:
        raise DamagedCheckpointError(
            f"refusing {path}: its tensors take {declared / 2**20:,.0f} MiB, more than the network could take "
            f"({limit / 2**20:,.0f} MiB): the weights of another, larger network, or a damaged file"
        )
    if not safe and INTEGRITY_KEY in checkpoint:  # a checkpoint of this project's: its tensors as written
        verify_digest(checkpoint, str(path))
    if safe:
        try:
            state_dict = safetensors.torch.load_file(path)
        except (OSError, safetensors.SafetensorError) as error:
            raise DamagedCheckpointError(f"{path} is not a readable safetensors file: {error}") from None
    check_unwrapped(state_dict, path)
    check_finite(state_dict, path)
    return state_dict


def named_tensors(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())


def check_finite(state_dict: dict[str, torch.Tensor], source: str | Path) -> None:
    """Refuse non-finite floats, and complex tensors (a real weight takes their real part, NaN or not)."""
    if complex_ := [key for key, value in state_dict.items() if value.is_complex()]:
        raise DamagedCheckpointError(f"refusing {source}: its {complex_[0]} is complex, which no real weight takes")
    # float8 has no isfinite of its own: checked as float16, which holds every float8 value
    finite = lambda value: (value.half() if value.element_size() == 1 else value).isfinite().all()  # noqa: E731
    if broken := [key for key, value in state_dict.items() if value.is_floating_point() and not finite(value)]:
        raise DamagedCheckpointError(
            f"refusing {source}: its {broken[0]} holds NaN or infinite values ({len(broken)} of {len(state_dict)} "
            "tensors are not finite): a run that diverged, or a damaged file; use an earlier checkpoint"
        )


def network_bytes(net: nn.Module) -> int:
    """The bytes of ``net``'s parameters and buffers (on the meta device too: no memory needed)."""
    return sum(tensor.numel() * tensor.element_size() for tensor in net.state_dict().values())


def machine_memory() -> int:
    """This machine's physical memory, in bytes: half of it is the most a file from elsewhere may make us allocate."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def weights_limit(net: nn.Module) -> int:
    """How large a weights file for ``net`` may be: its own size, with room for another head and its states."""
    return 4 * network_bytes(net) + (64 << 20)


def check_values(value: Any, source: str) -> None:
    """Refuse what costs more than its bytes or breaks a reader: nesting past MAX_DEPTH, over MAX_TENSORS tensors, one
    claiming more values than the file stores (``expand``, sparse: gigabytes), an int no count, index or seed is."""
    lightning = isinstance(value, dict) and "pytorch-lightning_version" in value  # others' numbers unread
    claims, storages = [], {}  # the bytes of each tensor, and of each storage they are views of
    for key, item in _leaves(value, source):
        if isinstance(item, torch.Tensor):
            if len(claims) >= MAX_TENSORS:
                raise DamagedCheckpointError(f"refusing {source}: it holds more than {MAX_TENSORS:,} tensors")
            if item.device.type != "cpu":  # torch.load maps a GPU's to the CPU: the meta device's hold no values
                raise DamagedCheckpointError(f"refusing {source}: its tensor {spoken(key)} holds no values (meta)")
            stored = item.untyped_storage().nbytes() if item.layout == torch.strided else 0
            claims.append(item.numel() * item.element_size())
            if claims[-1] > stored:
                raise DamagedCheckpointError(
                    f"refusing {source}: its tensor {spoken(key) or 'at the top'} {tuple(item.shape)} claims more "
                    "values than the file stores for it (an expanded or sparse tensor); a checkpoint's tensors are dense"
                )
            if stored:  # a sparse tensor has no storage to ask of (refused above unless empty)
                storages[item.untyped_storage().data_ptr()] = stored
        elif lightning and type(item) is int and not (-MAX_COUNT if key.startswith(RECORDS) else 0) <= item < MAX_COUNT:
            low = "-2**32" if key.startswith(RECORDS) else "0"
            raise DamagedCheckpointError(
                f"refusing {source}: its {spoken(key)} is {item}, no count, index or seed (from {low}, below 2**32): "
                "damaged or made up; use another checkpoint"
            )
    # Views of one storage pass one by one, and each is hashed and checked in full: tied weights share a few times.
    if (claimed := sum(claims)) > MAX_VIEWS_SHARE * sum(storages.values()) + (64 << 20):
        raise DamagedCheckpointError(
            f"refusing {source}: its tensors are views of {sum(storages.values()):,} bytes that add up to {claimed:,} "
            f"bytes (over {MAX_VIEWS_SHARE} times): reading them would take time out of all proportion to the file"
        )


def load_pretrained(net: nn.Module, path: str | Path, head: str) -> str | None:
    """Start ``net`` from ``path``'s weights, but the classifier ``head``'s where absent or of another class count
    (then said, and returned). Other mismatches are another network's (resnet34's share resnet18's first 120
    tensors): an error naming them."""
    state_dict = read_weights(path, weights_limit(net))
    stripped, missing, unexpected, mismatched = match_keys(net, state_dict)
    expected = net.state_dict()
    in_common, found = set(stripped) & set(expected), []  # found: the mismatches that are not the classifier's
    shapes = {
        key: f"{key} {tuple(stripped[key].shape)} in the file, {tuple(expected[key].shape)} here" for key in mismatched
    }
    for what, keys in (("other shapes", mismatched), ("not in the network", unexpected), ("not in the file", missing)):
        if others := [shapes.get(key, key) for key in keys if not key.startswith(f"{head}.")]:
            found.append(f"{len(others)} {what} ({', '.join(others[:5])}{', ...' if len(others) > 5 else ''})")
    for key in mismatched:  # a convolution apart in its input channels alone: trained on images of other colours
        file, here = stripped[key].shape, expected[key].shape
        if len(file) == 4 == len(here) and (file[0], *file[2:]) == (here[0], *here[2:]):
            found.append(
                f"they take {file[1]}-channel images, this data has {here[1]} (an image folder's --data.channels)"
            )
            break
    if found or not in_common:
        raise ValueError(
            f"weights_file {path} is not of this network ({type(net).__name__}): "
            f"{'; '.join(found) or 'no tensor in common'}. "
            "Give the weights of the same architecture as model.net, or choose the network they belong to"
        )
    print(f"weights_file {path}: {len(in_common) - len(mismatched)} of {len(net.state_dict())} tensors loaded")
    load_weights(net, state_dict, strict=False)  # matched again as above: never stripped twice
    if mismatched or missing:
        print(new := f"new classifier ({head}): {net.get_submodule(head)}, for this data's class count")
        return new
    return None


def find_checkpoint(alias: str, runs_dir: str | Path, monitor: str | None = None, name: str | None = None) -> Path:
    """The best or last checkpoint of the run under ``runs_dir`` (under ``runs_dir/name`` where the command names its
    runs) whose ``last.ckpt`` or ``preempted.ckpt`` was written last (a `validate` run, writing none, never hides the
    run it evaluated); its last is the newer of the two. Its best is by ``monitor`` where the run kept bests by several
    metrics, else by the one it kept them by."""
    if alias not in CHECKPOINT_ALIASES:
        raise ValueError(f"unknown checkpoint alias {alias!r}; use one of {CHECKPOINT_ALIASES} or a path")
    runs_dir, now = Path(runs_dir), time.time()
    lasts, future = [], []
    # A run lies 1 to 4 folders down (runs/<name>/<version>, a sweep's trial, a cv's fold): no deeper tree is walked.
    first = f"{glob.escape(name)}/" if name else "*/"
    runs = [f"{first}{'*/' * depth}checkpoints/{kept}.ckpt" for depth in range(4) for kept in ("last", "preempted")]
    for path in (path for pattern in runs for path in runs_dir.glob(pattern)):
        with contextlib.suppress(OSError):  # gone since the glob
            if stat.S_ISREG((status := path.stat()).st_mode):  # a FIFO or device by that name is no run's
                (future if status.st_mtime > now + 60 else lasts).append((status.st_mtime, path))
    if future:  # a copy that kept its author's clock (tar does) must not pass for this machine's latest run
        rank_zero_warn(f"--ckpt_path {alias}: passing over {', '.join(str(p) for _, p in future)}, dated in the future")
    if not lasts:
        raise FileNotFoundError(
            f"--ckpt_path {alias}: no run with checkpoints/last.ckpt under {runs_dir.resolve().joinpath(name or '')}"
            + f" (this command's run name, from its --config, --data or logger name: {name})" * bool(name)
            + f"; train one with `{__package__} fit` first, or pass the path of a .ckpt file"
        )
    if alias == "last":
        return max(lasts)[1]
    # Any name checkpoint.filename gives (best-epoch003.ckpt, ep3-0.91.ckpt), but the latest states'.
    checkpoint_dir = max(lasts)[1].parent
    found = [*checkpoint_dir.glob("*.ckpt"), *checkpoint_dir.glob("*/*.ckpt")]  # a "/" in a metric's name: a folder
    kept = [path for path in found if path.is_file() and path.stem not in ("last", "preempted")]
    bests = [(*scored, path.stat().st_mtime, path) for path in kept if (scored := monitored_score(path)) is not None]
    by = {metric for metric, *_ in bests}
    if not bests:
        raise FileNotFoundError(
            f"--ckpt_path best: {checkpoint_dir} holds no best checkpoint (none records a monitored metric)"
        )
    if monitor not in by and len(by) > 1:  # a ModelCheckpoint of the user's beside the recipe's
        raise ValueError(
            f"--ckpt_path best: {checkpoint_dir} holds best checkpoints by {', '.join(sorted(map(printable, by)))}: "
            "give --checkpoint.monitor to say which, or the checkpoint's path"
        )
    chosen = monitor if monitor in by else next(iter(by))
    # The best monitored value (with save_top_k > 1 the newest file is not the best); ties: the newest.
    return max(best[1:] for best in bests if best[0] == chosen)[2]


def monitored_score(path: Path) -> tuple[str, float] | None:
    """The metric the ModelCheckpoint that saved ``path`` monitored, and its score there (higher is better): read
    from the state, of the file's ModelCheckpoints, whose kept files name it (a second one, a user's, keeps others)."""
    try:
        checkpoint = read_checkpoint(path, tensors=False)
    except CheckpointError as error:  # another best may be the run's: said, not fatal
        rank_zero_warn(f"--ckpt_path best: passing over {shown(error, markup=False)}")
        return None
    for name, state in checkpoint.get("callbacks", {}).items():  # a dict: the layout is checked
        if (
            str(name).startswith("ModelCheckpoint")
            and isinstance(state, dict)
            and isinstance(state.get("monitor"), str)
        ):
            kept = state.get("best_k_models") if isinstance(state.get("best_k_models"), dict) else {}
            own = [value for key, value in kept.items() if isinstance(key, str) and Path(key).name == path.name]
            score = torch.as_tensor(own[0]) if own and isinstance(own[0], torch.Tensor | float | int) else None
            if score is not None and score.numel() == 1 and score.isfinite():  # one number, never an expanded bomb
                return state["monitor"], float(score) * (-1.0 if "'mode': 'min'" in name else 1.0)
    return None


def _leaves(
    value: Any, source: str = "a checkpoint", key: str = "", depth: int = 0, seen: Iterator[int] | None = None
) -> Iterator[tuple[str, Any]]:
    """Each value in ``value`` that is no dict, list or tuple, with its key (``/loops/fit_loop``, ``[0]``); never more
    than MAX_VALUES of them: a file of a few bytes can hold a list that holds itself twice, 2**n values deep down."""
    seen = seen or itertools.count(1)
    if next(seen) > MAX_VALUES:
        raise DamagedCheckpointError(
            f"refusing {source}: it holds more than {MAX_VALUES:,} values, more than any training state has "
            "(a container shared many times over, or a damaged file)"
        )
    if depth > MAX_DEPTH:
        raise DamagedCheckpointError(
            f"refusing {source}: its {spoken(key)} lies over {MAX_DEPTH} levels deep, where no state does"
        )
    if isinstance(value, dict):
        for name, item in value.items():
            if key or name != INTEGRITY_KEY:
                yield from _leaves(item, source, f"{key}/{name}", depth + 1, seen)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _leaves(item, source, f"{key}[{index}]", depth + 1, seen)
    else:
        yield key, value


def spoken(key: str) -> str:
    return key.lstrip("/").replace("/", ".")


def tensor_digest(checkpoint: dict) -> str:
    """SHA-256 of every tensor in ``checkpoint``: name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    tensors = ((name, value) for name, value in _leaves(checkpoint) if isinstance(value, torch.Tensor))
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        if tensor.numel():  # the values' bytes in row-major order, whatever the dtype (bfloat16 has no numpy one)
            tensor = tensor.detach().cpu().to_dense().resolve_conj().resolve_neg()
            digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


def verify_digest(checkpoint: dict, source: str) -> None:
    """Refuse tensors that differ from the digest written with them (bit rot, a damaged copy, an edit)."""
    record = checkpoint.get(INTEGRITY_KEY)
    if record is None:
        rank_zero_info(f"{source} carries no digest of its tensors (not written by this project): not verified")
        return
    written = record.get("tensors") if isinstance(record, dict) and record.get("algorithm") == "sha256" else None
    if not isinstance(written, str):
        raise DamagedCheckpointError(f"{source}: its {INTEGRITY_KEY} record is malformed: {record!r}")
    if tensor_digest(checkpoint) != written:
        raise DamagedCheckpointError(
            f"{source} is damaged: its tensors differ from the digest written with them (bit rot, a truncated "
            "or altered copy). Use another checkpoint, such as last.ckpt or an earlier best-*.ckpt."
        )


def check_like(value: Any, like: Any, source: str, key: str = "", held: bool = False, free: set = PROGRESS) -> None:
    """Refuse a checkpoint's state (``value``) not of the kinds this run keeps (``like``, what it saves now, but
    OWN_CHECKS): a number where it keeps one (an int for a float), a tensor of its dtype, at least as many items (fewer
    leave some unrestored; more: later groups, an unfrozen backbone's; tensors: one per GPU), the same kind of anything
    else; where it keeps None, anything. Where ``held`` (optimizer groups, schedules): no key this run's lacks (torch
    makes each a schedule's attribute, ``get_lr`` too), and but for progress (``free``) the values its config built."""
    if isinstance(like, dict) and isinstance(value, dict):
        held = held or bool(SETTINGS.search(key))
        if held and (unknown := [name for name in value if name not in like]):
            raise DamagedCheckpointError(
                f"refusing {source}: its {key} holds {unknown[0]!r:.80}, a key this run's has not: saved by another "
                "program or made up; use another checkpoint"
            )
        for name in [name for name in value if name in like and (key or name not in OWN_CHECKS)]:
            inner = f"{key}.{name}" if key else str(name)
            check_like(value[name], like[name], source, inner, held and name not in free, free)
    elif isinstance(like, list | tuple) and isinstance(value, list | tuple):
        if len(value) < len(like) and not all(isinstance(item, torch.Tensor) for item in like):
            why = "saved by another program or damaged; use another checkpoint"
            if key.endswith(".params"):  # an optimizer group's parameters: which ones, the run's options decide
                why = "its run grouped or froze parameters otherwise (FreezeBackbone: configs/finetune.yaml); resume with "
                why += "the options it was trained with (--config its run's config.yaml, beside --ckpt_path)"
            raise DamagedCheckpointError(
                f"refusing {source}: its {key} holds {len(value)} items, where this run keeps {len(like)}: {why}"
            )
        for index, (item, model) in enumerate(zip(value, like)):
            check_like(item, model, source, f"{key}[{index}]", held, free)
    elif not (like is None or type(value) is type(like) or (type(like), type(value)) == (float, int)) or (
        isinstance(like, torch.Tensor) and value.dtype != like.dtype
    ):
        kind = f"tensor of {like.dtype}" if isinstance(like, torch.Tensor) else f"value of type {type(like).__name__}"
        raise DamagedCheckpointError(
            f"refusing {source}: its {key} is {value!r:.80}, where this run keeps a {kind}: saved by another program "
            "or damaged; use another checkpoint"
        )
    elif held and not (torch.equal(value, like) if isinstance(like, torch.Tensor) else value == like):
        raise DamagedCheckpointError(
            f"refusing {source}: its {key} is {value!r:.80}, where this run's recorded settings give {like!r:.80}: "
            "restored, it would train on with settings no record holds; use the run's own checkpoint"
            + (LENGTH_HELD if LENGTH_KEYS.search(key) else "")
        )


def check_resume(
    value: dict, like: dict, source: str, optional: set[str] = frozenset(), shapes: Sequence[Sequence] = ()
) -> None:
    """``check_like``; then a saved learning rate from 0 to the highest any of this run's schedules sets (OneCycleLR's
    and CyclicLR's max_lr, above their start; the others' base), schedule counts to the saved steps and epochs, those
    the loops' own count; each optimizer's per-parameter state as ``check_optimizer_state`` holds it (``shapes``: of
    each optimizer's parameters, in order)."""
    states = {name: like.get(name) for name in ("optimizer_states", "lr_schedulers")}
    cycled = any(name.endswith("/cycle_momentum") and on is True for name, on in _leaves(states))
    if missing := [key for key in like if key not in value and key not in OWN_CHECKS | optional]:  # would start over
        why = "saved with weights only (save_weights_only)" if "optimizer_states" in missing else "cut down"
        raise DamagedCheckpointError(
            f"refusing {source}: it holds no {', '.join(missing)}, which this run saves and a resume restores: {why}, "
            f"or saved by another program or class (a DataModule renamed since); to start a new run from its "
            f"weights: --weights_file {source}"
        )
    check_like(value, like, source, free=PROGRESS | CYCLED if cycled else PROGRESS)
    # Lightning restores its step from the loops, and writes it beside them: the bounds below take that one.
    counted = {v for k, v in _leaves(value.get("loops"), source) if k.endswith(STEPS_COUNTED)}
    if counted and value.get("global_step") not in counted:  # (no count: loops Lightning fails to restore)
        raise DamagedCheckpointError(
            f"refusing {source}: its global_step is {value.get('global_step')!r:.40}, where its loops count "
            f"{' or '.join(map(str, sorted(counted)))} optimizer steps: damaged or made up; use another checkpoint"
        )
    for index, (state, params) in enumerate(zip(value.get("optimizer_states") or (), shapes)):
        check_optimizer_state(state, params, f"optimizer_states[{index}]", source, value["global_step"])
    for name, length in _leaves(value.get("lr_schedulers"), source):  # periods a schedule divides by: 0 fails late
        if LENGTHS.search(name) and type(length) in (int, float) and not length >= 1:
            raise DamagedCheckpointError(
                f"refusing {source}: its lr_schedulers{spoken(name)} is {length!r}, where a schedule's length is at "
                "least 1: damaged or made up; use another checkpoint"
            )
    peak = max((v for k, v in _leaves(states) if RATE.search(k) and type(v) in (int, float)), default=float("inf"))
    for name, moved in _leaves({name: value.get(name) for name in states}):
        if (found := MOVED.search(name)) and type(moved) in (int, float):
            bound = peak * (1 + 1e-6) if found[1] else value.get("global_step", 0) + value.get("epoch", 0) + 2
            if not 0 <= moved <= bound:  # (a rate may round up in its last bit; a schedule steps once when built)
                raise DamagedCheckpointError(
                    f"refusing {source}: its {spoken(name)} is {moved!r}, where this run's schedules go from 0 to "
                    f"{bound:g}: damaged or made up; use another checkpoint"
                )


def check_optimizer_state(state: dict, shapes: Sequence, key: str, source: str, steps: int) -> None:
    """Each parameter's state as ``state_problem`` holds it. torch restores any tensor: a NaN moment showed only as NaN
    weights after the first step, another shape as a broadcasting error naming no file."""
    for name in ("optimizer", "lookahead"):  # Lookahead's: its inner optimizer's state, and its own (slow weights)
        if isinstance(state.get(name), dict):
            check_optimizer_state(state[name], shapes, f"{key}.{name}", source, steps)
    order = [index for group in state.get("param_groups") or () for index in group.get("params") or ()]
    shape_of = dict(zip(order, map(tuple, shapes)))  # as torch's load_state_dict pairs them: in order
    for index, per_parameter in (state.get("state") or {}).items():
        if index not in shape_of or not isinstance(per_parameter, dict):
            what = "no mapping of states" if index in shape_of else "no parameter's"
            raise DamagedCheckpointError(f"refusing {source}: its {key}.state holds {index!r:.40}, {what}")
        for name, item in per_parameter.items():
            if problem := state_problem(name, item, shape_of[index], steps):
                raise DamagedCheckpointError(
                    f"refusing {source}: its {key}.state[{index}].{name} is {problem}: damaged or made up; use "
                    "another checkpoint"
                )


def state_problem(name: Any, item: Any, shape: tuple, steps: int) -> str | None:
    """What is wrong with a parameter's optimizer state ``name``, if anything: a tensor not finite, one torch keeps of
    the parameter's shape (``SHAPED``) of another, a ``step`` past the run's ``steps``. Other optimizers' own kinds of
    state (lists, factors of other shapes: Adafactor's) are held by ``check_values`` alone."""
    number = isinstance(item, torch.Tensor | int | float) and not isinstance(item, bool)
    tensor = torch.as_tensor(item) if number else None
    if name == "step" and not (tensor is not None and tensor.numel() == 1 and 0 <= float(tensor) <= max(1, steps)):
        return f"{item!r:.40}, not a count of the run's {steps} optimizer steps"  # (Adagrad's: 0 for an unused one)
    if tensor is None:
        return f"{item!r:.40}, no tensor" if name in SHAPED and item is not None else None  # SGD's without momentum
    if tensor.is_floating_point() and not tensor.isfinite().all():
        return "not finite"
    if name in SQUARES and tensor.is_floating_point() and (tensor < 0).any():
        return "below 0, which its sums of squares never are (a step would take their square root: NaN)"
    return (
        f"of shape {tuple(tensor.shape)}, not its parameter's {shape}"
        if name in SHAPED and tensor.shape != shape
        else None
    )


@contextlib.contextmanager
def restoring(source: Any, what: str = "its state") -> Iterator[None]:
    """An error raised while ``what`` of checkpoint ``source`` is restored, as a CheckpointError naming the file."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as error:
        raise CheckpointError(
            f"refusing {source}: {what} could not be restored ({type(error).__name__}: {error})"
        ) from error


def check_checkpoint_states(checkpoint: dict, checkpoint_path: str | Path) -> None:
    """Keep, in ``checkpoint``'s ModelCheckpoint states, only paths of .ckpt files beside it in a run's checkpoints/
    (Lightning deletes the files they name once better ones replace them, checking only text: ``..``, links pass),
    and refuse NaN scores."""
    directory = Path(checkpoint_path).resolve().parent
    in_a_run = directory.name == "checkpoints" and (directory.parent / "config.yaml").is_file()

    def inside(path: Any) -> bool:  # (directory: not inside itself)
        resolved = Path(path).resolve() if in_a_run and isinstance(path, str | os.PathLike) else directory
        return resolved.parent == directory and resolved.suffix == ".ckpt" and resolved.is_file()

    for name, state in (checkpoint.get("callbacks") or {}).items():
        if not (isinstance(name, str) and name.startswith("ModelCheckpoint") and isinstance(state, dict)):
            continue
        dropped = []
        for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
            if state.get(key) and not inside(state[key]):
                dropped.append(f"{key}={state[key]!r}")
                state[key] = ""
        best_k = state.get("best_k_models")
        scores = [state.get(key) for key in ("best_model_score", "kth_value", "current_score")]
        scores += list(best_k.values()) if isinstance(best_k, dict) else []
        if any(isinstance(s, torch.Tensor) and (s.numel() != 1 or s.isnan()) or s != s for s in scores):  # NaN != NaN
            raise DamagedCheckpointError(
                f"refusing {checkpoint_path}: its {name.split('{')[0]} state holds a score that is NaN or not one "
                "number, which no later score beats (no new best would be saved): damaged or made up"
            )
        if isinstance(best_k, dict):
            dropped += [f"best_k_models[{path!r}]" for path in best_k if not inside(path)]
            state["best_k_models"] = {path: score for path, score in best_k.items() if inside(path)}
            check_kept_scores(state, name, checkpoint_path)
        # Only where it is news: a checkpoint copied out of its run (a download) is expected to point elsewhere.
        if dropped and in_a_run:
            rank_zero_warn(
                f"{checkpoint_path}: ignoring path(s) in its {name.split('{')[0]} state that do not resolve to a "
                f"checkpoint in {directory} (gone, or elsewhere): {', '.join(dropped)} (resuming, Lightning would "
                "replace and delete the files they name)"
            )


def check_kept_scores(state: dict, name: str, checkpoint_path: str | Path) -> None:
    """Refuse a ModelCheckpoint state that scores a kept file better than the file records of itself (a resumed best
    of 0.99 that scored 0.20: no better epoch saved, the summary's best a made-up one). A worse score is an older
    one's: a file name kept again (``filename: best``) is overwritten by a better epoch after the state was saved."""
    kept, sign = state["best_k_models"], -1.0 if "'mode': 'min'" in name else 1.0
    claims = [(path, score) for path, score in kept.items()]
    if (best := state.get("best_model_path")) in kept:
        claims.append((best, state.get("best_model_score")))
    for path, score in claims:
        if not isinstance(score, torch.Tensor | float | int):
            continue
        own = monitored_score(Path(path))  # (its monitor, its score, higher better), or None: records none
        if own is not None and own[0] == state.get("monitor") and float(score) * sign > own[1] + 1e-6 * abs(own[1]):
            raise DamagedCheckpointError(
                f"refusing {checkpoint_path}: its {name.split('{')[0]} state scores {Path(path).name} {float(score):.4g}"
                f", which that file records as {own[1] * sign:.4g}: damaged or made up"
            )


def check_hub_file(path: Path, url: str) -> Path:
    """``path``, refused if its contents do not match the hash prefix in its name (torch hub's convention,
    ``resnet18-f37072fd.pth``). It is then read as tensors only (``template.checkpoints.read_weights``)."""
    expected = torch.hub.HASH_REGEX.search(path.name)
    if expected is not None and not sha256_of(path).startswith(expected.group(1)):
        raise ValueError(
            f"refusing {path}: its contents do not match the hash {expected.group(1)} in its name (damaged, or "
            f"not the published file); replace it with {url}"
        )
    return path


def check_blob(path: Path, repo: str) -> Path:
    """``path`` in a Hugging Face cache, refused if it links to a blob whose name (the SHA-256 the hub names a large
    file by) its contents do not match: damaged, or not what was downloaded. A copy of no link goes unchecked."""
    blob = path.resolve()
    if blob.parent.name == "blobs" and re.fullmatch(r"[0-9a-f]{64}", blob.name) and sha256_of(blob) != blob.name:
        raise ValueError(
            f"refusing {path}: its contents do not match the SHA-256 its blob is named by ({blob.name[:12]}...): "
            f"damaged, or not the file the hub sent; fetch {repo} again (`hf download {repo}` on a machine online)"
        )
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open_regular(path) as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
