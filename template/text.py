"""Text from elsewhere (a checkpoint's paths, a study's names, an image folder's file names) as a terminal shows it."""

import collections
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


def is_text(text: str) -> bool:
    """Whether ``text`` is UTF-8 text: not a name of another encoding that Python read as escapes (``\\udce9``)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def has_controls(text: str) -> bool:
    """Whether ``text`` holds a control character, a line break or a bidirectional override: what rewrites a terminal
    or a line, never a letter, space or joiner of any script (``str.isprintable`` refuses those too)."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") or c in BIDI_OVERRIDES for c in text)


def names_problem(names: list, count: int | None = None) -> tuple[object, str] | None:
    """What no classifier's class names may be, where ``names`` are so (the name, and why): more than ``MAX_CLASSES``
    (or than its ``count`` of classes), one longer than a folder's name can be, empty, twice, or with a control
    character (``has_controls``): an export carries them to a deployment that prints them."""
    if len(names) > MAX_CLASSES:
        return f"{len(names):,} names", f"over {MAX_CLASSES:,} classes"
    if names and count is not None and len(names) != count:
        return f"{len(names):,} names", f"not one for each of its {count:,} classes"
    if (other := next((name for name in names if not isinstance(name, str)), None)) is not None:
        return other, "not a string"
    if long := next((name for name in names if len(name) > MAX_CLASS_NAME), None):
        return f"{long[:40]}...", f"longer than {MAX_CLASS_NAME} characters"
    if (odd := next((name for name in names if not name or has_controls(name)), None)) is not None:
        return odd, "a class name that is empty or holds a control character"
    # Twice, or in two Unicode forms of one (NFC "café", NFD "cafe" + U+0301): names no reader tells apart.
    counted = collections.Counter(unicodedata.normalize("NFC", name) for name in names)
    if twice := [name for name in names if counted[unicodedata.normalize("NFC", name)] > 1]:
        return twice[0], "a class name given twice (or as two Unicode forms of it)"
    return None


def check_class_names(names: list, count: int) -> None:
    """Refuse a model's class names where ``names_problem`` finds one."""
    if problem := names_problem(names, count):
        raise ValueError(f"class names: {problem[0]!r} is {problem[1]} (num_classes={count}), in the data's or model's")


MAX_CLASSES, MAX_CLASS_NAME = 1 << 16, 255  # classes a classifier has, and a class name's length (a folder name's)
BIDI_OVERRIDES = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
