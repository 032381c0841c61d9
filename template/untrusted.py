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
import re
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path, PurePath
from typing import Any, NamedTuple

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


# A dotted path of names: what jsonargparse would import from a string value.
IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
# What a class_path dict may hold besides class_path (jsonargparse's own keys).
CLASS_PATH_KEYS = {"class_path", "init_args", "dict_kwargs", "__path__"}


class Expect(NamedTuple):
    """What jsonargparse makes of a value given to an argument, read from the argument's type."""

    imports_strings: bool  # a dotted string there is imported
    kind: type | tuple[type, ...]  # what a class it names (or a nested class_path) must subclass
    functions: bool  # a function may stand there (a Callable): accepted from a trusted module only


# An argument whose type cannot be read (missing, unresolvable, Any, passed on through **kwargs): every
# dotted string is checked as an import path, and what it names must be a network layer or a trusted
# function. Failing closed: jsonargparse may know the type where this cannot.
UNKNOWN = Expect(True, nn.Module, True)
PLAIN = Expect(False, nn.Module, False)


def refuse(source: str, key: str, value: Any, why: str) -> typing.NoReturn:
    raise UnsafeCheckpointError(
        f"refusing {source}: its {key} names {value!r}, {why}. No untrusted module was imported and nothing was "
        f"called. If you trust this checkpoint and the code it names, list the module in {TRUSTED_MODULES_VARIABLE} "
        "(comma-separated)."
    )


def resolve(path: Any, key: str, expect: Expect, source: str) -> Any:
    """The class (or, where a Callable is expected, trusted function) ``path`` names, if it is of the
    kind ``expect`` asks for and lies in a module already imported or trusted. Nothing is imported
    from a module that is neither: importing runs its code."""
    if not isinstance(path, str) or not IMPORT_PATH.match(path):
        refuse(source, key, path, "which is not a class path")
    if any(part.startswith("_") for part in path.split(".")):
        refuse(source, key, path, "a private or __main__ module or object")  # __main__ modules run on import
    module_name, _, name = path.rpartition(".")
    trusted = any(module_name == root or module_name.startswith(root + ".") for root in trusted_modules())
    if module_name not in sys.modules and not trusted:
        refuse(source, key, path, f"from module {module_name!r}, which is neither imported nor trusted")
    try:
        found = getattr(sys.modules.get(module_name) or importlib.import_module(module_name), name, None)
    except ImportError as error:
        refuse(source, key, path, f"whose module cannot be imported here ({error})")
    if isinstance(found, type) and issubclass(found, expect.kind):
        return found
    if expect.functions and trusted and (inspect.isfunction(found) or inspect.isbuiltin(found)):
        return found
    if trusted and inspect.isfunction(found) and issubclass_or_false(returns(found), expect.kind):
        return found  # a builder of what is expected (torchvision.models.resnet18 -> ResNet), as jsonargparse takes
    kinds = expect.kind if isinstance(expect.kind, tuple) else (expect.kind,)
    wanted = " or ".join(f"{kind.__module__}.{kind.__qualname__}" for kind in kinds)
    refuse(source, key, path, f"which is not a {wanted} subclass" + (" nor a trusted function" * expect.functions))


def returns(function: Any) -> Any:
    try:
        return typing.get_type_hints(function).get("return")
    except Exception:
        return None


def issubclass_or_false(cls: Any, kind: type | tuple[type, ...]) -> bool:
    return isinstance(cls, type) and issubclass(cls, kind)


def expect(annotation: Any) -> Expect:
    """How jsonargparse treats a value typed ``annotation`` (see ``Expect``)."""
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is inspect.Parameter.empty or annotation is typing.Any or isinstance(annotation, str):
        return UNKNOWN
    if origin is typing.Literal or annotation in (type(None), bool, int, float, str, bytes, complex):
        return PLAIN
    if origin in (typing.Union, types.UnionType):
        return merge([expect(argument) for argument in arguments if argument is not type(None)])
    if origin is type and typing.get_origin(arguments[0]) in (typing.Union, types.UnionType):  # type[A | B]
        return merge([expect(type[argument]) for argument in typing.get_args(arguments[0])])
    if origin is collections.abc.Callable or annotation in (collections.abc.Callable, typing.Callable):
        returned = arguments[-1] if arguments else None
        if typing.get_origin(returned) in (typing.Union, types.UnionType):  # builds one of several kinds
            kinds = tuple(
                kind for kind in typing.get_args(returned) if isinstance(kind, type) and kind is not type(None)
            )
            return Expect(True, kinds or nn.Module, True)
        return Expect(True, returned if isinstance(returned, type) and returned is not type(None) else nn.Module, True)
    if origin is type or annotation is type:
        return Expect(True, arguments[0] if arguments and isinstance(arguments[0], type) else nn.Module, False)
    if origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
        return expect(arguments[1]) if len(arguments) == 2 else UNKNOWN
    if origin in (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Iterable):
        return merge([expect(argument) for argument in arguments if argument is not Ellipsis]) if arguments else UNKNOWN
    if isinstance(annotation, type):
        if issubclass(annotation, PurePath | enum.Enum) or annotation.__module__ == "builtins":
            return PLAIN  # parsed as values
        return Expect(True, annotation, False)  # jsonargparse takes a class path string for a class-typed argument
    return UNKNOWN


def merge(verdicts: list[Expect]) -> Expect:
    """What a value of any of several types may be (a Union, or a tuple's elements)."""
    kinds = [
        kind for v in verdicts if v.imports_strings for kind in (v.kind if isinstance(v.kind, tuple) else (v.kind,))
    ]
    return Expect(
        any(v.imports_strings for v in verdicts),
        tuple(dict.fromkeys(kinds)) or nn.Module,
        any(v.functions for v in verdicts),
    )


def _parameters(cls: type) -> tuple[dict[str, Any], bool]:
    """The annotation of each argument of ``cls`` (unreadable ones as strings) and whether it takes **kwargs.
    A class whose ``__init__`` passes ``*args, **kwargs`` on (a LightningModule subclass, say) also takes
    its parents' arguments, with their types, as jsonargparse reads them."""
    targets = [c.__init__ for c in cls.__mro__ if "__init__" in vars(c)] if isinstance(cls, type) else [cls]
    annotations: dict[str, Any] = {}
    for target in targets:
        parameters = inspect.signature(target).parameters
        try:
            hints = typing.get_type_hints(target)
        except Exception:  # an annotation that does not resolve here: UNKNOWN, see expect()
            hints = {}
        for name, parameter in parameters.items():
            if parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                annotations.setdefault(name, hints.get(name, parameter.annotation))
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return annotations, False
    return annotations, True


def check_arguments(cls: type, arguments: Any, key: str, source: str) -> None:
    """Check the arguments of ``cls`` a checkpoint gives, each by the type of its parameter."""
    if not isinstance(arguments, dict):
        refuse(source, key, arguments, "where arguments by name belong")
    annotations, _ = _parameters(cls)
    for name, value in arguments.items():
        check_name(name, key, source)
        check_value(value, f"{key}.{name}", expect(annotations.get(name, inspect.Parameter.empty)), source)


def check_name(name: Any, key: str, source: str) -> None:
    if not isinstance(name, str) or "." in name:
        refuse(source, f"{key} key", name, "not a plain name (jsonargparse reads 'net.class_path' as a path)")


def check_value(value: Any, key: str, expected: Expect, source: str) -> None:
    """Check a value of the checkpoint, anywhere: a ``class_path`` dict, and a dotted string where
    jsonargparse would import it, must name what ``expected`` allows; containers are checked through."""
    if isinstance(value, dict) and "class_path" in value:
        for name in value:
            if name not in CLASS_PATH_KEYS:
                refuse(source, f"{key} key", name, "not one of " + ", ".join(sorted(CLASS_PATH_KEYS)))
        cls = resolve(value["class_path"], f"{key}.class_path", expected._replace(functions=False), source)
        for arguments in ("init_args", "dict_kwargs"):
            if arguments in value:
                check_arguments(cls, value[arguments], f"{key}.{arguments}", source)
    elif isinstance(value, dict):
        for name, item in value.items():
            check_name(name, key, source)
            check_value(item, f"{key}.{name}", expected, source)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_value(item, f"{key}[{index}]", expected, source)
    elif isinstance(value, str) and expected.imports_strings and IMPORT_PATH.match(value):
        resolve(value, key, expected, source)


def check_hyperparameters(hparams: Any, key: str, kind: type, default: type | None, source: str) -> None:
    """Check the hyper-parameters Lightning saved for a LightningModule or LightningDataModule."""
    if hparams is None:
        return
    if not isinstance(hparams, dict):
        raise DamagedCheckpointError(f"{source}: {key} is a {type(hparams).__name__}, not a dictionary")
    hparams = dict(hparams)
    instantiator = hparams.pop("_instantiator", None)
    if instantiator is not None and instantiator != INSTANTIATOR:
        refuse(source, f"{key}._instantiator", instantiator, f"where only {INSTANTIATOR} is accepted")
    class_path = hparams.pop("_class_path", None)
    if class_path is not None:
        default = resolve(class_path, f"{key}._class_path", Expect(True, kind, False), source)
    if default is None:
        check_value(hparams, key, UNKNOWN, source)
    else:
        check_arguments(default, hparams, key, source)


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


def check_config(config: Any, source: str, sections: dict[str, type]) -> None:
    """Refuse a run's config.yaml (as untrusted as the checkpoint beside it) that names, anywhere, a
    class of the wrong kind or from a module neither imported nor trusted. ``sections``: the class
    whose arguments each top-level key holds (``trainer``: ``Trainer``...); ``data`` names a
    LightningDataModule; any other key is checked failing closed."""
    if not isinstance(config, dict):
        raise DamagedCheckpointError(f"{source} is not a configuration: a {type(config).__name__}, not a mapping")
    for key, value in config.items():
        check_name(key, "config", source)
        if key == "data":
            check_value(value, key, Expect(True, L.LightningDataModule, False), source)
        elif key in sections and isinstance(value, dict) and "class_path" in value:  # model: any LightningModule
            check_value(value, key, Expect(True, L.LightningModule if key == "model" else sections[key], False), source)
        elif key in sections and isinstance(value, dict):
            check_arguments(sections[key], value, key, source)
        else:
            check_value(value, key, UNKNOWN, source)


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


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The values of ``tensor`` as raw bytes in row-major order, whatever its dtype (bfloat16 has no
    numpy one), device or layout."""
    tensor = tensor.detach().cpu()
    tensor = (tensor if tensor.layout == torch.strided else tensor.to_dense()).resolve_conj().resolve_neg()
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data


def tensor_digest(checkpoint: dict) -> str:
    """SHA-256 of every tensor in ``checkpoint``: name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(_tensors(checkpoint), key=lambda item: item[0]):
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        if tensor.numel():
            digest.update(tensor_bytes(tensor))
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
    inside the directory the checkpoint itself lies in, and only where that is a run's checkpoints/
    folder (beside the run's config.yaml); elsewhere (a download folder, say) drop them all.

    Lightning deletes the files these paths name when better ones replace them, and its own check
    that they lie inside the checkpoint directory compares text, which ``..`` and links get past.
    """
    directory = Path(checkpoint_path).resolve().parent
    in_a_run = directory.name == "checkpoints" and (directory.parent / "config.yaml").is_file()

    def inside(path: Any) -> bool:
        if not in_a_run or not isinstance(path, str | os.PathLike):
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
