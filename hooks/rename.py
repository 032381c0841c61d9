"""Turn a copy of this repository into a project with its own name.

The one renaming implementation: the cookiecutter hooks call it, and so can a person
(`python hooks/rename.py SRC DST --project-name "Leaf Disease"`). It changes what names
the package (imports, module paths, YAML ``class_path`` entries, the console script,
``python -m``, directory paths, pyproject metadata), never the ordinary English word
"template", and applied twice it changes nothing more. ``first_commit`` then makes the
project a git repository, for the cookiecutter hook (cruft update needs one).
"""

import argparse
import importlib.util
import json
import keyword
import re
import shutil
import subprocess
import sys
from pathlib import Path

OLD = "template"  # the package name of this repository

# Files that only serve generation; a generated project does not get them.
MACHINERY = ("cookiecutter.json", "hooks/", "{{cookiecutter.project_slug}}/", "tests/test_generate.py")
# Never copied, whatever git says: local state of the source checkout.
LOCAL = (
    ".git/", ".venv/", "runs/", ".cache/", "lightning_logs/", ".pytest_cache/", ".ruff_cache/", "__pycache__/",
    ".ipynb_checkpoints/",
)  # fmt: skip
# Lines that only make sense in this repository (its generation machinery), between markers in
# the comment syntax of their file; a project does not get them.
TEMPLATE_ONLY = re.compile(
    r"<!-- template-only -->.*?<!-- /template-only -->\n*|^[ \t]*# template-only\n.*?^[ \t]*# /template-only\n",
    re.S | re.M,
)

# Names a package must not shadow: the dependencies and tools the project imports.
TAKEN = {
    "torch", "torchvision", "lightning", "pytorch_lightning", "lightning_fabric", "torchmetrics", "tensorboard",
    "jsonargparse", "rich", "sklearn", "scikit_learn", "numpy", "scipy", "matplotlib", "pytest", "ruff", "nbmake",
    "cookiecutter", "cruft", "setuptools", "pip", "yaml", "PIL", "pillow", "safetensors", "onnx", "onnxruntime",
    "tests", "configs", "notebooks", "benchmarks", "scripts", "hooks",
}  # fmt: skip

# The word `template` as a name: not inside a longer word, dotted name or hyphenated name.
_WORD = r"(?<![\w.-])template(?![\w-])"
_NAME_PATTERNS = [
    _WORD + r"(?=\.[A-Za-z_])",  # a module path: template.nets.ResNet18, template.commands:main
    _WORD + r"(?=/)",  # a directory: template/nets/resnet.py
    r"(?<=import )" + _WORD,
    r"(?<=from )" + _WORD,
    r"(?<=-m )" + _WORD,  # python -m template
    r"(?<=/)" + _WORD,  # .venv/bin/template
    r"(?<=[\"'`])" + _WORD + r"(?=[\"'`*])",  # "template", 'template*', `template`
    r"^" + _WORD + r"(?= = \")",  # the console script entry in pyproject.toml
    r"(?<==)" + _WORD + r"$",  # a value: #SBATCH --job-name=template
    _WORD + r"(?= (?:fit|validate|test|predict|doctor|export|lr-find|sweep|cv|--help|-h)\b)",  # a command line
]
NAME = re.compile("|".join(f"(?:{pattern})" for pattern in _NAME_PATTERNS), re.MULTILINE)


def derive_package_name(project_name: str) -> str:
    """The default package name of a project title: lower case, runs of other characters as '_'."""
    return re.sub(r"[^0-9a-z]+", "_", project_name.lower()).strip("_")


def check_names(project_name: str, package_name: str) -> None:
    """Refuse a package name that cannot work, saying why and what would."""
    problems = []
    if not project_name.strip():
        problems.append("the project name is empty")
    if package_name[:1].isdigit():
        problems.append(f"{package_name!r} starts with a digit")
    elif not package_name.isidentifier() or not package_name.isascii():
        problems.append(f"{package_name!r} is not a valid Python identifier (letters, digits and '_' only)")
    if keyword.iskeyword(package_name) or keyword.issoftkeyword(package_name):
        problems.append(f"{package_name!r} is a Python keyword")
    if package_name != package_name.lower():
        problems.append(f"{package_name!r} is not lower case (PEP 8 package names are)")
    if package_name in TAKEN or package_name in sys.stdlib_module_names:
        problems.append(f"{package_name!r} would shadow the module of that name that the project imports")
    if problems:
        suggestion = derive_package_name(project_name) or "my_classifier"
        if not suggestion.isidentifier() or keyword.iskeyword(suggestion) or suggestion in TAKEN:
            suggestion = f"{suggestion}_project".lstrip("0123456789_") or "my_classifier"
        raise ValueError(
            f"invalid package_name: {'; '.join(problems)}. Choose another, e.g. package_name={suggestion!r}"
        )


def rename_text(text: str, package_name: str) -> str:
    """Replace every use of the package name `template` in ``text``; leave the English word alone."""
    return NAME.sub(package_name, text)


def project_files(source: Path) -> list[str]:
    """The files of the source repository a project is made of, relative and sorted."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=source, capture_output=True, text=True, check=True,
        ).stdout.split("\0")  # fmt: skip
    except (subprocess.CalledProcessError, FileNotFoundError):  # not a git checkout: take every file
        listed = [str(path.relative_to(source)) for path in source.rglob("*") if path.is_file()]
    keep = []
    for name in listed:
        if not name or not (source / name).is_file():  # empty entries and deleted-but-tracked files
            continue
        parts = Path(name).parts
        if name.startswith(MACHINERY) or name == ".git" or any(part + "/" in LOCAL for part in parts[:-1]):
            continue
        keep.append(name)
    return sorted(keep)


def rewrite_readme(text: str, project_name: str, description: str) -> str:
    """A README of the project's own: its title and description."""
    body = text[text.index("```bash") :]  # the two set-up commands and everything after them stay
    return f"# {project_name}\n\n{description}\n\n{body}"


def rewrite_package_docstring(text: str, description: str) -> str:
    """The package's docstring says what the project is, not what the template is."""
    escaped = (description.strip() or "An image classifier.").replace("\\", "\\\\").replace('"', '\\"')
    return re.sub(r'\A""".*?"""', lambda _: f'"""{escaped}"""', text, count=1, flags=re.S)


def rewrite_pyproject(text: str, description: str, author: str) -> str:
    text = re.sub(r'(?m)^description = ".*"$', "description = " + json.dumps(description), text, count=1)
    authors = "authors = [{ name = " + json.dumps(author) + " }]"
    if "authors = " not in text:
        text = re.sub(r"(?m)^(readme = .*)$", lambda match: f"{match.group(1)}\n{authors}", text, count=1)
    return text


def generate(
    source: Path, destination: Path, project_name: str, package_name: str, author: str, description: str
) -> str | None:
    """Copy the project files of ``source`` into ``destination`` under the new names, formatted; returns what is
    left to do by hand, if anything."""
    check_names(project_name, package_name)
    for name in project_files(source):
        target = destination / rename_text(name, package_name)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = (source / name).read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:  # binary: copied as it is
            target.write_bytes(data)
            continue
        text = rename_text(TEMPLATE_ONLY.sub("", text), package_name)
        if name == "README.md":
            text = rewrite_readme(text, project_name, description)
        elif name == "pyproject.toml":
            text = rewrite_pyproject(text, description, author)
        elif name == f"{OLD}/__init__.py":
            text = rewrite_package_docstring(text, description)
        target.write_text(text, encoding="utf-8")
        shutil.copymode(source / name, target)
    return format_python(destination)


def format_python(project: Path) -> str | None:
    """Reformat the project with ruff, as `make lint` checks it: a name longer or shorter than `template` moves
    lines past or back under the line length. Returns None when done, or the command that finishes the job."""
    ruff = [sys.executable, "-m", "ruff"] if importlib.util.find_spec("ruff") else [shutil.which("ruff") or ""]
    try:
        done = subprocess.run(
            [*ruff, "format", "--quiet", "--no-cache", "."], cwd=project, capture_output=True, text=True
        )
    except (FileNotFoundError, PermissionError):
        done = None
    if done is None or done.returncode != 0:
        return f"ruff was not found here: run `.venv/bin/ruff format .` in {project} after `make test` installs it"
    return None


# Who makes the first commit where git knows no user (a fresh machine, a CI job).
GENERATOR = ("cookiecutter", "cookiecutter@localhost")


def first_commit(project: Path, message: str) -> str | None:
    """Make ``project`` a git repository with all its files in one commit, so that `cruft update`
    (which needs a clean git work tree) works at once. Returns None when done, or what stopped it
    and the commands that finish the job by hand."""
    by_hand = f"in {project}: git init && git add -A && git commit -m 'Generated from the template'"
    if shutil.which("git") is None:
        return f"git was not found, so the project is not a git repository; `cruft update` needs one: {by_hand}"
    outer = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=project, capture_output=True, text=True)
    if outer.returncode == 0:  # generated inside a repository: the project's files are that one's to commit
        return f"the project lies inside the git repository {outer.stdout.strip()}; commit it there"
    identity = []
    for key, value in zip(("user.name", "user.email"), GENERATOR):
        if subprocess.run(["git", "config", key], cwd=project, capture_output=True).returncode != 0:
            identity += ["-c", f"{key}={value}"]
    steps = (["init", "-q"], ["add", "-A"], [*identity, "commit", "-q", "--no-verify", "-m", message])
    for step in steps:
        done = subprocess.run(["git", *step], cwd=project, capture_output=True, text=True)
        if done.returncode != 0:
            return f"`git {' '.join(step[-5:])}` failed: {done.stderr.strip()}; finish {by_hand}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="this repository")
    parser.add_argument("destination", type=Path, help="the new project's directory (must not exist)")
    parser.add_argument("--project-name", required=True)
    parser.add_argument("--package-name", help="defaults to the project name in lower case with '_'")
    parser.add_argument("--author", default="")
    parser.add_argument("--description", default="An image classifier trained with PyTorch Lightning.")
    args = parser.parse_args()
    if args.destination.exists():
        parser.error(f"{args.destination} exists; give a new directory")
    package_name = args.package_name or derive_package_name(args.project_name)
    try:
        left = generate(args.source, args.destination, args.project_name, package_name, args.author, args.description)
    except ValueError as error:
        parser.error(str(error))
    if left:
        print(f"NOTE: {left}", file=sys.stderr)


if __name__ == "__main__":
    main()
