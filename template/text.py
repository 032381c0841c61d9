"""Text from elsewhere (a checkpoint's paths, a study's names, an image folder's file names) as a terminal shows it."""

import shlex
from collections.abc import Iterable

from rich.markup import escape


def shown(text: object, markup: bool = True) -> str:
    """``text`` as a terminal may show it, whoever wrote it (a checkpoint's paths, a study's parameter names):
    characters that are not printable written as Python escapes them, so that an escape sequence (ESC, ``\\x1b``)
    cannot retitle, recolour or rewrite the terminal; and, where rich will read it (``markup``), its markup
    (``[link=...]``) as plain text. An ordinary path or name is shown as it is."""
    text = "".join(char if char.isprintable() else repr(char)[1:-1] for char in str(text))
    return escape(text) if markup else text


def shown_command(args: Iterable, markup: bool = True) -> str:
    """A command line to copy and paste: each argument quoted for the shell, so that a path holding ``; curl ... | sh``
    stays one argument rather than a second command, then ``shown``. An argument with an unprintable character is
    shown escaped: not that argument, but nothing a shell would run."""
    return shown(shlex.join(str(arg) for arg in args), markup)


def printable(text: str) -> str:
    """``text`` with its control characters written as Python escapes them, its line breaks kept: an error that lists
    files one a line."""
    return "\n".join(shown(line, markup=False) for line in text.split("\n"))
