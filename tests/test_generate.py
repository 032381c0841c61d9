"""Generating a new project from this repository (cookiecutter, cruft) and renaming it."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hooks"))
from rename import GENERATOR, check_names, derive_package_name, first_commit, project_files, rename_text  # noqa: E402

from template.cli import EXTRA_COMMANDS  # noqa: E402

GIT = ["git", "-c", "user.name=Test", "-c", "user.email=test@example.invalid"]
# The README's command for the first commit of a project made by `cruft create`.
README_FIRST_COMMIT = re.search(r"`(cd my-project && git init [^`]*)`", (REPO / "README.md").read_text()).group(1)

# Every way code can name the package: an import, a module path, a class_path, an entry point.
LEFTOVER = re.compile(
    r"(import template\b|from template\b|\btemplate\.[A-Za-z_]|-m template\b|^template = |"
    r"[\"']template[\"'*]|/template\b|\btemplate (?:fit|validate|test|predict)\b)",
    re.MULTILINE,
)


def test_rename_changes_names_and_leaves_the_word_alone():
    text = (
        "from template.nets import ResNet18\nimport template\nclass_path: template.nets.ResNet18\n"
        'template = "template.commands:main"\ninclude = ["template*"]\npython -m template fit\n'
        "$(BIN)/template test --ckpt_path best\nsee template/module.py and `template fit`\n"
        "A project template; the template's defaults; templates_lab; my-template; x.template\n"
        "#SBATCH --job-name=template\n"
    )
    renamed = rename_text(text, "bird_watch")
    assert renamed == (
        "from bird_watch.nets import ResNet18\nimport bird_watch\nclass_path: bird_watch.nets.ResNet18\n"
        'bird_watch = "bird_watch.commands:main"\ninclude = ["bird_watch*"]\npython -m bird_watch fit\n'
        "$(BIN)/bird_watch test --ckpt_path best\nsee bird_watch/module.py and `bird_watch fit`\n"
        "A project template; the template's defaults; templates_lab; my-template; x.template\n"
        "#SBATCH --job-name=bird_watch\n"
    )
    assert rename_text(renamed, "bird_watch") == renamed  # idempotent
    assert rename_text(text, "bird_watch") == renamed  # deterministic


def test_rename_changes_every_command_of_the_program():
    for command in ["fit", "validate", "test", "predict", *EXTRA_COMMANDS]:
        assert rename_text(f"run `template {command} --help`", "bird_watch") == f"run `bird_watch {command} --help`"


@pytest.mark.parametrize(
    "project_name, package_name",
    [("Bird Watch", "bird_watch"), ("leaf-disease detector", "leaf_disease_detector"), ("X-Ray 2.0!", "x_ray_2_0")],
)
def test_package_name_is_derived_from_the_title(project_name, package_name):
    assert derive_package_name(project_name) == package_name


@pytest.mark.parametrize(
    "package_name, reason",
    [
        ("class", "keyword"),
        ("3d_scans", "starts with a digit"),
        ("torch", "shadow"),
        ("lightning", "shadow"),
        ("json", "shadow"),
        ("my-project", "not a valid Python identifier"),
        ("MyProject", "lower case"),
    ],
)
def test_unusable_package_names_are_refused_with_the_reason(package_name, reason):
    with pytest.raises(ValueError, match=reason) as error:
        check_names("Some Project", package_name)
    assert package_name in str(error.value) and "e.g. package_name=" in str(error.value)


def test_generation_machinery_is_not_part_of_a_project():
    files = project_files(REPO)
    assert "template/cli.py" in files and "README.md" in files
    assert not any(name.startswith(("hooks/", "cookiecutter.json", "{{")) for name in files)
    assert "tests/test_generate.py" not in files


def test_invalid_name_stops_generation_before_anything_is_written(tmp_path):
    with pytest.raises(FailedHookException):
        cookiecutter(str(REPO), no_input=True, output_dir=str(tmp_path), extra_context={"package_name": "lightning"})
    assert list(tmp_path.iterdir()) == []


def render(output_dir: Path, **names: str) -> Path:
    return Path(cookiecutter(str(REPO), no_input=True, output_dir=str(output_dir), extra_context=names))


def run(command: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project generated with cookiecutter's defaults but the name, shared by the quick checks below."""
    return render(tmp_path_factory.mktemp("generated"), project_name="Bird Watch")


def test_a_generated_project_is_committed_and_a_run_leaves_it_clean(project):
    assert run(["git", "log", "--format=%s"], project).stdout.startswith(f"Generated from {REPO}")
    assert not run(["git", "status", "--porcelain"], project).stdout  # .cruft.json included
    for output in (".cache/images/train-0123.npy", "runs/digits/version_0/metrics.csv", "lightning_logs/x"):
        (project / output).parent.mkdir(parents=True, exist_ok=True)
        (project / output).write_text("written by a run")
    assert not run(["git", "status", "--porcelain", "--untracked-files=all"], project).stdout


def test_without_git_the_project_is_made_and_the_message_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git to be found
    (tmp_path / "project").mkdir()
    problem = first_commit(tmp_path / "project", "Generated")
    assert "git was not found" in problem and "git init && git add -A && git commit" in problem
    assert not (tmp_path / "project" / ".git").exists()


def test_the_first_commit_has_an_author_where_git_knows_none(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.gitconfig
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("hello\n")
    assert first_commit(project, "Generated") is None
    assert run(["git", "log", "--format=%an <%ae>"], project).stdout.strip() == "{} <{}>".format(*GENERATOR)


def test_a_generated_project_names_no_template_leftovers(project):
    # The English word may stay ("Keep up with the template"); what names this repository may not.
    assert "#SBATCH --job-name=bird_watch\n" in (project / "scripts" / "slurm.sbatch").read_text()
    docstring = (project / "bird_watch" / "__init__.py").read_text().splitlines()[0]
    assert docstring == '"""An image classifier trained with PyTorch Lightning."""'  # the description
    pyproject = (project / "pyproject.toml").read_text()
    assert "hooks/" not in pyproject and "template (hooks/)" not in pyproject  # no exclude of absent files
    for path in project.rglob("*"):
        if path.is_file() and ".git" not in path.parts:
            assert "template-only" not in path.read_text(errors="ignore"), path


def test_a_generated_project_has_ci_calling_make_test(project):
    workflow = yaml.safe_load((project / ".github" / "workflows" / "ci.yml").read_text())
    commands = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    assert "make test" in commands
    assert "\ntest: " in (project / "Makefile").read_text()


def test_a_generated_project_passes_pre_commit_offline(project, tmp_path):
    # Local hooks: the ruff of this environment, nothing fetched (PRE_COMMIT_HOME starts empty).
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    env = {"PATH": path, "HOME": str(tmp_path), "PRE_COMMIT_HOME": str(tmp_path / "pre-commit")}
    result = subprocess.run([sys.executable, "-m", "pre_commit", "run", "--all-files"], cwd=project, env=env,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"ruff check\.+Passed", result.stdout) and re.search(r"ruff format\.+Passed", result.stdout)


# Each generated project runs the fast tests where the names the renamer writes are read (class paths in
# YAML and checkpoints, imports, the README's commands; one also its notebook): a name with a hyphen, one
# that starts with "template", and cookiecutter's own. The rest is the same code under another name, run by
# this suite already (running all of it again took as long as the rest of the suite); that no name is
# left over is checked above, in every file.
NAMES_READ = ["tests/test_cli.py", "tests/test_readme.py"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "names, package, markers, paths",
    [
        ({"project_name": "leaf-disease detector"}, "leaf_disease_detector", "not slow", NAMES_READ),
        ({"project_name": "Templates Lab", "package_name": "templates_lab"}, "templates_lab", "not slow", NAMES_READ),
        ({"project_name": "Bird Watch"}, "bird_watch", "not slow", [*NAMES_READ, "notebooks"]),
    ],
)
def test_generated_project_installs_passes_its_tests_and_trains(tmp_path, names, package, markers, paths):
    project = render(tmp_path, **names)
    assert (project / package / "cli.py").is_file() and not (project / "template").exists()
    assert not (project / "hooks").exists() and not (project / "cookiecutter.json").exists()
    for path in project.rglob("*"):
        if path.is_file() and path.name != ".cruft.json" and ".git" not in path.parts:  # they name the source
            text = path.read_text(errors="ignore")
            assert not LEFTOVER.findall(text), f"{path.relative_to(project)} still names the package template"
    readme = (project / "README.md").read_text()
    assert readme.startswith(f"# {names['project_name']}\n") and "make fit\nmake test\n" in readme
    assert f'{package} = "{package}.commands:main"' in (project / "pyproject.toml").read_text()
    assert (project / ".cruft.json").is_file()

    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", str(project)]
    run(pip, tmp_path)  # --no-deps: torch and the rest are the current environment's, not reinstalled
    try:
        selection = ["-m", markers] if markers else []
        pytest_args = ["-q", "-p", "no:cacheprovider", *selection, "--nbmake", *paths]
        tests = run([sys.executable, "-m", "pytest", *pytest_args], project)
        assert " passed" in tests.stdout and "failed" not in tests.stdout
        fit = run([sys.executable, "-m", package, "fit", "--trainer.fast_dev_run", "true"], project)
        assert "Trainer.fit` stopped" in fit.stderr + fit.stdout or "fast_dev_run" in fit.stderr + fit.stdout
        script = Path(sys.executable).parent / package
        assert run([str(script), "--help"], project).stdout.startswith(f"usage: {package}")
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "-y", package], capture_output=True)


@pytest.mark.slow
@pytest.mark.parametrize("route", ["cookiecutter", "cruft create"])
def test_cruft_update_works_right_after_generation(tmp_path, route, monkeypatch):
    for who in ("AUTHOR", "COMMITTER"):  # the README's git commit, on a machine where git knows no user
        monkeypatch.setenv(f"GIT_{who}_NAME", "Test")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "test@example.invalid")
    # A temporary copy of the template as it is in this working tree, as a git repository.
    template = tmp_path / "template-copy"
    listed = run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], REPO).stdout
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (template / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, template / name)
    run(["git", "init", "-q"], template)
    run(["git", "add", "-A"], template)
    run([*GIT, "commit", "-qm", "template v1"], template)

    cruft = [sys.executable, "-m", "cruft"]
    out = tmp_path / "projects"
    out.mkdir()
    if route == "cookiecutter":  # the generation commits everything itself
        cookiecutter(str(template), no_input=True, output_dir=str(out), extra_context={"project_name": "Bird Watch"})
    else:  # cruft writes .cruft.json after the generation: the README's first commit by hand
        run([*cruft, "create", str(template), "--no-input", "--extra-context", '{"project_name": "Bird Watch"}'], out)
        run(["bash", "-c", README_FIRST_COMMIT.removeprefix("cd my-project && ")], out / "bird-watch")
    project = out / "bird-watch"
    user_file = project / "configs" / "default.yaml"
    user_file.write_text(user_file.read_text().replace("max_epochs: 30", "max_epochs: 12"))
    run([*GIT, "commit", "-qam", "my own setting"], project)
    for output in (".cache/images/train.npy", "runs/digits/version_0/metrics.csv"):  # a run's outputs
        (project / output).parent.mkdir(parents=True, exist_ok=True)
        (project / output).write_text("written by a run")

    augment = template / "template" / "data" / "augment.py"
    augment.write_text(augment.read_text() + "\n\nTEMPLATE_CHANGE = 1  # from template.data import augment\n")
    template_file = template / "configs" / "default.yaml"
    template_file.write_text(template_file.read_text().replace("max_epochs: 30", "max_epochs: 40"))
    run([*GIT, "commit", "-qam", "template v2"], template)

    update = run([*cruft, "update", "-y"], project)  # no --allow-untracked-files: the tree is clean
    updated = (project / "bird_watch" / "data" / "augment.py").read_text()
    assert "TEMPLATE_CHANGE = 1  # from bird_watch.data import augment" in updated  # arrived, renamed
    # The conflict, as the README describes it: markers in the file, unmerged in git, no .rej file.
    assert "<<<<<<< ours\n  max_epochs: 12\n=======\n  max_epochs: 40\n>>>>>>> theirs\n" in user_file.read_text()
    assert "Applied patch to 'configs/default.yaml' with conflicts." in update.stdout + update.stderr
    assert "UU configs/default.yaml" in run(["git", "status", "--short"], project).stdout
    assert not list(project.rglob("*.rej"))
    recorded = (project / ".cruft.json").read_text()
    assert run(["git", "rev-parse", "HEAD"], template).stdout.strip() in recorded


def test_rename_script_is_the_same_route_without_cookiecutter(tmp_path):
    script = [sys.executable, str(REPO / "hooks" / "rename.py"), str(REPO)]
    run([*script, str(tmp_path / "bird"), "--project-name", "Bird Watch", "--author", "A. Person"], tmp_path)
    project = tmp_path / "bird"
    assert (project / "bird_watch" / "cli.py").is_file()
    assert 'authors = [{ name = "A. Person" }]' in (project / "pyproject.toml").read_text()
    assert not (project / "hooks").exists() and not (project / ".ruff_cache").exists()  # formatted, no cache left
    refused = subprocess.run([*script, str(tmp_path / "x"), "--project-name", "P", "--package-name", "torch"],
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 2 and "'torch' would shadow" in refused.stderr and not (tmp_path / "x").exists()


def test_a_long_package_name_keeps_the_project_lint_clean(tmp_path):
    # Imports wrap at 120 columns: a longer name must not push one over and upset isort, nor leave a line that
    # `ruff format --check` (make lint, the pre-commit hook) would rewrap.
    package = "a_rather_long_package_name_for_a_classifier"
    project = tmp_path / "long"
    run([sys.executable, str(REPO / "hooks" / "rename.py"), str(REPO), str(project),
         "--project-name", "Long", "--package-name", package], tmp_path)  # fmt: skip
    for check in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *check, "."], cwd=project, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout[-3000:]
