"""What a checkpoint carries is data from a stranger: check it before anything acts on it.

``weights_only=True`` stops pickled objects, but a checkpoint of plain strings still names
classes that LightningCLI and ``load_from_checkpoint`` import and instantiate (the network,
optimizer, scheduler and DataModule in its hyper-parameters), and files that Lightning's
``ModelCheckpoint`` deletes when a better model comes. Here each class path is checked before
it is imported, each path before it is used, and the tensors against the digest written with them.
"""

import collections.abc
import enum
import hashlib
import importlib
import inspect
import os
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path, PurePath
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

# Packages whose classes a checkpoint may name, besides modules the process has already imported.
# Extend it with the environment variable below (comma-separated module names), for a network or
# DataModule of your own that lives outside this package.
TRUSTED_MODULES = (__package__, "torch", "torchvision", "lightning", "torchmetrics")
TRUSTED_MODULES_VARIABLE = "CHECKPOINT_TRUSTED_MODULES"
# The one instantiator LightningCLI records (Lightning's own allow-list has the same single entry).
INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"
INTEGRITY_KEY = "integrity"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used as it is; the message says which file, which key and why."""


class UnsafeCheckpointError(CheckpointError):
    """The checkpoint asks for something that could run code: a pickled object or a class it may not name."""


class DamagedCheckpointError(CheckpointError):
    """The checkpoint's tensors differ from the digest written with them, or its layout is not a checkpoint's."""


def trusted_modules() -> tuple[str, ...]:
    listed = os.environ.get(TRUSTED_MODULES_VARIABLE, "")
    return TRUSTED_MODULES + tuple(name.strip() for name in listed.split(",") if name.strip())


def resolve_class(class_path: Any, key: str, kind: type, source: str) -> type:
    """The class ``class_path`` names, if it is a subclass of ``kind`` in an imported or trusted module.

    Nothing is imported from a module that is neither: importing runs its code.
    """

    def refuse(why: str) -> typing.NoReturn:
        raise UnsafeCheckpointError(
            f"refusing {source}: its {key} names {class_path!r}, {why}. Nothing was imported or run. If you trust "
            f"this checkpoint and the code it names, list the module in {TRUSTED_MODULES_VARIABLE} (comma-separated)."
        )

    if not isinstance(class_path, str) or not all(part.isidentifier() for part in class_path.split(".")):
        refuse("which is not a class path")
    module_name, _, name = class_path.rpartition(".")
    trusted = any(module_name == root or module_name.startswith(root + ".") for root in trusted_modules())
    if not module_name or (module_name not in sys.modules and not trusted):
        refuse(f"from module {module_name or class_path!r}, which is neither imported nor trusted")
    try:
        found = getattr(sys.modules.get(module_name) or importlib.import_module(module_name), name, None)
    except ImportError as error:
        refuse(f"whose module cannot be imported here ({error})")
    if not (isinstance(found, type) and issubclass(found, kind)):
        refuse(f"which is not a {kind.__module__}.{kind.__qualname__} subclass")
    return found


def _expected_kind(annotation: Any) -> tuple[bool, type]:
    """How jsonargparse treats a value typed ``annotation``: whether a string there is resolved as
    an import path, and the class such a path (or a nested ``class_path``) must then subclass.
    Where the annotation says nothing narrower, that is ``nn.Module``: never a function, and
    never an arbitrary class (``subprocess.Popen`` runs a command when instantiated)."""
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        verdicts = [_expected_kind(argument) for argument in arguments if argument is not type(None)]
        kinds = [kind for resolved, kind in verdicts if resolved and kind is not nn.Module]
        return any(resolved for resolved, _ in verdicts), kinds[0] if len(kinds) == 1 else nn.Module
    if origin in (collections.abc.Callable, type):
        target = arguments[-1] if origin is collections.abc.Callable and arguments else (arguments or [None])[0]
        return True, _expected_kind(target)[1] if target is not None else nn.Module
    if origin in (list, tuple, set, collections.abc.Sequence, collections.abc.Iterable):
        return _expected_kind(arguments[0]) if arguments else (False, nn.Module)
    if annotation in (collections.abc.Callable, typing.Callable, type):
        return True, nn.Module
    if (
        isinstance(annotation, type)
        and annotation.__module__ not in ("builtins", "typing", "inspect")
        and not issubclass(annotation, PurePath | enum.Enum)  # paths and enums are parsed as values
    ):
        return True, annotation  # jsonargparse takes a class path string for a class-typed argument
    return False, nn.Module


def _annotations(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation that does not resolve here: take what inspect gives
        return {name: p.annotation for name, p in inspect.signature(cls.__init__).parameters.items()}


def check_arguments(cls: type, arguments: Any, key: str, source: str) -> None:
    """Check every class path in the ``init_args`` of ``cls``, by the type of the argument it is given to."""
    if not isinstance(arguments, dict):
        return
    annotations = _annotations(cls)
    for name, value in arguments.items():
        resolves, kind = _expected_kind(annotations.get(name))
        check_value(value, f"{key}.{name}", kind, resolves, source)


def check_value(value: Any, key: str, kind: type, resolves_strings: bool, source: str) -> None:
    """Check a value of the checkpoint, anywhere: a ``class_path`` dict must name a ``kind``
    subclass (any argument of unknown type: an ``nn.Module``), and so must a string where
    jsonargparse would import it."""
    if isinstance(value, dict) and "class_path" in value:
        cls = resolve_class(value["class_path"], f"{key}.class_path", kind, source)
        for arguments in ("init_args", "dict_kwargs"):
            check_arguments(cls, value.get(arguments), f"{key}.{arguments}", source)
    elif isinstance(value, dict):
        for name, item in value.items():
            check_value(item, f"{key}.{name}", nn.Module, False, source)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_value(item, f"{key}[{index}]", kind, resolves_strings, source)
    elif isinstance(value, str) and resolves_strings and "." in value:
        resolve_class(value, key, kind, source)  # an import path, to jsonargparse


def check_hyperparameters(hparams: Any, key: str, kind: type, default: type | None, source: str) -> None:
    """Check the hyper-parameters Lightning saved for a LightningModule or LightningDataModule."""
    if hparams is None:
        return
    if not isinstance(hparams, dict):
        raise DamagedCheckpointError(f"{source}: {key} is a {type(hparams).__name__}, not a dictionary")
    hparams = dict(hparams)
    instantiator = hparams.pop("_instantiator", None)
    if instantiator is not None and instantiator != INSTANTIATOR:
        raise UnsafeCheckpointError(
            f"refusing {source}: its {key}._instantiator names {instantiator!r}; only {INSTANTIATOR} is "
            "accepted. Nothing was imported or run."
        )
    class_path = hparams.pop("_class_path", None)
    cls = resolve_class(class_path, f"{key}._class_path", kind, source) if class_path is not None else default
    if cls is None:
        for name, value in hparams.items():
            check_value(value, f"{key}.{name}", nn.Module, False, source)
    else:
        check_arguments(cls, hparams, key, source)


def check_class_paths(checkpoint: dict, source: str, model_class: type | None = None) -> None:
    """Refuse a checkpoint that names, anywhere in what Lightning rebuilds from it, a class of the
    wrong kind or from a module neither imported nor trusted."""
    check_hyperparameters(
        checkpoint.get("hyper_parameters"), "hyper_parameters", L.LightningModule, model_class, source
    )
    check_hyperparameters(
        checkpoint.get("datamodule_hyper_parameters"), "datamodule_hyper_parameters", L.LightningDataModule, None,
        source,
    )  # fmt: skip


def _tensors(value: Any, key: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield key, value
    elif isinstance(value, dict):
        for name, item in value.items():
            if not (key == "" and name == INTEGRITY_KEY):
                yield from _tensors(item, f"{key}/{name}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _tensors(item, f"{key}[{index}]")


def tensor_digest(checkpoint: dict) -> str:
    """SHA-256 of every tensor in ``checkpoint``: name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(_tensors(checkpoint), key=lambda item: item[0]):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        if tensor.layout == torch.strided and tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


def with_digest(checkpoint: dict) -> dict:
    """``checkpoint`` plus the digest of its tensors, for ``verify_digest`` when it is read back."""
    return {**checkpoint, INTEGRITY_KEY: {"algorithm": "sha256", "tensors": tensor_digest(checkpoint)}}


def verify_digest(checkpoint: dict, source: str) -> None:
    """Refuse tensors that differ from the digest written with them (bit rot, a damaged copy, an edit)."""
    record = checkpoint.get(INTEGRITY_KEY)
    if record is None:
        rank_zero_info(f"{source} carries no digest of its tensors (not written by this project): not verified")
        return
    if (
        not isinstance(record, dict)
        or record.get("algorithm") != "sha256"
        or not isinstance(record.get("tensors"), str)
    ):
        raise DamagedCheckpointError(f"{source}: its {INTEGRITY_KEY} record is malformed: {record!r}")
    if tensor_digest(checkpoint) != record["tensors"]:
        raise DamagedCheckpointError(
            f"{source} is damaged: its tensors differ from the digest written with them (bit rot, a truncated "
            "or altered copy). Use another checkpoint, such as last.ckpt or an earlier best-*.ckpt."
        )


MODEL_CHECKPOINT_PATHS = ("best_model_path", "kth_best_model_path", "last_model_path")


def drop_foreign_paths(checkpoint: dict, checkpoint_path: str | Path) -> None:
    """Keep, in the ModelCheckpoint states of ``checkpoint``, only the paths of .ckpt files that resolve
    inside the directory the checkpoint itself lies in.

    Lightning deletes the files these paths name when better ones replace them, and its own check
    that they lie inside the checkpoint directory compares text, which ``..`` and links get past.
    """
    directory = Path(checkpoint_path).resolve().parent

    def inside(path: Any) -> bool:
        if not isinstance(path, str | os.PathLike):
            return False
        resolved = Path(path).resolve()
        return resolved.parent == directory and resolved.suffix == ".ckpt"

    for name, state in (checkpoint.get("callbacks") or {}).items():
        if not (isinstance(name, str) and name.startswith("ModelCheckpoint") and isinstance(state, dict)):
            continue
        dropped = []
        for key in MODEL_CHECKPOINT_PATHS:
            if state.get(key) and not inside(state[key]):
                dropped.append(f"{key}={state[key]!r}")
                state[key] = ""
        best_k = state.get("best_k_models")
        if isinstance(best_k, dict):
            dropped += [f"best_k_models[{path!r}]" for path in best_k if not inside(path)]
            state["best_k_models"] = {path: score for path, score in best_k.items() if inside(path)}
        if dropped:
            rank_zero_warn(
                f"{checkpoint_path}: ignoring path(s) in its {name.split('{')[0]} state that lie outside "
                f"{directory}: {', '.join(dropped)}; Lightning would delete the files they name"
            )
