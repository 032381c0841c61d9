"""What the user's own command line and --config files say, read before and after LightningCLI parses them:
which checkpoint it names, which options it gives, and its mistakes told in a line with the nearest option."""

import difflib
import inspect
import pkgutil
import re
from pathlib import Path

import yaml
from jsonargparse import Namespace

# Lines of a jsonargparse error that say where it looked, not what is wrong.
WHERE_IT_LOOKED = re.compile(r"^(- )?(Parser key|Problem with given class_path|Does not validate|Subtypes:|Errors:"
                             r"|Expected a <class 'NoneType'>|Given value)")  # fmt: skip
# The classes a recipe chooses, whose recipe values belong to it: a class switched from the command line
# starts from its own defaults plus what the user gives (the AdamW weight decay is not SGD's).
SWITCHABLE = ("optimizer", "lr_scheduler", "net")


def condense(message: str) -> str:
    """``message`` of a jsonargparse error as ``key: reason`` when it nests Union and class errors."""
    keys = re.findall(r'Parser key "([^"]+)"', message)
    reasons = [line for line in message.splitlines()[1:] if line.strip() and not WHERE_IT_LOOKED.match(line.strip())]
    if not keys or not reasons:
        return message
    deepest = max(reasons, key=lambda line: len(line) - len(line.lstrip()))
    reason = re.sub(r"^(- )?Type .*? expects .*?: ", "", deepest.strip()).removeprefix("- ")
    return f"{'.'.join(keys)}: {reason}"


def nearest_option(message: str, known: list[str]) -> str:
    """``message`` with, for each option it says is unrecognised, the closest valid one."""
    for given in re.findall(r"(--[\w.]+)", message.partition("nrecognized arguments")[2]):
        close = difflib.get_close_matches(given, known, n=1, cutoff=0.75)
        if close:
            message += f"\n{given}: no such option; did you mean {close[0]}?"
    return message


def names_checkpoint(args: list[str]) -> bool:
    """Whether a command names a checkpoint: ``--ckpt_path``, or ``ckpt_path`` in one of its --config files."""
    if any(token.split("=")[0] == "--ckpt_path" for token in args):
        return True
    return any("ckpt_path" in config for config in given_configs(args))


def given_configs(args: list[str], skip: Path | None = None) -> list[dict]:
    """The configurations the user's --config options give (files, or YAML text), ``skip`` left out."""
    configs = []
    for flag, value in zip(args, args[1:]):
        if flag != "--config" or (skip is not None and value == str(skip)):
            continue
        try:
            text = Path(value).read_text() if len(value) < 4096 and Path(value).is_file() else value
            loaded = yaml.safe_load(text)
        except (OSError, yaml.YAMLError):
            continue
        configs.append(loaded if isinstance(loaded, dict) else {})
    return configs


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


def given_arguments(args: list[str], name: str, recipe: Path) -> set[str]:
    """The arguments of ``model.<name>`` (``lr`` of the optimizer, say) that the user's options and --config
    files set, the recipe's defaults (``recipe``) not counted."""
    given = set()
    pattern = re.compile(rf"^--model(\.init_args)?\.{name}(\.init_args)?\.(\w+)")
    for token in args:
        if match := pattern.match(token):
            given.add(match.group(3))
    for flag, value in zip(args, args[1:]):
        if re.fullmatch(rf"--model(\.init_args)?\.{name}", flag.split("=")[0]) and value.lstrip().startswith("{"):
            given |= set((yaml.safe_load(value) or {}).get("init_args") or {})
    for config in given_configs(args, skip=recipe):
        model = config.get("model") or {}
        model = model.get("init_args", model) if isinstance(model, dict) else {}
        part = model.get(name) if isinstance(model, dict) else None
        if isinstance(part, dict):
            given |= set(part.get("init_args") or {})
    return given


def switched_to_own_defaults(config: Namespace, args: list[str], recipe: Path) -> None:
    """A recipe class switched for another (``--model.optimizer torch.optim.SGD``) keeps only the arguments the
    user gives; the recipe's values for the recipe's class fall back to the new class's own defaults."""
    recipe_model = ((yaml.safe_load(recipe.read_text()) or {}).get("model") or {}).get("init_args") or {}
    model = config.model.init_args
    for name in SWITCHABLE:
        chosen, default = model.get(name), recipe_model.get(name) or {}
        if not isinstance(chosen, Namespace) or chosen.class_path == default.get("class_path"):
            continue
        given, own = given_arguments(args, name, recipe), inspect.signature(pkgutil.resolve_name(chosen.class_path))
        for key, value in (default.get("init_args") or {}).items():
            if key not in given and key in (chosen.get("init_args") or {}) and chosen.init_args[key] == value:
                chosen.init_args[key] = own.parameters[key].default
