import sys

from template.imports import find_own_modules

find_own_modules(sys.argv[1:])  # before any library is imported: none finds a file of the folder you run in

from template.commands import main  # noqa: E402

main()
