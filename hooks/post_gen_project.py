"""Fill the new project with this repository's files, renamed, record where they came from, and
commit them, so that `cruft update` works at once."""

import json
import subprocess
import sys
from pathlib import Path

source = Path({{ source_dir() | jsonify }})
sys.path.insert(0, str(source / "hooks"))
from rename import first_commit, generate  # noqa: E402

context = json.loads({{ cookiecutter | jsonify | jsonify }})
project = Path.cwd()
(project / ".gitkeep").unlink(missing_ok=True)
left = generate(source, project, *(context[key] for key in ("project_name", "package_name", "author", "description")))
if left:
    print(f"NOTE: {left}", file=sys.stderr)

# The template version, in the form `cruft update` reads. Under cruft (create, update),
# cruft writes this file itself and passes `_commit`; a second copy would conflict.
if "_commit" not in context:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:  # no git: first_commit below says what that means
        commit = ""
    template = context.get("_template") or ""
    if not any(marker in template for marker in ("://", "git@", "gh:", "gl:", "bb:")):
        template = str(source)  # a local path: record it absolute, as the project moves away from it
    kept = {key: value for key, value in context.items() if key not in ("_repo_dir", "_output_dir")}
    record = {"template": template, "commit": commit or None, "checkout": context.get("_checkout")}
    record |= {"context": {"cookiecutter": kept | {"_commit": commit}}, "directory": None}
    (project / ".cruft.json").write_text(json.dumps(record, indent=2) + "\n")
    # Not under cruft: `cruft create` writes .cruft.json after this hook (a commit now would leave
    # it out), and `cruft update` runs this hook in the scratch copies it compares, where a .git
    # folder would end up in the diff. The README gives the command after `cruft create`.
    problem = first_commit(project, f"Generated from {template}" + (f" at {commit[:12]}" if commit else ""))
    if problem:
        print(f"NOTE: {problem}", file=sys.stderr)
