"""The one way in from a checkpoint and its run's record: read as data, never as a program.

Taken from a file: the module, network, optimizer, schedule and DataModule, each a registry name (this package's,
torchvision's builders, torch's optimizers and schedulers, classes a user registers or names in their own command line
or ``--config``) with literal arguments of their declared types; class names, input shape, preprocessing and tensors
(``weights_only``, checked against their digest). Anything else is refused in one line naming the file, key and value,
before anything is imported. Places, the Trainer, loggers and callbacks come from the user's options; a resumed fit
also takes its run's literal Trainer settings (``RESUMED``).
"""

import collections.abc
import contextlib
import enum
import functools
import inspect
import itertools
import json
import os
import pkgutil
import re
import stat
import sys
import types
import typing
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import Any

import lightning as L
import torch
import yaml
from jsonargparse import ArgumentParser, Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn
from torch import nn

from template.checkpoints import (
    CHECKPOINT_ALIASES,
    CheckpointError,
    DamagedCheckpointError,
    UnsafeCheckpointError,
    find_checkpoint,
    machine_memory,
    network_bytes,
    read_checkpoint,
    strip_prefixes,
)
from template.data.preprocessing import MAX_CHANNELS, MAX_PIXELS, recorded_preprocessing
from template.files import read_at_most, walk
from template.nets.shape import network_arguments, parameters, parameters_of, type_hints
from template.options import DEFAULT_CONFIG, given_configs, option_values, recipe_run_name
from template.runs import run_name_of, runs_dir
from template.text import MAX_CLASSES, names_problem, shown

# Where to read or write and what to start: the user's command says them (as any path-typed argument).
PLACES = ("root", "cache_dir", "predict_path", "download", "num_workers")
# Linked by the CLI from the data (compared, not set); how to run is the command's (compile generates and loads code).
LINKED, HOW_TO_RUN = ("num_classes", "class_names", "input_shape"), ("compile",)
MAX_RECORD, MAX_BATCH = 1 << 20, 1 << 30  # a record as a parse reads it whole; a batch's values (4 GiB of floats)
# A list the command parses again is checked item by item, a copy of it each time (jsonargparse): past this many class
# names, the data's own folders give them, checked against the checkpoint's names once built (fit_data).
MAX_PARSED_CLASSES = 2_000
RESUMED_TRAINING = ("optimizer", "lr_scheduler", "scheduler_interval", "layer_decay")  # restored, not rebuilt
# The Trainer settings a resumed fit takes from its run's config.yaml: they make it the same run.
RESUMED = ("max_epochs", "max_steps", "min_epochs", "min_steps", "precision", "accumulate_grad_batches",
           "gradient_clip_val", "gradient_clip_algorithm", "deterministic", "check_val_every_n_epoch",
           "val_check_interval", "limit_train_batches", "limit_val_batches")  # fmt: skip
# Of their numbers and the seed, the least each takes where it is not 0 (-1: no end), all below 2**32; of precisions,
# those the recipe trains in (its batches are float32: not 64-bit, nor transformer-engine's).
LEAST = {"max_epochs": -1, "max_steps": -1, "accumulate_grad_batches": 1, "check_val_every_n_epoch": 1}
PRECISIONS = (None, "32-true", "32", 32, "16-mixed", "bf16-mixed", "16-true", "bf16-true", "16", 16, "bf16")
NOT_CLASSIFIERS = (".detection", ".segmentation", ".video", ".optical_flow", ".quantization")
DATA_CLASS = ("--data", "--data.class_path")  # how a command line names the DataModule (left out of a first parse)
RUN_NAME_OPTIONS = ("--trainer.logger.init_args.name", "--trainer.logger.name")
# Arguments that load pretrained weights (weights, weights_backbone, pretrained=True): never from a file.
DOWNLOADS = re.compile(r"^(weights|pretrained)")
PATH_NAMES = re.compile(r"(^|_)(dir|dirpath|path|file|filename|root|url|uri)s?$")
# A DataModule's arguments that decide which images each split holds (split_seed, val_fraction, folds, fold; your
# own val_split or seed): validate and test of a checkpoint hold them to its run's, or they score images it trained on.
SPLIT_NAMES = re.compile(r"(^|_)(splits?|folds?|fractions?|seed)$")
# A network's literal sizes (widths, blocks, stems), bounded before even a meta-device build of it.
NETWORK_INT, NETWORK_LIST, MAX_NETWORK_TENSORS = 1 << 16, 1 << 10, 10_000
# YAML from elsewhere: no aliases (a "billion laughs" expands them), and caps on size and nesting.
MAX_YAML_BYTES, MAX_YAML_DEPTH = 1 << 20, 32
MAX_RUN_ENTRIES, MAX_RUN_DEPTH = 10_000, 16  # files and folders in a run directory a fit resumes into, and levels
# The files a resume writes into its run directory, checkpoints/'s too.
WRITTEN = {"config.yaml", "hparams.yaml", "metrics.csv", "env.json", "trackers.json"}
WRITTEN |= {"checkpoints/last.ckpt", "checkpoints/preempted.ckpt"}
KINDS = {"module": L.LightningModule, "data": L.LightningDataModule, "net": nn.Module,
         "optimizer": torch.optim.Optimizer,
         "scheduler": (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)}  # fmt: skip
# The option that names a class of each kind: where users name their own code again (every command takes them).
OWN_OPTIONS = {"module": "--model", "data": "--data", "net": "--model.net"}
OWN_OPTIONS |= {"optimizer": "--model.optimizer", "scheduler": "--model.lr_scheduler"}
# The kinds' base classes: abstract in all but name (forward, step or get_lr left to the classes that extend them).
BASES = (nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
SEQUENCES = (collections.abc.Sequence, collections.abc.Iterable, collections.abc.Collection)
_registered: dict[str, tuple[str, Any]] = {}  # name -> (kind, class or builder), added by register()
_built: dict[str, tuple[str, Any]] = {}


def register(obj: Any = None, *, kind: str | None = None, name: str | None = None) -> Any:
    """Let checkpoints name ``obj`` (a class, or a function that builds a network): ``@register`` on it, or
    ``register(MyNet)`` where it is defined. ``kind`` (net, module, data, optimizer or scheduler) is read from a
    class; a function builds a net unless told. ``name``: one more name, e.g. the old path of a moved class."""
    if obj is None:
        return lambda target: register(target, kind=kind, name=name)
    kind = kind or kind_of(obj) or "net"
    if kind not in KINDS:
        raise ValueError(f"register: kind={kind!r} is not one of {', '.join(KINDS)}")
    _registered.update({each: (kind, obj) for each in (name, f"{obj.__module__}.{obj.__qualname__}") if each})
    return obj


def registry() -> dict[str, tuple[str, Any]]:
    """Every name a checkpoint may use, with its kind and what it names."""
    if not _built:
        import torchvision.models  # noqa: F401  (its builders, into sys.modules)

        import template.data
        import template.nets
        import template.optim
        import template.schedule

        modules = [template.nets, template.data, template.schedule, template.optim, torch.optim]
        modules.append(torch.optim.lr_scheduler)
        # Not detection/segmentation builders (they load pretrained backbones by default), nor get_model (any, by name).
        modules += [m for name, m in list(sys.modules.items()) if re.match(r"torchvision\.models(\.[a-z]\w*)?$", name)]
        for module in (module for module in modules if not module.__name__.endswith(NOT_CLASSIFIERS)):
            for attribute, obj in vars(module).items():  # classes, and builders of networks (resnet18, timm_net)
                kind = kind_of(type_hints(obj).get("return") if inspect.isfunction(obj) else obj)
                usable = kind and obj not in BASES and not inspect.isabstract(obj)
                if usable and not attribute.startswith(("_", "get_model")):
                    entry = (kind, obj)
                    _built[f"{module.__name__}.{attribute}"] = _built[f"{obj.__module__}.{obj.__qualname__}"] = entry
    return {**_built, **_registered}


class Refused(UnsafeCheckpointError):
    """A file from elsewhere names something outside the registry, or a value of the wrong kind."""


def refuse(source: str, key: str, value: Any, why: str) -> typing.NoReturn:
    shown = repr(value)  # a file's value: it may be megabytes long
    shown = f"{shown[:200]}..." if len(shown) > 200 else shown
    raise Refused(f"refusing {source}: its {key} is {shown}, {why}; nothing from it was imported or run")


def lookup(name: Any, kind: str, key: str, source: str, own: set[str]) -> Any:
    """What registry ``name`` stands for, if it is of ``kind``; in ``own`` (the user's command names it), their code."""
    if not isinstance(name, str):
        refuse(source, key, name, f"not the name of a {kind}")
    found = registry().get(name)
    if found is None and name in own:  # the user's own code: imported as they asked, if it is of the kind
        obj = pkgutil.resolve_name(name)
        found = registry().get(name) or (kind if not isinstance(obj, type) or issubclass(obj, KINDS[kind]) else "", obj)
    if found is None:
        refuse(source, key, name, f"which is no {kind} registered by the modules this command imports; if it is "
               f"your own code, name it again: {OWN_OPTIONS[kind]} {name}")  # fmt: skip
    if found[0] != kind:
        refuse(source, key, name, f"a {found[0] or 'class of another kind'}, where a {kind} belongs")
    return found[1]


def class_paths(config: Any) -> set[str]:
    """Every class path a configuration names (the user's own, from their command line and --config files)."""
    found = {config["class_path"]} if isinstance(config, dict) and isinstance(config.get("class_path"), str) else set()
    values = config.values() if isinstance(config, dict) else config if isinstance(config, list | tuple) else ()
    return found.union(*(class_paths(value) for value in values))


def kind_of(annotation: Any) -> str | None:
    """The registry kind an argument of this type takes (a network, an optimizer...), or None."""
    for each in typing.get_args(annotation) or (annotation,):
        if typing.get_origin(each) is collections.abc.Callable:
            each = typing.get_args(each)[-1] if typing.get_args(each) else None
        members = [member for member in typing.get_args(each) or (each,) if isinstance(member, type)]
        if kinds := [kind for member in members for kind, base in KINDS.items() if issubclass(member, base)]:
            return kinds[0]
    return None


def within(annotation: Any, test: collections.abc.Callable[[Any], bool]) -> bool:
    """Whether ``annotation`` or a type it is made of (``X | None``, ``list[X]``, ``type[X]``) passes ``test``."""
    return test(annotation) or any(within(each, test) for each in typing.get_args(annotation))


def takes_class(annotation: Any) -> bool:
    """Whether an argument of this type is a class itself (``type[BasicBlock]``), not an instance."""
    return within(annotation, lambda each: typing.get_origin(each) is type)


def is_path(annotation: Any) -> bool:
    return within(annotation, lambda each: isinstance(each, type) and issubclass(each, PurePath | os.PathLike))


def conforms(value: Any, annotation: Any) -> bool:
    """Whether ``value`` is a literal of type ``annotation``: None, bool, int, float, str, a Literal's or an
    Enum's value, and lists, tuples and mappings of those; never anything a parser would read further."""
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is typing.Any:  # unknown: numbers, booleans and None only (a string could be a class path)
        return conforms(value, float | bool | list[typing.Any] | None)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, each) for each in arguments)
    if origin is typing.Literal:
        return any(value == each and type(value) is type(each) for each in arguments)
    if annotation in (None, type(None)):
        return value is None
    if annotation is float:
        return type(value) in (int, float)
    if annotation in (bool, int, str):
        return type(value) is annotation
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        prefix, _, member = value.rpartition(".") if type(value) is str else ("", "", "")
        return prefix in ("", annotation.__name__) and isinstance(getattr(annotation, member, None), annotation)
    if origin in (list, tuple, set, frozenset, *SEQUENCES) or annotation in (list, tuple):
        if type(value) not in (list, tuple):
            return False
        if origin is tuple and arguments and arguments[-1] is not Ellipsis:
            return len(value) == len(arguments) and all(conforms(v, a) for v, a in zip(value, arguments))
        return all(conforms(item, arguments[0] if arguments else typing.Any) for item in value)
    if origin in (dict, collections.abc.Mapping) or annotation is dict:
        item = arguments[1] if len(arguments) == 2 else typing.Any
        return type(value) is dict and all(type(k) is str and conforms(v, item) for k, v in value.items())
    return False


def component(value: Any, kind: str, key: str, source: str, own: set[str]) -> dict:
    """``{"class_path": a registry name, "init_args": its literal arguments}`` from a record's ``value``."""
    if not isinstance(value, dict) or set(value) - {"class_path", "init_args"}:
        refuse(source, key, value, f"not a {kind} as class_path and init_args")
    target = lookup(value.get("class_path"), kind, f"{key}.class_path", source, own)
    init_args = value.get("init_args") or {}
    if not isinstance(init_args, dict):
        refuse(source, f"{key}.init_args", init_args, "not a mapping of arguments")
    if kind == "net" and not bounded(init_args):
        refuse(source, f"{key}.init_args", init_args, f"with numbers above {NETWORK_INT} or lists over {NETWORK_LIST}")
    init_args = arguments(target, init_args, f"{key}.init_args", source, own)
    if parameters(target)[1]:  # **kwargs this reading cannot follow: the one the CLI will apply says what it takes
        takes(target, init_args, f"{key}.init_args", source)
    return {"class_path": value["class_path"], "init_args": init_args}


def takes(target: Any, init_args: dict, key: str, source: str) -> None:
    """Refuse ``init_args`` that jsonargparse would not pass to ``target`` (an unknown name, an int for a bool): the
    command's parse would blame the user's options for the file's."""
    parser = ArgumentParser(exit_on_error=False)
    try:
        (parser.add_class_arguments if isinstance(target, type) else parser.add_function_arguments)(target, "args")
    except Exception:  # a signature it cannot read: the command's own parse says what is wrong
        return
    try:
        parser.parse_object({"args": init_args})
    except Exception as error:
        refuse(source, key, init_args, f"which {target.__name__} does not take ({' '.join(str(error).split())})")


def bounded(value: Any) -> bool:
    """Whether a network's literal arguments stay within sizes a network of images has."""
    if isinstance(value, dict):
        return all(bounded(item) for item in value.values())
    if isinstance(value, list | tuple):
        return len(value) <= NETWORK_LIST and all(bounded(item) for item in value)
    return not (type(value) is int and abs(value) > NETWORK_INT)


def arguments(target: Any, given: dict, key: str, source: str, own: set[str], skip: tuple = ()) -> dict:
    """The arguments of ``target`` in ``given``, each checked against the type its parameter declares."""
    types_, more = parameters(target)
    kept, retired = {}, []
    for name, value in given.items():
        if not isinstance(name, str) or name.startswith("_") or name in skip:
            continue
        if name not in types_ and not more:
            retired.append(name)  # an option a template update removed, say: the rest still restores
            continue
        annotation = types_.get(name, typing.Any)
        # Never from a file: pretrained weights (the checkpoint holds every tensor of its own), places (the command's).
        if loads_weights(name, annotation) or is_path(annotation) or PATH_NAMES.search(name):
            continue
        if (kind := kind_of(annotation)) is not None and isinstance(value, dict):
            kept[name] = component(value, kind, f"{key}.{name}", source, own)
        elif kind is not None and isinstance(value, str) and takes_class(annotation):  # type[BasicBlock]: a name
            lookup(value, kind, f"{key}.{name}", source, own)
            kept[name] = value
        elif conforms(value, annotation):
            kept[name] = value
        else:
            refuse(source, f"{key}.{name}", value, f"which is not a literal {describe(annotation)}")
    if retired:
        rank_zero_warn(f"{source}: {', '.join(retired)} ({key}) are no longer options of {target.__name__}: left out")
    # Arguments that load pretrained weights, off where their defaults would load some (a backbone's, from the hub
    # cache, unpickled): the checkpoint holds every tensor of its own. Its parents' too, where its **kwargs reach.
    off: dict[str, Any] = {}
    for each in parameters_of(target, returned=False):
        value = False if each.default is True else None
        if loads_weights(each.name, each.annotation) and each.default not in (None, False, each.empty):
            if conforms(value, each.annotation):  # else a default of your own class's: weights_init="kaiming"
                off.setdefault(each.name, value)
    return kept | off


def loads_weights(name: str, annotation: Any) -> bool:
    """Whether an argument names pretrained weights: a torchvision WeightsEnum (each has a URL), or by its name a switch,
    a name or none (``pretrained: bool``, ``weights: str | None``); a number so named (``pretrained_dim: int``) is not."""
    named = DOWNLOADS.search(name) and any(conforms(value, annotation) for value in (None, True, ""))
    url = within(annotation, lambda each: isinstance(each, enum.EnumMeta) and any(hasattr(m, "url") for m in each))
    return url or bool(named)


def describe(annotation: Any) -> str:
    return "value" if annotation is typing.Any else str(annotation).replace("typing.", "")


@dataclass
class Restored:
    """What a checkpoint says, checked: ``config`` (registry names and literal values for the model, data and,
    resuming, Trainer) is overridden by the user's own options."""

    path: Path
    config: dict
    trained: dict  # num_classes, class_names and input_shape, as trained
    preprocessing: dict | None
    run_dir: Path | None  # the run directory the checkpoint lies in, when it is one under the user's runs
    command: str = ""  # the command it is read for (for_command): validate and test hold the splits to its run's


def restore(
    path: str | Path, model_class: type, runs_dir: str | Path, fit: bool, own: set[str] = frozenset()
) -> Restored:
    """Read checkpoint ``path`` (see the module's doc). ``model_class``: the LightningModule whose arguments the
    hyper-parameters are where they name none; ``runs_dir``: the user's; ``fit``: resuming."""
    source = str(path)
    checkpoint = read_checkpoint(path, tensors=False)  # no pickles, a checkpoint's layout; the digest when loaded
    hparams = dict(checkpoint.get("hyper_parameters") or {})
    config: dict[str, Any] = {}
    if hparams:
        key = "hyper_parameters._class_path"
        module = lookup(hparams["_class_path"], "module", key, source, own) if "_class_path" in hparams else model_class
        init_args = arguments(module, hparams, "hyper_parameters", source, own, skip=LINKED + HOW_TO_RUN)
        config["model"] = {"class_path": f"{module.__module__}.{module.__qualname__}", "init_args": init_args}
    data_hparams = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    if "_class_path" in data_hparams:
        key = "datamodule_hyper_parameters"
        data = lookup(data_hparams["_class_path"], "data", f"{key}._class_path", source, own)
        init_args = arguments(data, data_hparams, key, source, own, skip=PLACES)
        class_names = hparams.get("class_names")
        if "classes" in parameters(data)[0] and conforms(class_names, list[str]) and not init_args.get("classes"):
            init_args["classes"] = class_names  # a folder's classes in the trained order, with no folder to read
        if isinstance(classes := init_args.get("classes"), list):
            check_names(classes, f"{key}.classes", source)
            if len(classes) > MAX_PARSED_CLASSES:
                del init_args["classes"]
                why = f"over {MAX_PARSED_CLASSES:,}, they would be parsed for minutes"
                rank_zero_warn(f"{source}: its {len(classes):,} classes are not given as data.classes ({why})")
        config["data"] = {"class_path": data_hparams["_class_path"], "init_args": init_args}
    trained = {key: hparams.get(key) for key in LINKED}
    for key, kind in (("num_classes", int), ("class_names", list[str]), ("input_shape", list[int])):
        if trained[key] is not None and not conforms(trained[key], kind):
            refuse(source, f"hyper_parameters.{key}", trained[key], f"not a {describe(kind)}")
    shape, names = trained["input_shape"], trained["class_names"] or []
    values = shape[0] * shape[1] * shape[2] if shape is not None and len(shape) == 3 and min(shape) > 0 else 0
    # An image's, and an example batch of two is made of it: at most 512 MiB.
    if shape is not None and not (
        values and shape[0] <= MAX_CHANNELS and shape[1] * shape[2] <= MAX_PIXELS and values <= 4 * MAX_PIXELS
    ):
        refuse(source, "hyper_parameters.input_shape", shape, "not an image's (channels, height, width)")
    for key, size in (config.get("data") or {}).get("init_args", {}).items():  # a batch is made in memory at once
        if key in ("batch_size", "global_batch_size") and type(size) is int and size * max(values, 1) > MAX_BATCH:
            refuse(source, f"datamodule_hyper_parameters.{key}", size, f"a batch of over {MAX_BATCH:,} input values")
    if not 0 < (trained["num_classes"] or 1) <= MAX_CLASSES:
        refuse(source, "hyper_parameters.num_classes", trained["num_classes"], f"not 1 to {MAX_CLASSES:,}")
    check_names(names, "hyper_parameters.class_names", source, trained["num_classes"])
    if isinstance(net := config.get("model", {}).get("init_args", {}).get("net"), dict):
        check_network(net, checkpoint, source, trained)
    run_dir = own_run(path, runs_dir)
    if fit and run_dir is not None:
        config.update(resumed_settings(run_dir / "config.yaml", checkpoint))
    if (size := len(json.dumps(config))) > MAX_RECORD:  # the command parses it again, as YAML: time grows with size
        refuse(source, "record", f"{size:,} characters", f"over the {MAX_RECORD:,} a run's record takes")
    try:
        preprocessing = recorded_preprocessing(checkpoint)
    except ValueError as error:
        raise DamagedCheckpointError(f"{source}: {error}") from None
    return Restored(Path(path), config, trained, preprocessing, run_dir)


def check_names(names: list, key: str, source: str, count: int | None = None) -> None:
    """Refuse class names no classifier has (``names_problem``)."""
    if problem := names_problem(names, count):
        refuse(source, key, *problem)


def check_network(spec: dict, checkpoint: dict, source: str, trained: dict) -> None:
    """Refuse a record whose arguments (a width of 9000, 20000 blocks) build another network than the tensors': built
    as the command builds it (the ``trained`` classes and channels where it takes them), on the meta device (or the
    CPU) up to a few modules per tensor and twice its values, its shapes compared with them."""
    if trained["num_classes"] and trained["input_shape"]:
        sizes = spec["init_args"], trained["num_classes"], trained["input_shape"][0]
        spec = {**spec, "init_args": network_arguments(named(spec["class_path"])[1], *sizes)}
    if len(checkpoint["state_dict"]) > MAX_NETWORK_TENSORS:  # each costs time to build, even on the meta device
        refuse(source, "state_dict", f"{len(checkpoint['state_dict']):,} tensors", f"over {MAX_NETWORK_TENSORS:,}")
    tensors = checkpoint["state_dict"].values()
    limits = 4 * len(tensors) + 64, 2 * sum(tensor.numel() for tensor in tensors) + (1 << 20)
    for device in ("meta", "cpu"):  # on the CPU: a network that reads values as it is built (``.item()``)
        try:
            with torch.device(device), at_most(*limits, spec["class_path"], source):
                net = build(spec)
            break
        except Refused:
            raise
        except Exception as error:  # not even for real: nothing to hold its tensors to, so nothing the command builds
            if device == "cpu":
                why = f"which cannot be built from its arguments ({type(error).__name__}: {str(error)[:200]})"
                refuse(source, "hyper_parameters.net", spec["class_path"], why)
    needed, memory = network_bytes(net), machine_memory()
    if needed > memory // 2:
        why = f"a network of {needed / 2**30:,.1f} GiB, over half this machine's memory ({memory / 2**30:,.0f} GiB)"
        refuse(source, "hyper_parameters.net", spec["class_path"], why)
    expected, stored = described(net.state_dict()), described(strip_prefixes(checkpoint["state_dict"], "net."))
    if expected != stored:
        differ = sorted(key for key in set(expected) | set(stored) if expected.get(key) != stored.get(key))
        example = f"{differ[0]}: {stored.get(differ[0])} in the file, {expected.get(differ[0])} in the network"
        why = f"whose arguments do not describe the checkpoint's own tensors ({len(differ)} differ, e.g. {example})"
        refuse(source, "hyper_parameters.net", spec["class_path"], why)


def described(state_dict: dict[str, torch.Tensor]) -> dict[str, str]:
    """Each tensor's kind and shape (``float (10, 128)``): a float16 weight is a float's, an int64 or complex one not."""
    return {
        key: f"{'float' if tensor.is_floating_point() else str(tensor.dtype)[6:]} {tuple(tensor.shape)}"
        for key, tensor in state_dict.items()
    }


@contextlib.contextmanager
def at_most(modules: int, values: int, name: str, source: str) -> typing.Iterator[None]:
    """Stop a network's build once it registers more than ``modules`` modules and tensors, or ``values`` values."""
    seen = [0, 0]

    def count(module: nn.Module | None = None, attribute: str = "", value: Any = None) -> None:
        seen[0] += module is not None
        seen[1] += value.numel() if isinstance(value, torch.Tensor) else 0
        if seen[0] > modules or seen[1] > values:
            why = f"which builds over {modules:,} modules and tensors or {values:,} values, more than the file holds"
            refuse(source, "hyper_parameters.net", name, why)

    kinds = ("module", "parameter", "buffer")
    handles = [getattr(torch.nn.modules.module, f"register_module_{kind}_registration_hook")(count) for kind in kinds]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        count()  # refused still where the build caught the refusal (timm's raises its own error instead)


def named(class_path: str) -> tuple[str, Any]:
    """The kind and object a checked record's class path names: the registry's, or the user's own code's."""
    return registry().get(class_path) or ("", pkgutil.resolve_name(class_path))


def build(spec: dict) -> Any:
    """What a restored ``{"class_path", "init_args"}`` builds; of an optimizer or a schedule, a partial of it."""
    kind, target = named(spec["class_path"])
    init_args = dict(spec["init_args"])
    types_ = parameters(target)[0]
    for name, value in init_args.items():
        # A network's block, a Lookahead's inner optimizer: where the parameter takes one (component() checked it),
        # never a mapping of plain values that happens to hold a class_path key (timm_net's options).
        if isinstance(value, dict) and "class_path" in value and kind_of(types_.get(name)) is not None:
            init_args[name] = build(value)
        elif isinstance(value, str) and takes_class(types_.get(name)):  # type[BasicBlock]: the class named
            init_args[name] = registry().get(value, (None, None))[1] or pkgutil.resolve_name(value)
    return functools.partial(target, **init_args) if kind in ("optimizer", "scheduler") else target(**init_args)


def load_module(cls: type, path: str | Path, map_location: Any = None, strict: bool = True, **given: Any) -> Any:
    """``cls.load_from_checkpoint``: the module built from the registry with the checkpoint's literal
    arguments (``given`` ones override them: ``net=`` an instance, say), then its tensors loaded."""
    restored = restore(path, cls, None, fit=False, own={f"{cls.__module__}.{cls.__qualname__}"})
    given.pop("weights_only", None)  # always: nothing but tensors is ever unpickled here
    init_args = dict(restored.config.get("model", {}).get("init_args", {}))
    for key in ("net", "optimizer", "lr_scheduler"):
        if isinstance(init_args.get(key), dict) and key not in given:
            given[key] = build(init_args[key])
    module = cls(**{**init_args, **{k: v for k, v in restored.trained.items() if v is not None}, **given})
    module.hparams.update({k: v for k, v in init_args.items() if isinstance(v, dict)})
    checkpoint = read_checkpoint(path)  # now with its tensors, checked against their digest
    module.on_load_checkpoint(checkpoint)
    module.load_state_dict(checkpoint["state_dict"], strict=strict)
    return module.to(map_location) if isinstance(map_location, str | torch.device) else module


def for_command(ckpt_path: str, config: Namespace, model_class: type, subcommand: str, args: list[str]) -> Restored:
    """What ``--ckpt_path`` (a file, or ``best``/``last`` of the latest run under the user's runs directory) gives
    a command configured by ``config`` (the user's command line and --config files, whose classes it may name)."""
    if ckpt_path in CHECKPOINT_ALIASES:
        monitor = (config.get("checkpoint") or {}).get("monitor")  # the best by the command's metric
        # The latest run of the run name the command gives (a --config's, --data's class, or given), not another's:
        # an evaluation logs beside it, in a new version of that name.
        data = [value for value in option_values(args, *DATA_CLASS) if not Path(value).is_file()]  # not yet parsed
        name = run_name_of(config, data[-1] if data and re.fullmatch(r"[\w.]+", data[-1]) else None)
        named = name is not None and (name != recipe_run_name()[0] or option_values(args, *RUN_NAME_OPTIONS))
        alias, ckpt_path = ckpt_path, find_checkpoint(ckpt_path, runs_dir(config), monitor, name if named else None)
        rank_zero_only(print)(shown(f"--ckpt_path {alias} -> {ckpt_path}", markup=False))  # run names from the disk
    if not Path(ckpt_path).exists():  # a directory or another kind of file: named as what it is (checkpoints.py)
        raise FileNotFoundError(f"--ckpt_path {ckpt_path}: no such file")
    own = class_paths(config.as_dict()) | set(option_values(args, *DATA_CLASS))
    restored = replace(restore(ckpt_path, model_class, runs_dir(config), subcommand == "fit", own), command=subcommand)
    given = {token.split("=")[0].split(".")[1] for token in args if token.startswith("--trainer.")}
    configs = given_configs(args, skip=DEFAULT_CONFIG)
    given |= {key for each in configs if isinstance(each.get("trainer"), dict) for key in each["trainer"]}
    if taken := {name: value for name, value in restored.config.get("trainer", {}).items() if name not in given}:
        settings = ", ".join(f"{name}={value!r}" for name, value in taken.items())  # the run's, a stranger's too
        message = f"resuming with its config.yaml's trainer settings where no option is given: {settings}"
        rank_zero_only(print)(shown(message, markup=False))
    return restored


def named_again(config: dict) -> list[str]:
    """The options that name again the user's own classes in ``config``, which a checkpoint's command imports only
    where the user names them; read where each option's class stands, never resolved (a mapping may hold any)."""
    options = []
    for option in OWN_OPTIONS.values():
        node: Any = {"init_args": config}
        for part in option.removeprefix("--").split("."):
            node = (node.get("init_args") or {}).get(part) if isinstance(node, dict) else None
        name = node.get("class_path") if isinstance(node, dict) else None
        if isinstance(name, str) and (name := importable(name)) is not None:
            options += [option, name]
    return options


def places_again(config: dict) -> list[str]:
    """The options that say again where ``config``'s data is (a checkpoint records no place): its arguments named as
    places that hold one (``root``, your DataModule's ``path``), but for the cache's and the predicted images'."""
    given = (config.get("data") or {}).get("init_args") or {}
    places = {n: v for n, v in given.items() if PATH_NAMES.search(n) and n not in ("cache_dir", "predict_path")}
    return [arg for n, v in places.items() if isinstance(v, str | PurePath) for arg in (f"--data.{n}", str(v))]


def importable(name: str) -> str | None:
    """The import path that registers ``name`` again in a new process: none for the template's and torch's own
    classes, registered in every process; for your own, registered where your module is imported, the module's."""
    if (entry := registry().get(name)) is None:
        return name
    if (module := entry[1].__module__).partition(".")[0] in (__name__.partition(".")[0], "torch", "torchvision"):
        return None
    return name if module == "__main__" else f"{module}.{entry[1].__qualname__}"  # a script's: no other process has it


def check_restored_model(restored: Restored, model: dict, resuming: bool) -> None:
    """Refuse another network than the checkpoint's (its tensors load into the one it was trained as) and, to resume,
    optimizer or schedule settings other than its: the optimizer's state and the schedule it saved are restored over
    them, so they would never take effect while the run's record said they had."""
    saved, given = restored.config.get("model", {}).get("init_args", {}), model.get("init_args") or {}
    net, other = ((each.get("net") or {}).get("class_path") for each in (saved, given))
    named = [registry().get(name, (None, name))[1] for name in (net, other)]  # a class by either of its names
    if net and other and net != other and named[0] is not named[1]:
        raise ValueError(
            f"{restored.path} holds the weights of a {net}, not of the {other} that model.net names: leave --model.net "
            f"out (a checkpoint is evaluated and resumed as the network it was trained as); if {other} is that class "
            f"moved, register it under its old name: template.restore.register(..., name={net!r})"
        )
    if not resuming:
        return
    saved = {key: saved[key] for key in RESUMED_TRAINING if key in saved}  # a record without one: nothing to hold
    if changes := differences(saved, given, "model"):
        raise ValueError(
            f"{restored.path}: a resume continues the optimizer and schedule its checkpoint saved, so these settings "
            f"would not take effect: {'; '.join(changes)}. Leave them out to resume; to train on with them, start a "
            f"new run from its weights: --weights_file {restored.path} in place of --ckpt_path"
        )


def differences(saved: Any, given: Any, key: str, saved_in: str = "saved") -> list[str]:
    """Where ``given`` differs from ``saved``, by key: only keys both have (a newer torch's new argument is none)."""
    if isinstance(saved, dict) and isinstance(given, dict):
        return [c for n in saved if n in given for c in differences(saved[n], given[n], f"{key}.{n}", saved_in)]
    if isinstance(saved, list | tuple) and isinstance(given, list | tuple):
        saved, given = list(saved), list(given)
    return [] if saved == given else [f"{key} {saved!r} {saved_in}, {given!r} given"]


def fit_data(restored: Restored, data: Any) -> None:
    """Refuse data that contradicts what the checkpoint was trained on (it would answer a different question) and, to
    validate or test, splits drawn otherwise than its run's (``SPLIT_NAMES``); normalise as in training."""
    mismatches = []
    for key, what in (("input_shape", "inputs (channels, height, width)"), ("num_classes", "classes"),
                      ("class_names", "class names")):  # fmt: skip
        then, now = restored.trained.get(key), getattr(data, key, None)
        then, now = (list(v) if isinstance(v, list | tuple) else v for v in (then, now))
        if then is not None and now is not None and then != now:
            mismatches.append(f"{what}: trained on {then}, the data gives {now}")
    recorded, split = restored.config.get("data"), {"validate": "val", "test": "test"}.get(restored.command)
    needed = recorded and (mismatches or split)  # (named: the record's class, imported only where it is compared)
    ours = bool(needed) and named(recorded["class_path"])[1] is type(data)  # another DataModule: its own options
    if mismatches:
        given = differences(recorded["init_args"], data.hparams, "data", "recorded") if ours else []
        raise ValueError(
            f"{restored.path} does not fit this data; " + "; ".join(mismatches) + ". Leave out the data options "
            f"that change them (on the command line or in a --config file{': ' if given else ''}{'; '.join(given)})"
            f": {'a resume' if restored.command == 'fit' else 'evaluating a checkpoint'} starts from the data it "
            "was trained with."
        )
    if split and recorded:  # compared for its run's DataModule alone: another's options split other images
        saved = {name: value for name, value in recorded["init_args"].items() if SPLIT_NAMES.search(name)}
        if changes := differences(saved, data.hparams if ours else {}, "data", "in its run"):
            raise ValueError(
                f"{restored.path}: these data options draw other splits than its run's, so its {split} split may "
                f"hold images it trained on: {'; '.join(changes)}. Leave them out to score its run's held-out "
                "images; to score other images, use predict, or train a new run with them"
            )
    if restored.preprocessing is not None and hasattr(data, "use_preprocessing"):
        data.use_preprocessing(restored.preprocessing, source=str(restored.path))  # without its training images
    missing = {"DataModule": "data" not in restored.config, "preprocessing": restored.preprocessing is None}
    if missing := [what for what, gone in missing.items() if gone]:  # not written by fit: nothing to hold the data to
        rank_zero_warn(
            f"{restored.path} records no {' nor '.join(missing)}: used on the data and normalisation your options "
            "give, which nothing checks are the ones it trained on"
        )


def own_run(path: str | Path, runs_dir: str | Path | None) -> Path | None:
    """The run directory (<name>/<version>) under ``runs_dir`` that checkpoint ``path`` lies in, links resolved."""
    checkpoint = Path(path).resolve()
    run_dir = checkpoint.parent.parent
    in_a_run = runs_dir is not None and checkpoint.parent.name == "checkpoints" and (run_dir / "config.yaml").is_file()
    if not in_a_run or run_dir.parent.parent != Path(runs_dir).resolve():
        return None
    # What a run writes on into must be its own folders and files: a link would lead a write out of it (a hard link
    # too: a file with a second name elsewhere, which a write in place, Lightning's hparams.yaml, changes there), and
    # a FIFO or device by a name it opens would wait forever. More entries than a run makes is no run of this recipe.
    try:
        entries, deep = list(itertools.islice(walk(run_dir, MAX_RUN_DEPTH), MAX_RUN_ENTRIES + 1)), False
    except ValueError:
        entries, deep = [], True
    odd = [str(p) for p in entries if not own_entry(p) or p.relative_to(run_dir).as_posix() in WRITTEN and p.is_dir()]
    if odd or deep or len(entries) > MAX_RUN_ENTRIES:
        listed = ", ".join(odd[:3])
        why = f"links, special files or folders where it writes files ({listed})" if odd else ""
        why = why or f"over {MAX_RUN_ENTRIES:,} entries"
        why = f"folders nested over {MAX_RUN_DEPTH} deep" if deep else why
        rank_zero_warn(f"{run_dir} holds {why}: resumed into a new run directory")
        return None
    return run_dir


def own_entry(path: Path) -> bool:
    """Whether ``path`` is a folder, or a file of no other name (a hard link's, which a write in place changes too):
    not a symbolic link, FIFO, socket or device, nor gone since it was listed. One ``lstat``, never followed."""
    try:
        status = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(status.st_mode) or (stat.S_ISREG(status.st_mode) and status.st_nlink == 1)


def resumed_settings(path: Path, checkpoint: dict) -> dict:
    """The Trainer settings (``RESUMED``), best checkpoint's metric and seed a run's config.yaml records, as literals;
    the metric and mode one the ``checkpoint``'s ModelCheckpoints kept bests by."""
    config = read_yaml(path)
    config = config if isinstance(config, dict) else {}
    seed = config.get("seed_everything")
    settings: dict[str, Any] = {"seed_everything": seed} if type(seed) in (int, bool) else {}
    for key, cls, names in (("checkpoint", ModelCheckpoint, ("monitor", "mode")), ("trainer", L.Trainer, RESUMED)):
        if isinstance(section := config.get(key), dict):
            taken = {name: section[name] for name in names if name in section}
            settings[key] = arguments(cls, taken, key, str(path), set())
    watched = []  # (monitor, mode) of the checkpoint's ModelCheckpoints, as their state keys name them
    for name, state in (checkpoint.get("callbacks") or {}).items():
        if isinstance(state, dict) and (found := re.match(r"ModelCheckpoint\{.*'mode': '(min|max)'", str(name))):
            watched.append((state.get("monitor"), found[1]))
    # Its latest record's (a resume may have changed the monitor since this checkpoint), or the file's word: the
    # checkpoint's own, where they differ; the command's options override either.
    recorded = settings.get("checkpoint") or {}
    if watched and recorded and (recorded.get("monitor"), recorded.get("mode", "min")) not in watched:
        kept = [(metric, mode) for metric, mode in watched if isinstance(metric, str)]
        settings.pop("checkpoint")
        if len(kept) == 1:
            settings["checkpoint"] = {"monitor": kept[0][0], "mode": kept[0][1]}
        rank_zero_warn(
            f"{path} keeps bests by checkpoint.monitor {recorded.get('monitor')!r}, mode {recorded.get('mode')!r}; "
            f"the checkpoint resumed kept them by {', '.join(map(str, kept))}: resumed with its own (give "
            "--checkpoint.monitor and --checkpoint.mode to choose)"
        )
    given = {"seed_everything": seed, **{f"trainer.{name}": v for name, v in settings.get("trainer", {}).items()}}
    for key, value in given.items():
        least = LEAST.get(key.removeprefix("trainer."), 0)
        if type(value) in (int, float) and not least <= value < 2**32:
            refuse(str(path), key, value, f"outside the [{least}, 2**32) a run takes")
    if given.get("trainer.precision") not in PRECISIONS:
        refuse(str(path), "trainer.precision", given["trainer.precision"], "which the recipe does not train in")
    return settings


def read_yaml(path: str | Path) -> Any:
    """YAML from elsewhere as plain values: at most ``MAX_YAML_BYTES``, no aliases, nesting checked before it is built."""
    path = Path(path)
    try:
        text, depth = read_at_most(path, MAX_YAML_BYTES), 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise yaml.YAMLError(f"an alias (*{event.anchor}) at line {event.start_mark.line + 1} is refused")
            depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
            if depth > MAX_YAML_DEPTH:
                raise yaml.YAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels")
        return yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as error:  # ValueError: a date or a number Python cannot hold
        raise DamagedCheckpointError(f"refusing {path}: {str(error).splitlines()[0]}") from None


__all__ = ["CheckpointError", "Refused", "Restored", "read_yaml", "register", "registry", "restore"]
