"""What the user's own command line and --config files say, read before and after LightningCLI parses them:
which checkpoint it names, which options it gives, and its mistakes told in a line with the nearest option."""

import difflib
import inspect
import itertools
import logging
import os
import pkgutil
import random
import re
import sys
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import Namespace, set_dumper
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.utilities import rank_zero_warn

from template.nets.shape import parameters, takes

# Commands besides fit / validate / test / predict, each a module with main(args).
EXTRA_COMMANDS = {
    name: f"{__package__}.tools.{name.replace('-', '_')}" for name in ("doctor", "lr-find", "export", "sweep", "cv")
}
# The recipe's defaults, written once: loaded before any --config file or option.
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"
SUBCOMMANDS = ("fit", "validate", "test", "predict")
EVALUATING = SUBCOMMANDS[1:]  # each scores trained weights: a checkpoint's, or a weights file's
RUN_NAME = re.compile(r"[A-Za-z0-9][\w.-]{0,99}")  # a run's folder: a plain name, never a path


class QuotingDumper(yaml.SafeDumper):
    """PyYAML's dumper, quoting the strings jsonargparse's loader reads as floats (a class named 1e3 or 1.5e3):
    written bare, config.yaml read back as --config held 1000.0 where a string was."""


QuotingDumper.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9_]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"),
)
set_dumper(
    "yaml",
    lambda data: yaml.dump(data, Dumper=QuotingDumper, default_flow_style=False, allow_unicode=True, sort_keys=False),
)

# Lines of a jsonargparse error that say where it looked, not what is wrong.
WHERE_IT_LOOKED = re.compile(r"^(- )?(Parser key|Problem with given class_path|Does not validate|Subtypes:|Errors:"
                             r"|Expected a <class 'NoneType'>|Given value)")  # fmt: skip
# An option the class a parse chose does not take (its parameters are the nearest; its kind's others may take it).
UNACCEPTED = re.compile(r"class_path '([\w.]+)':\s*\n\s*Option '(\w+)' is not accepted")
# The recipe's classes whose recipe values are theirs alone (the AdamW weight decay is not SGD's).
SWITCHABLE = ("optimizer", "lr_scheduler", "net")
# Metrics a checkpoint keeps at their lowest and highest, by name (val/loss, val_err; val/AUC, val/mIoU).
LOWER = re.compile(r"loss|(?<![a-z])err(or)?s?(?![a-z])", re.IGNORECASE)
HIGHER = re.compile(r"acc|f1|auc|precision|recall|iou|(?<![a-z])map(?![a-z])|dice|score", re.IGNORECASE)
OWN_MODES = {f"{split}/{name}": mode for split in ("train", "val") for name, mode in (("loss", "min"), ("acc", "max"))}


def condense(message: str) -> str:
    """A jsonargparse error's nested Union and class errors as ``key: reason``."""
    keys = re.findall(r'Parser key "([^"]+)"', message)
    reasons = [line for line in message.splitlines()[1:] if line.strip() and not WHERE_IT_LOOKED.match(line.strip())]
    if not keys or not reasons:
        return message
    deepest = max(reasons, key=lambda line: len(line) - len(line.lstrip()))
    reason = re.sub(r"^(- )?Type .*? expects .*?: ", "", deepest.strip()).removeprefix("- ")
    if reason.endswith(":"):  # a heading: the list under it is the reason (the forms a class's section may take)
        indent = deepest[: len(deepest) - len(deepest.lstrip())]
        listed = itertools.takewhile(lambda line: line.startswith(f"{indent}- "), reasons[reasons.index(deepest) + 1 :])
        reason += " " + "; ".join(line.strip().removeprefix("- ") for line in listed)
    if "Option 'class_path' is not accepted" in reason and "under init_args" not in reason:
        # class_path beside its arguments, all read as arguments (a nested error's message arrives here condensed)
        reason += ". A class's arguments go under init_args: {class_path: NAME, init_args: {ARGUMENT: VALUE}}"
    if "does not correspond to a subclass of ImageDataModule" in reason:  # a plain LightningDataModule
        reason += ": a DataModule here extends template.data.ImageDataModule (README: Swap the data)"
    return f"{'.'.join(keys)}: {reason}"


def nearest_option(message: str, known: list[str]) -> str:
    for given in re.findall(r"(--[\w.]+)", message.partition("nrecognized arguments")[2]):
        if close := difflib.get_close_matches(given, known, n=1, cutoff=0.75):
            message += f"\n{given}: no such option; did you mean {close[0]}?"
    return message


def taken_elsewhere(message: str) -> str:
    """``message`` where it refuses an option the chosen class does not take, with the nearest option it does
    take and the other classes of its kind that take it (``--data.root`` with the digits: the image folders')."""
    if not (found := UNACCEPTED.search(message)):
        return message
    chosen, option = loaded(found[1]), found[2]
    if not isinstance(chosen, type):
        return message
    own = list(parameters(chosen)[0])
    hints = [f"did you mean {close[0]!r}?"] if (close := difflib.get_close_matches(option, own, n=1)) else []
    union = re.search(r"Subtypes: \[(.*)\]", message)  # jsonargparse's, from the annotation: never a given value
    kinds = [loaded(name) for name in re.findall(r"<class '([\w.]+)'>", union[1] if union else "")]
    others = {cls for kind in kinds if isinstance(kind, type) for cls in subclasses(kind) if cls is not chosen}
    if takers := sorted(cls.__name__ for cls in others if not inspect.isabstract(cls) and takes(cls, option)):
        key = re.search(r'Parser key "([^"]+)"', message)
        hints.append(f"an option of {', '.join(takers)}: choose that class first (--{key[1] if key else 'class'} NAME)")
    return message[: found.end()] + "".join(f"; {hint}" for hint in hints) + message[found.end() :]


def loaded(name: str) -> object:
    """What ``name`` (module.attribute) stands for, if that module is imported already (the parse imported it)."""
    module, _, attribute = name.rpartition(".")
    return getattr(sys.modules.get(module), attribute, None)


def subclasses(cls: type) -> set[type]:
    return {cls}.union(*(subclasses(sub) for sub in cls.__subclasses__()))


def names_checkpoint(args: list[str]) -> bool:
    given = any(token.split("=")[0] == "--ckpt_path" for token in args)
    return given or any("ckpt_path" in config for config in given_configs(args))


def option_values(args: list[str], *flags: str) -> list[str]:
    """The values ``args`` give any of ``flags``, as ``--flag VALUE`` or ``--flag=VALUE``."""
    pairs = [tuple(token.split("=", 1)) for token in args if "=" in token]
    return [value for flag, value in [*zip(args, args[1:]), *pairs] if flag in flags]


def given_configs(args: list[str], skip: Path | None = None) -> list[dict]:
    """The configurations (files, or YAML text) that --config options give, ``skip`` left out."""
    configs = []
    for value in option_values(args, "--config"):
        if skip is not None and value == str(skip):
            continue
        try:  # a file, or YAML text (a checkpoint's record): text that cannot be a path is never asked as one
            named = len(value) < 4096 and not value.lstrip().startswith("{") and Path(value).is_file()
            loaded = yaml.safe_load(Path(value).read_text() if named else value)
        except (OSError, yaml.YAMLError):
            continue
        configs.append(loaded if isinstance(loaded, dict) else {})
    return configs


def warn_overridden(args: list[str]) -> None:
    """Warn of an option given before a --config that sets it again: read in order, the file's value is the one that
    runs (``--trainer.max_epochs 1 --config big.yaml`` trains for big.yaml's epochs)."""
    given, overridden = [], []
    for index, token in enumerate(args):
        name = token.split("=")[0]
        if name == "--config":
            configs = given_configs([token] if "=" in token else args[index : index + 2])
            overridden += [option for option in given if any(sets(each, option[2:].split(".")) for each in configs)]
        elif name.startswith("--") and not name.endswith("+"):
            given.append(name)
    if overridden:
        rank_zero_warn(
            f"{', '.join(dict.fromkeys(overridden))} given before a --config that sets it again: the file's value runs "
            "(options are read in order: give --config files first)"
        )


def sets(config: Any, keys: list[str]) -> bool:
    """Whether ``config`` (a --config's YAML) sets the option of ``keys``, through ``init_args`` or not."""
    for key in keys:
        if not isinstance(config, dict):
            return False
        config = config[key] if key in config else (config.get("init_args") or {}).get(key, sets)
        if config is sets:
            return False
    return not isinstance(config, dict) or "class_path" in config  # a class's arguments alone: not the class


def without_data_options(argv: list[str]) -> list[str]:
    kept, tokens = [], iter(argv)
    for token in tokens:
        if token.split("=")[0] != "--data" and not token.startswith("--data."):
            kept.append(token)
        elif "=" not in token:
            next(tokens, None)  # its value
    return kept


def given_arguments(args: list[str], name: str, configs: list[dict]) -> set[str]:
    """The arguments of ``model.<name>`` that options and the user's --config files (``configs``) set."""
    pattern = re.compile(rf"^--model(\.init_args)?\.{name}(\.init_args)?\.(\w+)")
    given = {match.group(3) for token in args if (match := pattern.match(token))}
    for value in option_values(args, f"--model.{name}", f"--model.init_args.{name}"):
        if value.lstrip().startswith("{"):
            given |= set((yaml.safe_load(value) or {}).get("init_args") or {})
    for config in configs:
        model = config.get("model") or {}
        model = model.get("init_args", model) if isinstance(model, dict) else {}
        part = model.get(name) if isinstance(model, dict) else None
        if isinstance(part, dict):
            given |= set(part.get("init_args") or {})
    return given


def switched_to_own_defaults(config: Namespace, args: list[str], recipe: Path) -> None:
    """A recipe class switched for another (``--model.optimizer torch.optim.SGD``) takes the arguments the user
    gives and its own defaults, not the recipe's values for the class it replaces; another checkpoint.monitor, the
    mode its name says, unless one is given."""
    recipe_config = yaml.safe_load(recipe.read_text()) or {}
    recipe_model = (recipe_config.get("model") or {}).get("init_args") or {}
    model, configs = config.model.init_args, given_configs(args, skip=recipe)
    for name in SWITCHABLE:
        chosen, default = model.get(name), recipe_model.get(name) or {}
        if not isinstance(chosen, Namespace) or chosen.class_path == default.get("class_path"):
            continue
        given, own = given_arguments(args, name, configs), inspect.signature(pkgutil.resolve_name(chosen.class_path))
        for key, value in (default.get("init_args") or {}).items():
            if key not in given and key in (chosen.get("init_args") or {}) and chosen.init_args[key] == value:
                chosen.init_args[key] = own.parameters[key].default
    # The recipe's mode is its monitor's (val/acc: max): another metric without a mode would keep the worst epoch.
    checkpoint, monitor = config.get("checkpoint"), (config.get("checkpoint") or {}).get("monitor")
    mode_given = any(token.split("=")[0] == "--checkpoint.mode" for token in args)
    mode_given |= any("mode" in (each.get("checkpoint") or {}) for each in configs)
    if monitor not in (None, (recipe_config.get("checkpoint") or {}).get("monitor")) and not mode_given:
        better = "min" if LOWER.search(monitor) else "max" if HIGHER.search(monitor) else None
        if better is None:
            raise ValueError(
                f"checkpoint.monitor={monitor}: is a higher or a lower value better? Say it: --checkpoint.mode max|min"
            )
        checkpoint.mode = better


def watchers(trainer: Any) -> list[tuple[str, str, Any, bool]]:
    """(class name, metric, mode, strict: a missing metric is an error) of each callback and schedule watching one."""
    found = [(type(each).__name__, each) for each in trainer.callbacks]
    found += [(type(config.scheduler).__name__, config) for config in trainer.lr_scheduler_configs]
    listed = []
    for name, each in found:
        if isinstance(monitor := getattr(each, "monitor", None), str):
            mode = getattr(getattr(each, "scheduler", each), "mode", None)  # a plateau's: its scheduler's
            listed.append((name, monitor, mode, getattr(each, "strict", True) is not False))
    return listed


def check_modes(trainer: Any) -> None:
    """Refuse a watcher of the recipe's metrics kept the wrong way round (an EarlyStopping or ModelCheckpoint of
    val/acc in Lightning's default mode min stops or keeps at its worst; a ReduceLROnPlateau of it in torch's cuts
    the rate as it improves); warn of one whose metric's name says the other way (val_err, val/AUC: your own)."""
    for name, monitor, mode, _ in watchers(trainer):
        if mode not in ("min", "max"):
            continue
        lower, higher, said = bool(LOWER.search(monitor)), bool(HIGHER.search(monitor)), f"{name} watches {monitor}"
        if OWN_MODES.get(monitor, mode) != mode:
            better = OWN_MODES[monitor]
            raise ValueError(
                f"{said} with mode={mode}, which counts its worse values as better: set its mode to {better}"
            )
        if monitor not in OWN_MODES and lower != higher and mode != ("min" if lower else "max"):
            rank_zero_warn(f"{said} with mode={mode}, where its name says {'lower' if lower else 'higher'} is better")


def check_logged(trainer: Any, recipe: bool) -> None:
    """Refuse a watcher of a validation metric (``val...``) that the sanity check's validation did not log, a
    misspelt ``val/acc`` say: Lightning would stop the run there only after its first epoch (``strict: false``: never).
    Of a module other than the ``recipe``'s, whose own metrics may be logged after the sanity check alone, a metric
    but the recipe's: a warning."""
    logged = sorted(name for name in trainer.callback_metrics if name.startswith("val"))
    for name, monitor, _, strict in watchers(trainer) if logged else ():  # none: a module logging after the check
        if strict and monitor.startswith("val") and monitor not in logged:
            said = f"{name} watches {monitor}, which validation does not log; it logs {', '.join(logged)}"
            if monitor in OWN_MODES:  # the recipe logs its own in the sanity check: a subclass's hook lacks super()
                raise ValueError(
                    f"{said}; a module that overrides on_validation_epoch_end calls super() there: "
                    "ClassificationModule logs val/loss and val/acc in it"
                )
            if recipe:
                raise ValueError(said)
            rank_zero_warn(f"{said} in the sanity check: fine if your module logs it after that alone")


# Lightning's "💡 Tip" lines advertise its other products: not what a run reports.
logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
    lambda record: not record.getMessage().startswith("💡 Tip")
)
# Set to 1 for the full traceback of an error, and jsonargparse's full text of a parse error.
TRACEBACK_VARIABLE = "TRACEBACK"


def wants_traceback() -> bool:
    return os.environ.get(TRACEBACK_VARIABLE, "") not in ("", "0")


class ConciseArgumentParser(LightningArgumentParser):
    """Lightning's parser, whose errors say the option and the innermost reason, not jsonargparse's tree of every
    Union member tried (TRACEBACK=1 shows it) nor a usage listing of every option (``--help`` has it)."""

    def add_function_arguments(self, function, *args, linked_targets=None, **kwargs):
        # jsonargparse passes linked_targets, which it does not take, for a network built by a function.
        return super().add_function_arguments(function, *args, **kwargs)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})  # --trainer.max_epoch is not max_epochs

    def error(self, message: str, ex: Exception | None = None):
        if not wants_traceback():
            message = nearest_option(
                condense(taken_elsewhere(message)), [o for a in self._actions for o in a.option_strings]
            )
        super().error(message, ex)

    def print_usage(self, file=None) -> None:
        (file or sys.stdout).write(f"usage: {self.prog.replace(' [options]', '')} [options]\n")


def with_default_config(argv: list[str], run: bool) -> list[str]:
    """``argv`` with ``--config DEFAULT_CONFIG`` first after the subcommand (at the start, for cli(run=False))."""
    if not DEFAULT_CONFIG.is_file():
        raise FileNotFoundError(
            f"{DEFAULT_CONFIG} is missing: the recipe's defaults; run from a clone installed with pip install -e ."
        )
    at = next((index + 1 for index, token in enumerate(argv) if token in SUBCOMMANDS), None) if run else 0
    return argv if at is None else [*argv[:at], "--config", str(DEFAULT_CONFIG), *argv[at:]]


def recipe_run_name() -> tuple[str | None, str | None]:
    """The run name (runs/<name>/version_N) the recipe's defaults give, and the DataModule it names the runs of."""
    recipe = yaml.safe_load(DEFAULT_CONFIG.read_text())
    logger = (recipe.get("trainer") or {}).get("logger") or {}
    return (logger.get("init_args") or {}).get("name"), (recipe.get("data") or {}).get("class_path")


def data_run_name(class_path: str) -> str:
    """A run name for a DataModule's runs: ImageFolderDataModule's are imagefolder, MyPhotos' myphotos."""
    name = class_path.rpartition(".")[2].removesuffix("DataModule").lower()
    return name if RUN_NAME.fullmatch(name) else "data"


def trained_run_name(ckpt_path: Path) -> str | None:
    """The run a checkpoint was trained in (runs/<name>/<version>/checkpoints/), else its file name."""
    path = ckpt_path.resolve()
    name = path.parents[2].name if path.parent.name == "checkpoints" and len(path.parents) > 2 else path.stem
    return name if RUN_NAME.fullmatch(name) else None


def with_record(args: list[str], subcommand: str, record: str) -> list[str]:
    """``args`` with a checkpoint's record (YAML) as the first --config after the recipe's defaults."""
    at = args.index(subcommand) + 1
    at += 2 if args[at : at + 2] == ["--config", str(DEFAULT_CONFIG)] else 0
    return [*args[:at], "--config", record, *args[at:]]


def draw_seed(config: Namespace, restored: Any = None) -> None:
    """``seed_everything: true``: a seed drawn at random, as its help says (Lightning's is 0); a resumed fit's, the seed
    its run drew (its order of images goes on); where a launcher set one (``PL_GLOBAL_SEED``), that one."""
    if config.get("seed_everything") is not True or "PL_GLOBAL_SEED" in os.environ:
        return
    recorded = restored.config.get("seed_everything") if restored is not None and restored.command == "fit" else None
    if type(recorded) is int:
        config.seed_everything = recorded
    elif int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or 1) > 1:  # torchrun's, srun's ranks
        raise ValueError(
            "seed_everything: true, in one of several processes started apart (torchrun, srun): each would draw its "
            "own seed and train on another order of the images; give a number (--seed_everything 1234)"
        )
    else:
        config.seed_everything = random.SystemRandom().randrange(2**32)


def settle_trainer(trainer: Namespace, last: Namespace | None = None, best: Namespace | None = None) -> None:
    """No progress bar callback when it is off, SyncBatchNorm only on CUDA, cuDNN autotuning unless deterministic;
    the ``last`` checkpoint saved at each epoch's end where validation may not end an epoch (else at each
    validation's end: Lightning's choice, which left the steps after the last validation in no file); with
    ``enable_checkpointing`` off, the recipe's two checkpoints (``best`` and ``last``) keep no file."""
    if trainer.enable_checkpointing is False and last is not None and best is not None:  # (Lightning refuses them)
        if any("ModelCheckpoint" in str(callback.get("class_path")) for callback in trainer.callbacks or []):
            raise ValueError(
                "trainer.enable_checkpointing is false, and trainer.callbacks holds a ModelCheckpoint: drop one"
            )
        trainer.enable_checkpointing, last.save_top_k, best.save_top_k = True, 0, 0
    interval = trainer.val_check_interval
    validated = trainer.check_val_every_n_epoch == 1 and type(interval) is float and interval == 1.0
    if last is not None and last.get("save_on_train_epoch_end") is None and not validated:
        last.save_on_train_epoch_end = True
    if type(trainer.accumulate_grad_batches) is int and trainer.accumulate_grad_batches < 1:  # Lightning divides by it
        raise ValueError(
            f"trainer.accumulate_grad_batches={trainer.accumulate_grad_batches}: at least 1 (no accumulation)"
        )
    if trainer.callbacks and trainer.enable_progress_bar is False:
        trainer.callbacks = [c for c in trainer.callbacks if "ProgressBar" not in c.class_path]
    if trainer.sync_batchnorm and not (torch.cuda.is_available() and trainer.accelerator in ("auto", "gpu", "cuda")):
        rank_zero_warn("sync_batchnorm needs CUDA devices; this run keeps BatchNorm statistics per process")
        trainer.sync_batchnorm = False
    if trainer.deterministic or trainer.benchmark is None:
        trainer.benchmark = not trainer.deterministic


def print_config(parser, config: Namespace, subcommand: str | None) -> None:
    """``--print_config``: the configuration a command runs with, a checkpoint's record and our changes made."""
    dumped = yaml.safe_load(parser.dump(config, skip_check=True, skip_none=False))
    print(yaml.dump(dumped.get(subcommand, dumped), Dumper=QuotingDumper, sort_keys=False), end="")
    raise SystemExit(0)
