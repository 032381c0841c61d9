"""The README is the front door: its commands must stay true."""

import re
import shlex
from pathlib import Path

import pytest

from template.cli import PROGRAM, cli
from template.tools.export import build_parser
from template.tools.lr_find import build_parser as lr_find_parser

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_readme_starts_with_exactly_the_two_setup_commands():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    assert first_block.split("\n")[:-1] == ["make fit", "make test"]


COMMANDS = [
    line.split("#")[0].strip()
    for block in re.findall(r"```bash\n(.*?)```", README, re.S)
    for line in block.splitlines()
    if line.startswith(f"{PROGRAM} ")
]


def test_readme_shows_cli_commands():
    assert len(COMMANDS) >= 8


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_parses(command, monkeypatch):
    # --print_config parses every option and config file, then exits before any work.
    monkeypatch.chdir(REPO)
    args = shlex.split(command)[1:]
    if args[0] == "export":  # its own parser: check the options without exporting anything
        build_parser().parse_args(args[1:])
        return
    if args[0] in ("doctor", "lr-find"):  # fit's options without a subcommand, plus lr-find's own
        fit_args = lr_find_parser().parse_known_args(args[1:])[1]
        with pytest.raises(SystemExit) as exit_info:
            cli([*fit_args, "--print_config"], run=False)
        assert exit_info.value.code in (0, None)
        return
    with pytest.raises(SystemExit) as exit_info:
        cli([*shlex.split(command)[1:], "--print_config"])
    assert exit_info.value.code in (0, None)
