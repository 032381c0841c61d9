"""Ordinary customisations give what the user asked for: no silent wrong result, no hint that leads nowhere."""

import csv
import importlib
import math
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_args, write_image_folder

from template.checkpoints import find_checkpoint, monitored_score
from template.cli import cli
from template.commands import main
from template.data import DigitsDataModule, ImageFolderDataModule
from template.options import names_checkpoint
from template.summary import kept_checkpoints
from template.tools import fits

REPO = Path(__file__).resolve().parents[1]
QUICK = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2"]


def test_switching_the_optimizer_starts_from_its_own_defaults_plus_what_is_given(tmp_path, capsys):
    args = [*tiny_args(tmp_path / "runs"), "--model.optimizer", "torch.optim.SGD", "--model.optimizer.lr", "0.1"]

    def built(*more: str):
        return cli([*args, *more], run=False).model.optimizer([torch.nn.Parameter(torch.zeros(1))])

    sgd = built()  # not the recipe's AdamW weight decay of 0.05
    assert type(sgd).__name__ == "SGD" and sgd.defaults["lr"] == 0.1 and sgd.defaults["weight_decay"] == 0
    assert built("--model.optimizer.weight_decay", "0.05").defaults["weight_decay"] == 0.05  # given: kept
    (tmp_path / "sgd.yaml").write_text("model:\n  optimizer:\n    init_args:\n      weight_decay: 0.05\n")
    assert built("--config", str(tmp_path / "sgd.yaml")).defaults["weight_decay"] == 0.05
    (tmp_path / "own.yaml").write_text(
        "model:\n  optimizer:\n    class_path: torch.optim.SGD\n    init_args: {lr: 0.003, weight_decay: 0.05}\n"
    )
    for given in (["--config", str(tmp_path / "own.yaml")], [f"--config={tmp_path / 'own.yaml'}"]):  # either form
        chosen = cli([*tiny_args(tmp_path / "runs"), *given], run=False).model.optimizer(
            [torch.nn.Parameter(torch.zeros(1))]
        )
        assert (chosen.defaults["lr"], chosen.defaults["weight_decay"]) == (0.003, 0.05), given
    (tmp_path / "evaluate.yaml").write_text("ckpt_path: best\n")
    assert names_checkpoint(["validate", f"--config={tmp_path / 'evaluate.yaml'}"])
    with pytest.raises(SystemExit):  # what --print_config shows (and sweep's best.yaml holds) is what runs
        cli(["fit", *args, "--print_config"])
    assert "weight_decay: 0\n" in capsys.readouterr().out


def test_an_option_name_must_match_exactly_and_a_misspelt_one_names_the_nearest(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["fit", *tiny_args(tmp_path / "runs"), "--trainer.max_epoch", "5"])
    error = capsys.readouterr().err
    assert "--trainer.max_epoch: no such option; did you mean --trainer.max_epochs?" in error


def test_a_path_that_reads_like_a_module_lets_no_library_import_a_file_where_you_run(tmp_path, monkeypatch):
    """``--ckpt_path tabulate.ckpt`` named ``tabulate``: a library's ``import tabulate`` then ran tabulate.py of an
    unpacked archive. Only the class paths jsonargparse imports, and their own imports, come from where you run."""
    import jsonargparse

    from template.imports import OwnModules, named_modules

    for planted in ("plantedtab", "plantedtf"):  # as a library's optional imports would be named
        (tmp_path / f"{planted}.py").write_text(f"open({str(tmp_path / planted)!r} + '-ran', 'w')\n")
    (tmp_path / "my_nets.py").write_text("import my_layers\n\n\nclass Net(my_layers.Base):\n    pass\n")
    (tmp_path / "my_layers.py").write_text("class Base:\n    pass\n")
    args = [
        "predict",
        "--ckpt_path",
        "plantedtab.ckpt",
        "--data.predict_path",
        "plantedtf.images",
        "--net",
        "my_nets.Net",
    ]
    finder = OwnModules(str(tmp_path), named_modules(args))
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, finder])
    monkeypatch.setattr(sys, "modules", dict(sys.modules))  # the modules found here leave with the test
    for planted in ("plantedtab", "plantedtf"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(planted)  # as a library's `try: import tabulate` asks
        assert not (tmp_path / f"{planted}-ran").exists()
    parser = jsonargparse.ArgumentParser()
    parser.add_argument("--net", type=type)
    assert parser.parse_args(["--net", "my_nets.Net"]).net.__module__ == "my_nets"  # and its own import, found


@pytest.mark.parametrize(
    "options, named",
    [
        (["--trainer.accumulate_grad_batches", "0"], "trainer.accumulate_grad_batches=0: at least 1"),
        (["--data.val_fraction", "0"], "data.val_fraction=0.0, data.test_fraction=0.2: each must be above 0"),
    ],
)
def test_a_value_no_run_can_take_is_refused_naming_its_option(tmp_path, capsys, options, named):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args(tmp_path / "runs"), "--trainer.max_epochs", "1", *options])
    assert exit_info.value.code == 1 and named in capsys.readouterr().err


@pytest.mark.slow
def test_evaluating_a_limited_training_run_evaluates_the_whole_split_and_says_how_many(run_cli, capsys):
    run_cli("fit", *QUICK, "--trainer.limit_val_batches", "1")
    capsys.readouterr()
    evaluated = run_cli("validate", "--ckpt_path", "best")
    assert evaluated.trainer.limit_val_batches == 1.0  # the training run's limit is not inherited
    size = len(evaluated.datamodule.datasets["val"])
    acc = float(evaluated.trainer.callback_metrics["val/acc"])
    assert f"val/acc {acc:.4f} on {size} images (the whole split)" in capsys.readouterr().out
    run_cli("validate", "--ckpt_path", "best", "--trainer.limit_val_batches", "1")  # this command's own limit
    assert f"on 64 images (of {size}: limited by this command's options)" in capsys.readouterr().out


def test_validation_and_test_images_come_with_the_classes_in_turn():
    data = DigitsDataModule()
    data.setup("validate")
    data.setup("test")
    for split in ("val", "test"):
        labels = data.datasets[split].labels.numpy()
        assert sorted(labels[:10]) == list(range(10)), split  # any prefix balanced: a limited run sees every class
        assert np.bincount(labels[:50]).min() == 5


@pytest.mark.slow
def test_a_copied_checkpoint_is_evaluated_under_its_own_name_with_no_untrue_warning(run_cli, tmp_path):
    trained = run_cli("fit", *QUICK, "--trainer.logger.init_args.name", "ants_bees")
    copied = tmp_path / "downloads" / "bees_v2.ckpt"
    copied.parent.mkdir()
    shutil.copy(trained.trainer.checkpoint_callback.best_model_path, copied)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        predicted = run_cli("predict", "--ckpt_path", str(copied))
    assert Path(predicted.trainer.log_dir) == run_cli.runs_dir / "bees_v2" / "version_0"
    assert not [str(w.message) for w in caught if "ModelCheckpoint" in str(w.message)]
    tested = run_cli("test", "--ckpt_path", trained.trainer.checkpoint_callback.best_model_path)
    assert Path(tested.trainer.log_dir) == run_cli.runs_dir / "ants_bees" / "version_1"  # beside its run


def test_a_source_without_a_test_split_says_so_in_its_init(run_cli, capsys, monkeypatch, tmp_path):
    (tmp_path / "no_test.py").write_text(
        "from template.data import DigitsDataModule\n\n\nclass NoTest(DigitsDataModule):\n"
        "    def __init__(self, **kwargs):\n        super().__init__(**kwargs)\n        self.has_test = False\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run_cli("fit", *QUICK, "--data", "no_test.NoTest")
    summary = capsys.readouterr().out
    assert "best checkpoint" in summary and "test it, once" not in summary
    sys.modules.pop("no_test", None)


@pytest.mark.slow
def test_the_console_script_finds_your_module_in_the_working_directory_as_python_m_does(tmp_path):
    """`template fit --model my_module.F1Module` ended in "No module named 'my_module'" (a console script's sys.path
    holds its own folder, not the working directory), and so did the summary's test command and the advice to name
    the module again; `export` refused the module with advice (--model) it did not take."""
    (tmp_path / "my_module.py").write_text(
        "import my_helpers\nfrom template.module import ClassificationModule\n\n\nclass F1Module(ClassificationModule):\n"
        "    pass\n"
    )
    (tmp_path / "my_helpers.py").write_text("")  # your module's own imports from here are found too
    # A file named as an installed package (imported only once training starts) is not taken for it, nor one named
    # as a module a library imports if it can (torch imports tabulate at exit): run in a stranger's folder, they ran.
    for planted in ("tensorboard", "tabulate", "tensorflow", "torch_xla", "inspect", "tokenize"):
        (tmp_path / f"{planted}.py").write_text("open('planted-module-ran', 'w')\n")
    quick = [
        *tiny_args(tmp_path / "runs"),
        *QUICK,
        "--trainer.limit_val_batches",
        "1",
        "--trainer.limit_test_batches",
        "1",
    ]

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [str(Path(sys.executable).parent / "template"), *args]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    fit = run("fit", "--model", "my_module.F1Module", *quick)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert not (tmp_path / "planted-module-ran").exists()
    assert "LeafSpec" not in fit.stderr  # Lightning's deprecation, nothing of yours: not on every command
    summary_says = shlex.split(re.search(r"test it, once: +(.*)", fit.stdout).group(1))
    assert summary_says[:2] == ["template", "test"] and summary_says[-2:] == ["--model", "my_module.F1Module"]
    tested = run(*summary_says[1:], *quick)  # as the summary says: your module named again
    assert tested.returncode == 0 and "test/acc" in tested.stdout, tested.stderr[-3000:]
    command = [sys.executable, "-m", "template", *summary_says[1:], *quick]  # -m puts the folder first on the path
    tested = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert not (tmp_path / "planted-module-ran").exists()
    assert tested.returncode == 0 and "test/acc" in tested.stdout, tested.stderr[-3000:]
    export = ["export", "--ckpt_path", summary_says[3], "--format", "safetensors", "--output", "net.safetensors"]
    advice = re.search(r"name it again: (--model \S+);", run(*export).stderr).group(1)  # not registered
    named_again = run(*export, *advice.split())
    assert named_again.returncode == 0 and "parity" in named_again.stdout, named_again.stderr[-3000:]


def test_fast_dev_run_says_it_wrote_nothing(run_cli, capsys):
    run_cli("fit", "--trainer.fast_dev_run", "true")
    out = capsys.readouterr().out
    assert "nothing written (no run directory, no checkpoint)" in out and "tensorboard --logdir" not in out


@pytest.mark.slow
def test_a_ddp_batch_too_large_names_the_option_that_decides_it_once(tmp_path):
    command = [sys.executable, "-m", "template", "fit", "--config", str(REPO / "configs" / "trainer" / "ddp.yaml"),
               "--trainer.devices", "2", "--trainer.accelerator", "cpu", "--data.global_batch_size", "4096",
               "--data.batch_size", "16"]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert result.stderr.count("under half a batch each") == 1, result.stderr[-3000:]
    assert "(data.global_batch_size=4096 over 2 device(s), 2048 each)" in result.stderr
    assert "lower data.global_batch_size" in result.stderr


def test_make_fit_installs_what_training_needs_and_nothing_of_the_dev_extra(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    shutil.copy(REPO / "Makefile", clone / "Makefile")  # this checkout's, committed or not
    plan = subprocess.run(["make", "-n", "fit"], cwd=clone, capture_output=True, text=True, check=True).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs == [".venv/bin/pip install --quiet -e ."], plan
    plan = subprocess.run(["make", "-n", "test"], cwd=clone, capture_output=True, text=True, check=True).stdout
    assert ".venv/bin/pip install --quiet -e '.[dev]'" in plan


def test_every_problem_of_an_image_folder_is_reported_in_one_pass_grouped(tmp_path):
    root = write_image_folder(tmp_path / "images", per_class=4, splits=("train", "test"))
    (root / "train" / "zebra").mkdir()  # an empty class folder
    (root / "train" / "cat" / "broken.jpg").write_bytes(b"not a jpeg")
    (root / "test" / "dog" / "cut.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ValueError) as error:
        ImageFolderDataModule(str(root), num_workers=0, cache_dir=str(tmp_path / "cache"))
    said = str(error.value)
    assert said.startswith(f"3 problems in {root}:")
    assert "1 empty class folder(s)" in said and "train/zebra" in said
    assert f"unreadable file(s) in {root / 'train'}" in said and "broken.jpg" in said
    assert f"unreadable file(s) in {root / 'test'}" in said and "cut.png" in said


def test_the_modules_a_command_names_are_found_in_its_configs_and_the_configs_they_name(tmp_path, monkeypatch):
    """Only they are imported from the working directory: named on the command line, in a --config file (also as
    --config=file), or in a config that one names, relative to the naming file's folder as jsonargparse reads it."""
    from template.imports import named_modules

    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs" / "model").mkdir(parents=True)
    (tmp_path / "configs" / "exp.yaml").write_text("model: model/f1.yaml\ndata:\n  class_path: my_data.Npz\n")
    (tmp_path / "configs" / "model" / "f1.yaml").write_text("class_path: my_module.F1Module\n")
    names = named_modules(["fit", "--config=configs/exp.yaml", "--model.net", "my_nets.Net"])
    assert {"my_module", "my_data", "my_nets"} <= names and "tabulate" not in names


@pytest.mark.parametrize(
    "options, named",
    [
        (["--model.num_classes", "5"], "model.num_classes=5, but the data gives 10"),
        (["--model.class_names", "[a, b]"], "model.class_names=['a', 'b'], but the data gives ['0', '1'"),
        (["--model.net.num_classes", "5"], "model.net.num_classes=5, but the data gives 10"),
        (["--model.net.in_channels", "4"], "model.net.in_channels=4, but the data gives 1"),
        (["--model.net", "torchvision.models.resnet18", "--model.net.num_classes", "5"], "=5, but the data gives 10"),
    ],
)
def test_a_size_the_data_decides_is_not_replaced_without_a_word_when_given_otherwise(tmp_path, capsys, options, named):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args(tmp_path / "runs"), "--trainer.fast_dev_run", "true", *options])
    assert exit_info.value.code == 1 and named in capsys.readouterr().err
    given_as_the_data_says = cli([*tiny_args(tmp_path / "runs"), "--model.net.num_classes", "10"], run=False)
    assert given_as_the_data_says.model.net.head.out_features == 10


def test_another_monitored_metric_is_kept_at_its_best_not_at_the_recipes_maximum(tmp_path, capsys):
    def mode(*options: str) -> str:
        built = cli([*tiny_args(tmp_path / "runs"), *options], run=False)
        return next(
            c.mode for c in built.trainer.callbacks if getattr(c, "monitor", None) == built.config.checkpoint.monitor
        )

    assert mode() == "max"  # the recipe's val/acc
    assert mode("--checkpoint.monitor", "val/loss") == "min"  # not the recipe's max: that kept the worst epoch
    for monitor, kept in {"val_err": "min", "val/AUC": "max", "val/mIoU": "max", "val/referral_acc": "max"}.items():
        assert mode("--checkpoint.monitor", monitor) == kept, monitor
    assert mode("--checkpoint.monitor=val/loss", "--checkpoint.mode", "max") == "max"  # given: as given
    (tmp_path / "monitor.yaml").write_text("checkpoint:\n  monitor: val/loss\n  mode: max\n")
    assert mode("--config", str(tmp_path / "monitor.yaml")) == "max"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args(tmp_path / "runs"), "--checkpoint.monitor", "val/kappa"])
    assert (
        exit_info.value.code == 1 and "checkpoint.monitor=val/kappa: is a higher or a lower" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "watcher",
    [
        ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val/acc"],  # Lightning's mode: min
        ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor", "val/acc"],
        ["--model.lr_scheduler", "torch.optim.lr_scheduler.ReduceLROnPlateau", "--model.scheduler_monitor", "val/acc"],
        ["--model.lr_scheduler", "torch.optim.lr_scheduler.ReduceLROnPlateau", "--model.lr_scheduler.mode", "max"],
    ],
)
def test_a_watcher_of_the_recipes_metrics_the_wrong_way_round_is_refused_before_training(tmp_path, capsys, watcher):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args(tmp_path / "runs"), *QUICK, *watcher])
    better = "max" if "val/acc" in watcher else "min"  # the plateau schedule's own default monitor: val/loss
    assert exit_info.value.code == 1 and f"set its mode to {better}" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing trained, nothing written


@pytest.mark.parametrize(
    "watcher",
    [
        ["--checkpoint.mode", "max", "--checkpoint.monitor", "val/acuracy"],
        ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val/los"],
        ["--model.lr_scheduler", "torch.optim.lr_scheduler.ReduceLROnPlateau", "--model.scheduler_monitor", "val_loss"],
    ],
)
def test_a_watcher_of_a_validation_metric_never_logged_is_refused_before_training(run_cli, watcher):
    """A misspelt metric stopped the run after its first epoch (Lightning's check, at the first validation's end)."""
    refused = rf"watches {watcher[-1]}, which validation does not log; it logs val/acc, val/loss"
    with pytest.raises(ValueError, match=refused):
        run_cli("fit", *QUICK, "--trainer.limit_val_batches", "1", *watcher)
    assert not list(run_cli.runs_dir.rglob("*.ckpt"))  # refused after the sanity check: nothing trained


def test_a_watcher_of_your_modules_metric_logged_after_the_sanity_check_is_warned_of(run_cli, tmp_path, monkeypatch):
    """A module of yours may log a metric after the sanity check alone: refused, its fit would have run through."""
    (tmp_path / "late_metric.py").write_text(
        "from template.module import ClassificationModule\n\n\nclass LateMetric(ClassificationModule):\n"
        "    def on_validation_epoch_end(self):\n        super().on_validation_epoch_end()\n"
        "        if not self.trainer.sanity_checking:\n            self.log('val_late', 1.0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    late = ["--model", "late_metric.LateMetric", "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor"]
    late += ["val_late", "--trainer.callbacks.mode", "min", "--trainer.limit_val_batches", "1"]
    with pytest.warns(UserWarning, match="EarlyStopping watches val_late, which validation does not log; it logs val/"):
        fitted = run_cli("fit", *QUICK, *late)
    assert fitted.trainer.global_step == 2  # trained


LIMITED = ["--trainer.limit_val_batches", "2"]
OWN_STEPS = """import torch.nn.functional as F
from template.module import ClassificationModule


class OwnSteps(ClassificationModule):  # Lightning's docs' steps, no super(): the recipe's metrics see no batch
    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch[0]), batch[1])
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        logits = self(batch[0])
        self.log("val/acc", (logits.argmax(1) == batch[1]).float().mean())
        self.log("val/loss", F.cross_entropy(logits, batch[1]))


class AccuracyOnly(ClassificationModule):  # feeds the recipe's accuracy alone: its loss is left unlogged, not NaN
    def validation_step(self, batch, batch_idx):
        self.val_acc.update(self(batch[0]), batch[1])
"""


def test_steps_of_your_own_log_their_metrics_never_the_recipes_unfed_ones(run_cli, tmp_path, monkeypatch):
    """The recipe's epoch-end hooks logged its metrics, fed no batch, over yours: val/acc 0.0 and val/loss nan every
    epoch, the best checkpoint the first epoch's; train/acc 0.0 every epoch."""
    (tmp_path / "own_steps.py").write_text(OWN_STEPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    fitted = run_cli("fit", *QUICK, "--model", "own_steps.OwnSteps", *LIMITED)
    rows = list(csv.DictReader((Path(fitted.trainer.log_dir) / "metrics.csv").open()))
    assert rows and all(0.0 < float(row["val/acc"]) and math.isfinite(float(row["val/loss"])) for row in rows)
    assert "train/acc" not in fitted.trainer.callback_metrics  # none measured: none logged
    fitted = run_cli("fit", *QUICK, "--model", "own_steps.AccuracyOnly", *LIMITED)
    best = fitted.trainer.checkpoint_callback.best_model_path  # val/loss unlogged: not refused as NaN outputs
    evaluated = run_cli("validate", "--model", "own_steps.AccuracyOnly", "--ckpt_path", best, *LIMITED)
    assert "val/acc" in evaluated.trainer.callback_metrics and "val/loss" not in evaluated.trainer.callback_metrics


def test_a_fit_without_a_logger_never_writes_over_another_runs_checkpoints(run_cli, tmp_path):
    """With --trainer.logger false, Lightning writes to ./checkpoints: a second such fit wrote its last.ckpt over the
    first's, and its bests beside them (best-epoch000-v1.ckpt), with a warning alone."""
    unlogged = [*QUICK, "--trainer.limit_val_batches", "1", "--trainer.logger", "false"]
    run_cli("fit", *unlogged)
    last = tmp_path / "checkpoints" / "last.ckpt"
    written = last.read_bytes()
    with pytest.raises(ValueError, match=r"checkpoints/last.ckpt is another run's: a new fit with --trainer.logger f"):
        run_cli("fit", *unlogged)
    assert last.read_bytes() == written
    run_cli("validate", "--ckpt_path", str(last), *unlogged[-4:])  # evaluated, and resumed, in its place
    assert run_cli("fit", *unlogged, "--ckpt_path", str(last), "--trainer.max_epochs", "2").trainer.current_epoch == 2


def test_a_watcher_of_your_own_metric_against_its_name_is_warned_of(run_cli):
    own = ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val_err", "--trainer.callbacks.mode"]
    with pytest.warns(UserWarning, match="EarlyStopping watches val_err with mode=max, where its name says lower"):
        run_cli("fit", *QUICK, "--trainer.limit_val_batches", "1", *own, "max", "--trainer.callbacks.strict", "false")


def test_a_second_model_checkpoint_of_yours_never_takes_the_place_of_the_recipes_best(run_cli, tmp_path, capsys):
    """A ModelCheckpoint a user adds (the best train/acc) comes before the recipe's in the callbacks: the summary,
    --ckpt_path best, cv and sweep took the first monitored one, and ranked runs by its metric as val/acc."""
    own = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor", "train/acc"]
    own += ["--trainer.callbacks.mode", "max", "--trainer.callbacks.filename", "trainacc-{epoch}"]
    epochs = ["--trainer.max_epochs", "3", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    built = run_cli("fit", *epochs, *own)
    best, last = kept_checkpoints(built)
    assert (best.monitor, last.monitor, Path(last.best_model_path).name) == ("val/acc", None, "last.ckpt")
    assert Path(best.best_model_path).name.startswith("best-epoch")
    assert f"best val/acc     {float(best.best_model_score):.4f}" in capsys.readouterr().out
    assert find_checkpoint("best", run_cli.runs_dir, "val/acc") == Path(best.best_model_path)
    with pytest.raises(ValueError, match="holds best checkpoints by train/acc, val/acc: give --checkpoint"):
        find_checkpoint("best", run_cli.runs_dir)  # export's: no metric to choose by
    scored = fits.fit([*tiny_args(tmp_path / "runs"), *epochs, *own], ("cv", "fold_0"))
    assert (
        Path(scored.best_checkpoint).name.startswith("best-epoch")
        and scored.score == monitored_score(Path(scored.best_checkpoint))[1]
    )


def test_a_checkpoint_callback_like_the_recipes_own_is_told_what_the_recipe_keeps(tmp_path, capsys):
    """Every epoch's checkpoint, asked for as users do: its state key is last_checkpoint's, and Lightning's error
    named neither that callback nor a way out."""
    every_epoch = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_epochs", "1"]
    with pytest.raises(SystemExit):
        main(["fit", *tiny_args(tmp_path / "runs"), *QUICK, *every_epoch, "--trainer.callbacks.save_top_k", "-1"])
    error = capsys.readouterr().err
    assert "The recipe keeps two already: checkpoint" in error and "--checkpoint.save_top_k -1" in error


def test_a_plain_lightning_datamodule_is_told_which_class_to_extend(tmp_path, monkeypatch, capsys):
    (tmp_path / "plain_data.py").write_text(
        "import lightning as L\n\n\nclass PlainData(L.LightningDataModule):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit):
        main(["fit", *tiny_args(tmp_path / "runs"), "--data", "plain_data.PlainData"])
    assert "extends template.data.ImageDataModule (README: Swap the data)" in capsys.readouterr().err


def test_a_best_score_of_part_of_the_validation_split_says_so(run_cli, capsys):
    """validate said "on 64 images (of 180: limited...)", the fit's summary only "best val/acc 0.4531"."""
    fitted = run_cli("fit", *QUICK, "--trainer.limit_val_batches", "1")
    count, size = fitted.model.images_evaluated["val"], len(fitted.datamodule.datasets["val"])
    assert count < size and f"on {count} of {size} val images (limited by" in capsys.readouterr().out
    run_cli("fit", *QUICK)
    assert re.search(r"best val/acc +[0-9.]+\n", capsys.readouterr().out)  # the whole split: as it was
    # A resume that trains nothing validates only in the sanity check: its two batches were counted as the score's.
    run_cli("fit", *QUICK, "--ckpt_path", "last")
    assert re.search(r"best val/acc +[0-9.]+\n", capsys.readouterr().out)


def test_a_run_without_a_logger_trains_and_promises_no_curves(run_cli, capsys):
    run_cli("fit", "--trainer.logger", "false", *QUICK, "--trainer.limit_val_batches", "1")
    out = capsys.readouterr().out
    assert "best val/acc" in out and "tensorboard --logdir" not in out  # and no LearningRateMonitor error


def test_a_plateau_schedule_steps_at_each_validation_and_one_without_its_metric_names_the_option(run_cli, capsys):
    """Stepped each epoch under check_val_every_n_epoch 2, it failed after the first: val/loss was not measured yet."""
    plateau = ["--model.lr_scheduler", "torch.optim.lr_scheduler.ReduceLROnPlateau", "--model.lr_scheduler.patience"]
    plateau += ["0", "--model.lr_scheduler.threshold", "10", "--trainer.limit_val_batches", "1"]  # no gain counts
    every = [
        "--trainer.check_val_every_n_epoch",
        "2",
        "--trainer.max_epochs",
        "4",
        "--trainer.limit_train_batches",
        "2",
    ]
    trained = run_cli("fit", *plateau, *every)
    assert trained.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.003 * 0.1**2)  # cut at each
    trained = run_cli("fit", *plateau, *every, "--model.scheduler_monitor", "train/loss")  # measured every epoch
    assert trained.trainer.lr_scheduler_configs[0].frequency == 1
    with pytest.raises(SystemExit):
        main(["fit", *run_cli.tiny_args, *QUICK, *plateau, "--model.scheduler_monitor", "train/los"])
    assert "train/los which is not available" in (err := capsys.readouterr().err) and "(model.scheduler_monitor)" in err


@pytest.mark.parametrize(
    "started, chosen",
    [
        (["val/loss"], ("val/loss", "min")),
        (["train/images_per_sec", "--checkpoint.mode", "max"], ("train/images_per_sec", "max")),
    ],
)
def test_a_resume_chooses_its_best_checkpoint_by_its_runs_metric_unless_told_otherwise(run_cli, started, chosen):
    run_cli("fit", "--checkpoint.monitor", *started, *QUICK, "--trainer.limit_val_batches", "1")
    resumed = run_cli("fit", "--ckpt_path", "last", "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "2",
                      "--trainer.limit_val_batches", "1")  # fmt: skip
    best = resumed.trainer.checkpoint_callback
    assert (best.monitor, best.mode) == chosen  # not the recipe's val/acc, max: two metrics in one run
    assert resumed.trainer.logger.log_dir.endswith("version_0")


def test_best_finds_the_best_checkpoint_whatever_its_filename(run_cli):
    fitted = run_cli("fit", "--checkpoint.filename", "ep{epoch}-{val/acc:.3f}", "--trainer.max_epochs", "2",
                     "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1")  # fmt: skip
    tested = run_cli("test", "--ckpt_path", "best", "--trainer.limit_test_batches", "1")
    assert tested.trainer.ckpt_path == fitted.trainer.checkpoint_callback.best_model_path


def test_a_runs_config_yaml_reruns_it_anew_wherever_the_run_was_placed(run_cli):
    """A version given (as sweep and cv place their runs: trial_007, fold_1) is not recorded: --config of the
    run's config.yaml trains a run of its own, never refused for writing into the one it records."""
    first = run_cli("fit", "--trainer.logger.init_args.version", "fold_1", *QUICK, "--trainer.limit_val_batches", "1")
    config = Path(first.trainer.log_dir) / "config.yaml"
    again = run_cli("fit", "--config", str(config), *QUICK, "--trainer.limit_val_batches", "1")
    assert Path(again.trainer.log_dir).name == "version_0" and Path(first.trainer.log_dir).name == "fold_1"
