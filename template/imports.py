"""Your modules where you run, and no others: ``--model my_module.F1Module`` finds ``./my_module.py``, but a library's
optional import (``tabulate``) never finds one in a stranger's folder, even one a path names (``tabulate.ckpt``)."""

import contextlib
import importlib.abc
import importlib.machinery
import inspect
import os
import re
import sys
from pathlib import Path

from template.files import read_at_most

CONFIG_FILE = re.compile(r"[^\s'\"=,:\[\]{}]+\.(?:ya?ml|json)\b")  # a file a --config option or a config names
DOTTED = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\.[A-Za-z_]")  # my_module.F1Module: its first name
MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH = 1 << 20, 4
# Where a class path is imported: by jsonargparse, parsing one; in restore.py, one a checkpoint is named again with.
CLASS_IMPORTS = {("jsonargparse", "import_object"), ("template", "lookup"), ("template", "named")}


def named_modules(args: list[str]) -> set[str]:
    """The first names of dotted names in ``args`` and the config files they name (nested): modules a command names."""
    texts, read = [(Path(), text) for text in args], set()  # (the folder a text's file names are relative to, text)
    for _ in range(MAX_CONFIG_DEPTH):  # relative to that folder, or to where you run
        named = {base / file for where, text in texts for file in CONFIG_FILE.findall(text) for base in (where, Path())}
        texts = []
        for file in named - read:
            read.add(file)
            with contextlib.suppress(OSError, ValueError):  # none, no regular file, or too large: jsonargparse says
                texts.append((file.parent, read_at_most(file, MAX_CONFIG_BYTES).decode(errors="replace")))
        args = [*args, *(text for _, text in texts)]
    return {name for text in args for name in DOTTED.findall(text)}


class OwnModules(importlib.abc.MetaPathFinder):
    """Finds, after every other finder, a top-level module in ``folder`` that a command names as a class's (``--model``,
    ``class_path``), or that one so found imports (``my_helpers``); never one a library asks for."""

    def __init__(self, folder: str, names: set[str]) -> None:
        self.folder, self.names, self.found = folder, names, set()

    def find_spec(self, name: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        module, function = importer(inspect.currentframe())
        as_a_class = name in self.names and (module, function) in CLASS_IMPORTS
        if path is not None or not (as_a_class or module in self.found):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, [self.folder])
        if spec is not None:
            self.found.add(name)
        return spec


def importer(frame) -> tuple[str, str]:
    """The module (its first name) and function asking for an import, past the import machinery (pkgutil's too)."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not (module.startswith(("importlib", "pkgutil")) or frame.f_code.co_filename.startswith("<frozen")):
            if module != __name__:
                return module.partition(".")[0], frame.f_code.co_name
        frame = frame.f_back
    return "", ""


def find_own_modules(args: list[str]) -> None:
    """The working directory's modules that ``args`` name become importable, after every installed one (once a
    process; ``template/__main__.py`` first takes off the import path the working directory ``python -m`` put there)."""
    if getattr(sys.flags, "safe_path", False):  # python -P: no module of the working directory at all
        return
    if not any(isinstance(finder, OwnModules) for finder in sys.meta_path):
        sys.meta_path.append(OwnModules(os.getcwd(), named_modules(args)))
