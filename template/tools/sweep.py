"""``template sweep --space FILE --n_trials N [fit options]``: a hyper-parameter search on Optuna.

Each trial is a ``template fit`` run (runs/<study_name>/trial_NNN), scored by its best checkpoint's
checkpoint.monitor and pruned by Optuna's Lightning callback. Workers on many machines share the study's database
(``--storage``; SQLite in the runs folder by default; a dead worker's trial is failed by its heartbeat) until
``--n_trials`` have finished over all, then each writes trials.csv and best.yaml (for ``template fit --config``).
The space's keys are fit options::

    model.optimizer.init_args.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
    data.init_args.batch_size: {type: int, low: 32, high: 128, step: 32}
    model.optimizer: {type: categorical, choices: [torch.optim.AdamW, torch.optim.SGD]}
"""

import argparse
import contextlib
import csv
import functools
import io
import math
import random
import re
import sqlite3
import sys
import tempfile
import time
import urllib.parse
import warnings
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from template.callbacks.nonfinite import NonFiniteError
from template.callbacks.predictions import spreadsheet_safe
from template.checkpoints import monitored_score
from template.cli import PROGRAM
from template.text import shown, shown_command

try:
    import optuna
    import sqlalchemy
    from optuna.trial import TrialState
    from optuna_integration import PyTorchLightningPruningCallback
except ModuleNotFoundError as missing:  # an optional extra
    raise ModuleNotFoundError(f"{PROGRAM} sweep needs Optuna ({missing}): pip install -e '.[sweep]'") from None
from template.files import foreign_sql, schema_of, walk, write_atomic
from template.runs import check_own_folders, is_tensorboard, loggers_of
from template.tools import fits

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
SUGGEST = {  # type: (required, optional) keys of its entry, as Optuna's suggest_* names them
    "float": ({"low", "high"}, {"log", "step"}),
    "int": ({"low", "high"}, {"log", "step"}),
    "categorical": ({"choices"}, set()),
}
STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")  # a plain name: a folder of the runs, never a path
POLL_SECONDS = 2.0  # how often a worker with nothing left to start looks at the others' trials
STORAGE_TRIES = 5  # how often a worker tries to open the study's storage (workers started together race)
# Optuna reads these with json.loads, which "[" * 1000 sends past Python's recursion limit (a RecursionError naming
# nothing): a value's brackets bound how deep it nests, and a study's own hold a few (its space: one an entry).
JSON_COLUMNS = {"trial_params": "distribution_json"} | {
    f"{owner}_{kind}_attributes": "value_json" for owner in ("study", "trial") for kind in ("user", "system")
}
MAX_BRACKETS = 500
DEEP_JSON = "SELECT 1 FROM {0} WHERE length({1}) - length(replace(replace({1}, '[', ''), '{{', '')) > ?"


class NotRun(Exception):
    """A trial failed, not run: enqueued with values outside the space, or past the count the others' make."""


def read_space(path: str) -> dict[str, dict]:
    """The search space of ``path``, checked entry by entry before any trial starts."""
    try:
        space = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ValueError(f"--space {path}: cannot be read: {error}") from None
    if not isinstance(space, dict) or not space:
        raise ValueError(
            f"--space {path}: expected a mapping of fit options to ranges, e.g. {__doc__.splitlines()[-3]}"
        )
    checked = {}
    for key, spec in space.items():
        where = f"--space {path}: {key}"
        kind = spec.get("type") if isinstance(spec, dict) else None
        if kind not in SUGGEST:
            raise ValueError(f"{where}: expected a mapping with type: {' | '.join(SUGGEST)}, not {spec!r}")
        required, optional = SUGGEST[kind]
        given = set(spec) - {"type"}
        if not required <= given or given - required - optional:
            raise ValueError(f"{where}: type {kind} takes {sorted(required)} and optionally {sorted(optional)}, "
                             f"not {sorted(given)}")  # fmt: skip
        if kind == "categorical":
            choices = spec["choices"]
            if not isinstance(choices, list) or not choices or any(isinstance(c, dict | list) for c in choices):
                raise ValueError(f"{where}: choices must be a list of values (class paths, numbers, strings)")
        elif not (isinstance(spec["low"], int | float) and isinstance(spec["high"], int | float)
                  and spec["low"] < spec["high"]):  # fmt: skip
            raise ValueError(f"{where}: low must be a number below high, not {spec['low']!r} and {spec['high']!r}")
        checked[str(key).removeprefix("--")] = spec
    return checked


def as_option(value) -> str:
    """A value as the command line gives it (jsonargparse reads it as YAML)."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def example_options(space: dict[str, dict]) -> list[str]:
    """Fit options with a value of each entry (its low end, its first choice), to check the keys."""
    return as_options({key: spec.get("choices", [spec.get("low")])[0] for key, spec in space.items()})


def suggest(trial: optuna.Trial, space: dict[str, dict]) -> list[str]:
    """This trial's values as fit options."""
    values = {}
    for key, spec in space.items():
        arguments = {name: value for name, value in spec.items() if name != "type"}
        values[key] = getattr(trial, f"suggest_{spec['type']}")(key, **arguments)
    return as_options(values)


def as_options(values: dict) -> list[str]:
    """Fit options; a class chosen first, so its own options apply to it."""
    return [f"--{key}={as_option(values[key])}" for key in sorted(values, key=lambda key: key.count("."))]


def checked_params(trial, space: dict[str, dict], source: str, error: type[Exception] = ValueError) -> dict:
    """A finished trial's values, each checked against the local space (type, range, declared choices): what the
    study's database says is another worker's word, and any worker can write it."""
    params = trial.params
    if set(params) != set(space):
        raise error(f"refusing {source}: its parameters {sorted(params)} are not the space's {sorted(space)}")
    for key, spec in space.items():
        value = params[key]
        if spec["type"] == "categorical":
            ok = any(value == choice and type(value) is type(choice) for choice in spec["choices"])
        else:
            kinds = (int,) if spec["type"] == "int" else (int, float)
            ok = type(value) in kinds and spec["low"] <= value <= spec["high"]
        if not ok:
            raise error(f"refusing {source}: its {key} is {value!r}, outside the space ({spec})")
    return params


def checked_run(trial, run_dir: Path, sign: float, monitor: str, source: str) -> Path:
    """The best checkpoint of a trial's run that records the trial's value: any worker can write a trial, with any
    value, into the study's database; only a run here backs it (another machine's, on no shared folder, is passed
    over too)."""
    try:  # any name checkpoint.filename gives, in folders too ({val/acc}: a val/ folder)
        found = list(walk(run_dir / "checkpoints", 4)) if (run_dir / "checkpoints").is_dir() else []
    except ValueError as error:
        raise ValueError(f"refusing {source}: {error}") from None
    bests = [path for path in found if path.suffix == ".ckpt" and path.stem not in ("last", "preempted")]
    scores = {path: sign * scored[1] for path in bests if (scored := monitored_score(path)) and scored[0] == monitor}
    backing = [path for path, score in scores.items() if math.isclose(score, trial.value)]
    if not (run_dir / "config.yaml").is_file() or not backing:
        raise ValueError(f"refusing {source}: {run_dir} has no config.yaml and best checkpoint of {trial.value!r}")
    return backing[0]


@functools.cache
def optuna_schema() -> frozenset[tuple]:
    """The schema entries of a new study database as the installed Optuna makes it (its alembic head): the only
    ones a study file may hold. Made, not listed, so that it follows Optuna's upgrades."""
    with tempfile.TemporaryDirectory() as folder:
        reference = Path(folder) / "reference.db"
        optuna.storages.RDBStorage(f"sqlite:///{reference}").engine.dispose()
        with contextlib.closing(sqlite3.connect(reference)) as database:
            return frozenset(schema_of(database))


def check_database(path: Path, storage_url: str) -> None:
    """Refuse a SQLite study file whose schema is not one Optuna makes (SQL of its author's, in a view, a trigger,
    an index's expression or a CHECK, runs inside Optuna's queries), whose JSON nests past Optuna's reader, or whose
    trials hold values it cannot read back."""
    if not path.is_file():
        return
    known = optuna_schema()
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as database:
            entries = schema_of(database)
            unknown = foreign_sql(entries, known)
            tables = [] if unknown else [name for kind, name, _, _ in entries if kind == "table"]
            deep = [
                name
                for name, column in JSON_COLUMNS.items()
                if name in tables and database.execute(DEEP_JSON.format(name, column), (MAX_BRACKETS,)).fetchone()
            ]
            rows = "SELECT param_value, distribution_json FROM trial_params"
            stored = database.execute(rows).fetchall() if "trial_params" in tables and not deep else []
    except sqlite3.DatabaseError as error:
        raise ValueError(f"--storage {storage_url}: not a readable SQLite database ({error})") from None
    if unknown:
        raise ValueError(
            f"refusing --storage {storage_url}: it holds {unknown}, which no study of Optuna "
            f"{optuna.__version__} makes (its SQL would run inside Optuna's queries; one another Optuna version made, "
            "or upgraded, may differ too); use a study database this Optuna made, or another --storage"
        )
    if deep:
        raise ValueError(
            f"refusing --storage {storage_url}: its table {deep[0]} holds JSON with over {MAX_BRACKETS} brackets, nested "
            "past what Optuna's reader (json.loads) can read; use a study database Optuna made, or another --storage"
        )
    choices: dict[str, int | None] = {}  # a categorical's count of choices (None: no categorical), read once each
    for value, distribution in stored:  # a categorical's stored index past its choices: an IndexError naming nothing
        try:
            if distribution not in choices:
                parsed = optuna.distributions.json_to_distribution(distribution)
                categorical = isinstance(parsed, optuna.distributions.CategoricalDistribution)
                choices[distribution] = len(parsed.choices) if categorical else None
            count = choices[distribution]
            readable = count is None or float(value).is_integer() and 0 <= value < count
        except (ValueError, KeyError, TypeError, AttributeError):
            readable = False
        if not readable:
            raise ValueError(
                f"refusing --storage {storage_url}: a trial's parameter is {value!r} of {distribution!s:.80}, which "
                "Optuna cannot read back: damaged, or written by another program; use another --storage"
            )


def backed(trial, out_dir: Path, sign: float, monitor: str) -> bool:
    """Whether a finished trial's value is backed by its run here (``checked_run``; a damaged checkpoint: not)."""
    try:
        with warnings.catch_warnings():  # monitored_score's word on a damaged checkpoint: said of --ckpt_path best
            warnings.simplefilter("ignore")
            checked_run(trial, out_dir / f"trial_{trial.number:03d}", sign, monitor, f"trial {trial.number}")
    except ValueError:
        return False
    return True


def open_study(options: argparse.Namespace, storage_url: str, direction: str) -> optuna.Study:
    with contextlib.suppress(sqlalchemy.exc.ArgumentError):  # no URL: said by the storage below
        url = sqlalchemy.engine.make_url(storage_url)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            path = Path(urllib.parse.urlparse(url.database).path if url.database.startswith("file:") else url.database)
            path.parent.mkdir(parents=True, exist_ok=True)
            check_database(path, storage_url)  # however the URL spells it: sqlite+pysqlite:///, file: URIs
    # SQLite lets one writer in at a time; the others wait for it rather than fail at once.
    engine_kwargs = {"connect_args": {"timeout": 60}} if storage_url.startswith("sqlite") else {}
    for attempt in range(STORAGE_TRIES):
        try:
            storage = optuna.storages.RDBStorage(
                storage_url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=options.heartbeat_interval,
                grace_period=options.grace_period,
            )
            break
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError) as error:
            # Workers started together on a new database race to create its tables: the next try finds them.
            if attempt == STORAGE_TRIES - 1:
                raise ValueError(f"--storage {storage_url}: {str(error).splitlines()[0]}") from None
            time.sleep(0.2 + random.random())
        except (sqlalchemy.exc.ArgumentError, ImportError) as error:  # no such dialect, or its driver missing
            raise ValueError(
                f"--storage {storage_url}: {error}; give a database URL SQLAlchemy knows, with its driver installed "
                "(sqlite:///path/optuna.db; postgresql://user:password@host/db with psycopg)"
            ) from None
    pruner = optuna.pruners.MedianPruner(
        n_startup_trials=options.n_startup_trials, n_warmup_steps=options.n_warmup_steps
    )
    study = optuna.create_study(
        storage=storage, study_name=options.study_name, direction=direction, pruner=pruner, load_if_exists=True
    )
    if study.direction.name.lower() != direction:
        raise ValueError(
            f"study {options.study_name} in {storage_url} is to {study.direction.name.lower()}, but "
            f"checkpoint.mode asks to {direction}: use another --study_name"
        )
    # A running trial that never sent a heartbeat is never found stale, and would be waited for forever: one heartbeat
    # now, and it is failed a grace period later unless its worker's go on. One already stale is failed at once.
    optuna.storages.fail_stale_trials(study)
    study_id = storage.get_study_id_from_name(study.study_name)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        storage.record_heartbeat(storage.get_trial_id_from_study_id_trial_number(study_id, trial.number))
    return study


def same_study(study: optuna.Study, space: dict, fit_args: list[str]) -> None:
    """A study is one search: another space is refused, other fit options are said. The first worker records both."""
    recorded = study.user_attrs
    if "space" not in recorded:
        study.set_user_attr("space", space)
        study.set_user_attr("fit_options", fit_args)
        return
    if recorded["space"] != space:
        raise ValueError(
            f"study {study.study_name} searches another space ({sorted(recorded['space'])}): its trials would not "
            "compare; give this one another --study_name, or the space the study was started with"
        )
    theirs = recorded.get("fit_options")
    if theirs != fit_args:
        # Any worker writes the database: its options are quoted and escaped, never pasted raw onto the terminal.
        said = shown_command(theirs, markup=False) if isinstance(theirs, list) else shown(repr(theirs), markup=False)
        print(
            f"note: study {study.study_name} was started with the fit options {said}; "
            f"this worker's are {shown_command(fit_args, markup=False)}",
            file=sys.stderr,
        )


def run_study(
    study: optuna.Study, options: argparse.Namespace, fit_args: list[str], space: dict, monitor: str, runs_dir: Path
) -> None:
    """Start trials until ``n_trials`` have finished over all workers; wait while the others' last ones run."""

    def objective(trial: optuna.Trial) -> float:
        before = [t for t in study.get_trials(deepcopy=False) if t.number < trial.number]
        if sum(t.state in (*FINISHED, TrialState.RUNNING) for t in before) >= options.n_trials:
            raise NotRun(f"trial {trial.number} is not run: the other workers' trials make {options.n_trials}")
        run_name = (options.study_name, f"trial_{trial.number:03d}")
        trial.set_user_attr("run_dir", str(runs_dir.joinpath(*run_name)))  # for the dashboard: never read back
        try:
            trial_options = suggest(trial, space)
        except (ValueError, TypeError) as error:  # a value Optuna cannot even represent in the space
            raise NotRun(f"trial {trial.number} of study {study.study_name}: {error}") from None
        checked_params(trial, space, f"trial {trial.number} of study {study.study_name}", NotRun)
        pruner = PyTorchLightningPruningCallback(trial, monitor=monitor)
        try:
            result = fits.fit(fit_args + trial_options, run_name, callbacks=(pruner,))
        except NonFiniteError as error:  # diverged: as hopeless as a trial gets
            trial.set_user_attr("diverged", str(error).splitlines()[0])
            raise optuna.TrialPruned(f"trial {trial.number} diverged: {str(error).splitlines()[0]}") from None
        if result.score is None or math.isnan(result.score):
            raise ValueError(f"trial {trial.number} recorded no {monitor}: does validation run (limit_val_batches)?")
        return result.score

    while True:
        optuna.storages.fail_stale_trials(study)  # a dead worker's trial: failed, so that it is counted out
        states = [trial.state for trial in study.get_trials(deepcopy=False)]
        finished = sum(state in FINISHED for state in states)
        if finished >= options.n_trials:
            return
        if finished + states.count(TrialState.RUNNING) >= options.n_trials and TrialState.WAITING not in states:
            time.sleep(POLL_SECONDS)  # the last trials are the other workers'; take over one that dies
            continue
        study.optimize(objective, n_trials=1, catch=NotRun)


def report(study: optuna.Study, out_dir: Path, monitor: str, space: dict, fit_args: list[str]) -> None:
    """The trials as a table (printed, and trials.csv) and the best one's configuration (best.yaml)."""
    trials = sorted(study.get_trials(deepcopy=False), key=lambda trial: trial.number)
    run_dirs = {trial.number: out_dir / f"trial_{trial.number:03d}" for trial in trials}
    names = sorted({name for trial in trials for name in trial.params})
    rows = []
    for trial in trials:
        value = trial.value if trial.value is not None else trial.intermediate_values.get(trial.last_step)
        params = [trial.params.get(name, "") for name in names]
        run_dir = run_dirs[trial.number]
        run_dir = str(run_dir) if run_dir.is_dir() else ""  # none here: another machine's, or never run
        rows.append([trial.number, trial.state.name.lower(), "" if value is None else f"{value:.4f}", *params, run_dir])
    # The parameters' names and values are the database's word: in the CSV, neither a formula nor an escape sequence.
    safe = [
        [cell if isinstance(cell, int | float) else spreadsheet_safe(cell) for cell in row]
        for row in [["trial", "state", monitor, *names, "run_dir"], *rows]
    ]
    text = io.StringIO()
    csv.writer(text).writerows(safe)
    write_atomic(out_dir / "trials.csv", text.getvalue())
    short = [name.rpartition(".")[2] for name in names]  # lr, batch_size: the table fits a terminal
    columns = short if len(set(short)) == len(short) else names
    table = Table(
        *map(shown, ["trial", "state", monitor, *columns, "run"]),
        title=f"study {shown(study.study_name)} ({shown(out_dir)})",
    )
    for *cells, run_dir in rows:
        table.add_row(
            *(f"{cell:.4g}" if isinstance(cell, float) else shown(cell) for cell in cells), shown(Path(run_dir).name)
        )
    # Whole values in a log (a SLURM job's, say): a terminal's width only where there is one.
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200, highlight=False, emoji=False)
    console.print(table)
    # best.yaml is this worker's own fit options plus the best trial's values checked against the local space:
    # any worker writes the database, so no text from it is parsed, and a trial outside the space is passed over.
    done = [trial for trial in trials if trial.state == TrialState.COMPLETE and trial.value is not None]
    maximize = study.direction.name == "MAXIMIZE"
    for best in sorted(done, key=lambda t: t.value, reverse=maximize):
        source = f"trial {best.number} of study {study.study_name}"
        try:
            params = checked_params(best, space, source)
            checkpoint = checked_run(best, run_dirs[best.number], 1.0 if maximize else -1.0, monitor, source)
            break
        except ValueError as error:
            console.print(f"{shown(error)}: passed over")  # the error quotes the trial's names and values
    else:
        console.print("no trial completed within the space and backed by its run here: no best.yaml")
        (out_dir / "best.yaml").unlink(missing_ok=True)  # an earlier report's: it would name a trial now passed over
        return
    config = fits.resolved_config([*fit_args, *as_options(params)])
    logger = loggers_of(config)[0]
    if is_tensorboard(logger):  # the refit beside the trials: runs/<study>/version_N
        logger.setdefault("init_args", {})["name"] = study.study_name
    head = f"# the best trial of study {study.study_name}: {monitor} {best.value:.4f} (trial {best.number}, "
    head += f"{run_dirs[best.number]})\n# refit: {PROGRAM} fit --config {out_dir / 'best.yaml'}\n"
    write_atomic(out_dir / "best.yaml", head + yaml.safe_dump(config, sort_keys=False))
    console.print(f"best trial       {best.number}: {shown(monitor)} {best.value:.4f}")
    console.print(f"its config       {shown(out_dir / 'best.yaml')}")
    console.print(
        f"its checkpoint   {shown(checkpoint)} (give this path: --ckpt_path best takes the latest run, the last trial)"
    )
    console.print(f"all trials       {shown(out_dir / 'trials.csv')}")


def one_process(config: dict) -> list[str]:
    """A trial is one process on one device: Lightning's DDP would start this whole command again in
    every process, each then asking the study for trials of its own. More devices: more workers."""
    trainer = config.get("trainer") or {}
    devices, nodes = trainer.get("devices", "auto"), trainer.get("num_nodes", 1)
    if devices in ("auto", -1, "-1"):
        return ["--trainer.devices=1"]
    if isinstance(devices, str) and "," in devices:  # "0,1": device indices; "2,": device 2
        count = len([index for index in devices.split(",") if index.strip()])
    else:
        count = len(devices) if isinstance(devices, list) else int(devices)
    if count > 1 or nodes > 1:
        raise ValueError(
            f"a sweep trial runs on one device (trainer.devices={devices}, num_nodes={nodes} asks for more): start a "
            f"worker per GPU instead, each with CUDA_VISIBLE_DEVICES set to its own, on one study"
        )
    return []


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{PROGRAM} sweep",
        usage=f"{PROGRAM} sweep --space FILE --n_trials N [options] [fit options]",
        description="A hyper-parameter search on Optuna; every other option is a fit option (--config ...).",
    )
    parser.add_argument("--space", required=True, help="YAML: fit option -> {type: float|int|categorical, ...}")
    parser.add_argument("--n_trials", type=fits.at_least(1), required=True, help="trials to finish, over all workers")
    parser.add_argument("--study_name", help="default: the --space file's name")
    parser.add_argument("--storage", help="an Optuna database URL; default: sqlite:///<runs folder>/optuna.db")
    parser.add_argument("--n_startup_trials", type=int, default=5, help="trials never pruned (MedianPruner)")
    parser.add_argument("--n_warmup_steps", type=int, default=0, help="epochs of a trial never pruned")
    parser.add_argument("--heartbeat_interval", type=int, default=30, help="seconds between a trial's heartbeats")
    parser.add_argument("--grace_period", type=int, help="a trial silent this long is failed (default: 2 beats)")
    return parser


def main(args: list[str]) -> None:
    parser = build_parser()
    options, fit_args = parser.parse_known_args(args)
    space = read_space(options.space)
    options.study_name = options.study_name or Path(options.space).stem
    if not STUDY_NAME.fullmatch(options.study_name):
        parser.error(f"--study_name {options.study_name!r}: a plain name (letters, digits, _ . -), not a path")
    # The space's keys are fit options: a typo is found now, not as a failed first trial.
    blame = f"{parser.prog}: error: --space {options.space}: an entry is not a fit option (above)"
    config = fits.checked_config(fit_args, example_options(space), blame)
    fit_args = [*fit_args, *one_process(config)]
    runs_dir, _ = fits.runs_place(config)
    check_own_folders(runs_dir, runs_dir / options.study_name)  # trials.csv's, best.yaml's: trials may be others'
    monitor, mode = fits.monitored(config)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the table says what each trial did
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # fail_stale_trials, heartbeats
    storage_url = options.storage or f"sqlite:///{runs_dir / 'optuna.db'}"
    study = open_study(options, storage_url, "maximize" if mode == "max" else "minimize")
    same_study(study, space, fit_args)
    dashboard = shown_command(["optuna-dashboard", storage_url], markup=False)
    print(f"study {options.study_name} in {shown(storage_url, markup=False)} ({dashboard})", file=sys.stderr)
    sign, finished = 1.0 if mode == "max" else -1.0, study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if unbacked := [t.number for t in finished if not backed(t, runs_dir / options.study_name, sign, monitor)]:
        print(  # a database from elsewhere may hold trials to steer the search: said, as best.yaml passes them over
            f"note: study {options.study_name} holds {len(unbacked)} finished trial(s) no run here backs (trials "
            f"{', '.join(map(str, unbacked[:5]))}{', ...' * (len(unbacked) > 5)}: no run folder with their best "
            "checkpoint): Optuna's sampler and pruner learn from them as from the others, and best.yaml passes them "
            "over. Another machine's, or runs you removed: as meant; a database from elsewhere: a study of your own "
            "(--study_name, --storage) leaves them out",
            file=sys.stderr,
        )
    run_study(study, options, fit_args, space, monitor, runs_dir)
    report(study, runs_dir / options.study_name, monitor, space, fit_args)
