"""Refuse an unusable package name before any file is written (cookiecutter then removes the empty directory)."""

import sys

sys.path.insert(0, {{ source_dir() | jsonify }} + "/hooks")
from rename import check_names  # noqa: E402

try:
    check_names({{ cookiecutter.project_name | jsonify }}, {{ cookiecutter.package_name | jsonify }})
except ValueError as error:
    print(f"ERROR: {error}", file=sys.stderr)
    sys.exit(1)
