import os  # both loaded before any file is looked for: nothing of the working directory runs here
import sys

# python -m puts the working directory first on the import path: off it before anything is imported from there.
if sys.path and sys.path[0] in ("", os.getcwd()) and not sys.flags.safe_path:
    del sys.path[0]

from template.imports import find_own_modules  # noqa: E402

find_own_modules(sys.argv[1:])  # your modules there that the command names, and no other file

from template.commands import main  # noqa: E402

main()
