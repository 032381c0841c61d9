"""Text from elsewhere (a checkpoint's paths, a study's names, an image folder's file names) as a terminal shows it."""

import shlex
import unicodedata
from collections.abc import Iterable

from rich.markup import escape


def shown(text: object, markup: bool = True) -> str:
    """``text`` with its unprintable characters written as Python escapes them, so that an escape sequence
    (``\\x1b``) cannot retitle, recolour or rewrite the terminal; where rich reads it (``markup``), markup as text."""
    text = "".join(char if char.isprintable() else repr(char)[1:-1] for char in str(text))
    return escape(text) if markup else text


def shown_command(args: Iterable, markup: bool = True) -> str:
    """``shown``, each argument quoted for the shell: a path holding ``; curl ... | sh`` stays one argument (one
    with an unprintable character is shown escaped: no longer that argument, but nothing a shell would run)."""
    return shown(shlex.join(str(arg) for arg in args), markup)


def printable(text: str) -> str:
    """``shown`` without markup, its line breaks kept: an error that lists files one a line."""
    return "\n".join(shown(line, markup=False) for line in text.split("\n"))


def has_controls(text: str) -> bool:
    """Whether ``text`` holds a control character, a line break or a bidirectional override: what rewrites a terminal
    or a line, never a letter, space or joiner of any script (``str.isprintable`` refuses those too)."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") or c in BIDI_OVERRIDES for c in text)


BIDI_OVERRIDES = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
