"""The tools stand apart: no module of the training core imports template.tools."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import template
from template.cli import EXTRA_COMMANDS

REPO = Path(template.__file__).resolve().parents[1]

# Imports every module of the package but tools/ and __main__ (which runs the CLI), in a fresh
# interpreter, and prints the template.tools modules that came with them. Files, not pkgutil:
# walking the package would import template.tools itself.
IMPORT_THE_CORE = """
import importlib, pathlib, sys
import template
package = pathlib.Path(template.__file__).parent
for path in sorted(package.rglob("*.py")):
    parts = path.relative_to(package.parent).with_suffix("").parts
    if parts[1] not in ("tools", "__main__"):
        importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
print(sorted(name for name in sys.modules if name.startswith("template.tools")))
"""


def test_no_module_outside_tools_imports_them():
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_THE_CORE], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]", f"the training core imports {result.stdout.strip()}"


def test_every_extra_command_names_a_tool_with_main():
    for name, module in EXTRA_COMMANDS.items():
        assert module.startswith("template.tools."), name
        assert callable(importlib.import_module(module).main), module


def test_a_tool_is_found_by_its_file_s_name_and_an_unknown_command_lists_the_tools(capsys):
    from template.commands import main

    with pytest.raises(SystemExit) as exit_info:
        main(["lr_find", "--help"])  # as tools/lr_find.py and lr_find.png are named
    assert exit_info.value.code == 0 and "lr-find" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["train"])
    said = capsys.readouterr().err
    assert exit_info.value.code == 2 and "no command 'train'" in said and "doctor, lr-find, export" in said
