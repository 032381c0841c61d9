import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_args, write_image_folder
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from template.callbacks import PredictionWriter
from template.callbacks.predictions import spreadsheet_safe
from template.cli import cli
from template.commands import main
from template.nets import ResNet18, ResNetSmall
from template.options import taken_elsewhere, without_data_options
from template.tools.sweep import example_options, read_space

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_fit_validate_test_predict_round_trip(run_cli, capsys):
    fitted = run_cli("fit", "--trainer.max_epochs", "3", "--trainer.limit_train_batches", "8")
    assert not any(isinstance(callback, PredictionWriter) for callback in fitted.trainer.callbacks)  # predict only
    run_dir = run_cli.runs_dir / "digits" / "version_0"
    summary = capsys.readouterr().out
    best = next((run_dir / "checkpoints").glob("best-epoch*.ckpt"))
    assert f"best checkpoint  {best}" in summary and f"tensorboard --logdir {run_dir}" in summary
    assert (run_dir / "config.yaml").is_file() and (run_dir / "checkpoints" / "last.ckpt").is_file()

    # Primitives only: the checkpoint loads without unpickling any object, and can resume.
    checkpoint = torch.load(best, weights_only=True)
    assert checkpoint["optimizer_states"] and checkpoint["lr_schedulers"]
    assert checkpoint["hyper_parameters"]["net"]["class_path"] == "template.nets.ResNetSmall"

    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "val/loss", "val/acc", "train/acc"} <= tags
    assert any(tag.startswith("lr") for tag in tags)
    assert len(events.Scalars("val/acc")) == 3

    for subcommand, metric in (("validate", "val/acc"), ("test", "test/acc")):
        evaluated = run_cli(subcommand, "--ckpt_path", "best")
        assert metric in evaluated.trainer.callback_metrics
        assert f"--ckpt_path best -> {best}" in capsys.readouterr().out

    predicted = run_cli("predict", "--ckpt_path", str(best))
    assert any(isinstance(callback, PredictionWriter) for callback in predicted.trainer.callbacks)
    predictions = next(run_cli.runs_dir.glob("digits/version_*/predictions.csv"))
    rows = list(csv.DictReader(predictions.open()))
    assert len(rows) == 360  # the test split of 1,797 digits
    assert {row["class_name"] for row in rows} <= {str(digit) for digit in range(10)}
    assert all(0.0 < float(row["probability"]) <= 1.0 for row in rows)
    assert rows[0]["sample"].startswith("digits[")


def test_network_swapped_from_yaml_alone(run_cli, tmp_path, recwarn):
    config = tmp_path / "resnet18.yaml"
    config.write_text("model:\n  net:\n    class_path: template.nets.ResNet18\n")
    trained = run_cli("fit", "--config", str(config), "--trainer.fast_dev_run", "true")
    assert not [w for w in recwarn if "serialize" in str(w.message)]  # no jsonargparse noise in every command
    assert isinstance(trained.model.net, ResNet18)
    assert trained.model.net.head.out_features == 10 and trained.model.net.stem[0].in_channels == 1  # linked
    assert not (tmp_path / "checkpoints").exists()  # fast_dev_run leaves no stray last.ckpt


def test_ckpt_path_alias_without_runs_is_a_clear_error(run_cli, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["test", *run_cli.tiny_args, "--ckpt_path", "best"])
    assert exit_info.value.code == 1  # bad input, as README says: one message, no usage line
    error = capsys.readouterr().err
    assert "no run with checkpoints/last.ckpt under" in error and "usage:" not in error


def test_an_evaluation_scores_trained_weights_or_is_refused_before_anything_is_written(run_cli, tmp_path):
    for command in ("validate", "test", "predict"):  # no checkpoint: a network of random weights, scored as if trained
        with pytest.raises(ValueError, match=f"^{command} with no --ckpt_path would score a network of random weights"):
            run_cli(command)
    assert not run_cli.runs_dir.exists()
    net = ResNetSmall(num_classes=10, in_channels=1)
    torch.save(net.state_dict(), tmp_path / "weights.pt")
    validated = run_cli("validate", "--weights_file", str(tmp_path / "weights.pt"), "--trainer.limit_val_batches", "1")
    assert torch.equal(validated.model.net.stem[0].weight, net.stem[0].weight)
    assert "val/acc" in validated.trainer.callback_metrics
    # Weights with a classifier for another class count: it was replaced by a new one, scored as if trained.
    torch.save(ResNetSmall(num_classes=3, in_channels=1).state_dict(), tmp_path / "three.pt")
    with pytest.raises(ValueError, match=r"^test would score a new, untrained classifier \(new classifier \(head"):
        run_cli("test", "--weights_file", str(tmp_path / "three.pt"))
    # A checkpoint's weights alone: their classes' order, preprocessing and splits are the checkpoint's to give.
    one = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1"]
    run_cli("fit", *one)
    last = str(next(run_cli.runs_dir.rglob("last.ckpt")))
    with pytest.raises(ValueError, match=f"^--weights_file {last} is a checkpoint of this template's: predict it as"):
        run_cli("predict", "--weights_file", last)
    assert run_cli("fit", "--weights_file", last, *one).trainer.current_epoch == 1  # a new run from its weights


def test_seed_everything_true_draws_a_seed_and_records_it(tmp_path, monkeypatch):
    seeds = []
    for _ in range(2):  # each a new process's: Lightning keeps the seed it set in PL_GLOBAL_SEED
        monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
        seeds.append(cli(["--seed_everything", "true", *tiny_args(tmp_path)], run=False).config.seed_everything)
    assert all(type(seed) is int for seed in seeds) and seeds[0] != seeds[1]  # Lightning's own: 0, each time
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")  # a DDP rank's, from the process that launched it
    assert cli(["--seed_everything", "true", *tiny_args(tmp_path)], run=False).config.seed_everything == 7
    monkeypatch.delenv("PL_GLOBAL_SEED")
    monkeypatch.setenv("WORLD_SIZE", "2")  # a rank torchrun started: the others would draw seeds of their own
    with pytest.raises(ValueError, match="seed_everything: true, in one of several processes started apart"):
        cli(["--seed_everything", "true", *tiny_args(tmp_path)], run=False)


def test_a_run_of_a_drawn_seed_resumes_with_that_seed_given_true_again(run_cli, monkeypatch):
    quick = ["--seed_everything", "true", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    drawn = run_cli("fit", "--trainer.max_epochs", "1", *quick).config.fit.seed_everything
    monkeypatch.delenv("PL_GLOBAL_SEED")  # a new process: the same options, as a pre-emption message says
    resumed = run_cli("fit", "--trainer.max_epochs", "2", *quick, "--ckpt_path", "last")
    assert resumed.config.fit.seed_everything == drawn  # the order of its images goes on


def test_evaluating_a_run_of_another_monitor_warns_of_no_missing_callback(run_cli, recwarn):
    quick = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    run_cli("fit", *quick, "--checkpoint.monitor", "val/loss")  # its ModelCheckpoint's state key names val/loss
    recwarn.clear()
    run_cli("validate", "--ckpt_path", "best", "--trainer.limit_val_batches", "1")  # with the recipe's (val/acc)
    assert not [w for w in recwarn if "Please add the following callbacks" in str(w.message)]


def test_a_profiler_plugs_in_from_the_command_line(tmp_path):
    runs = ["--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.accelerator", "cpu"]
    simple = cli([*runs, "--trainer.profiler", "simple"], run=False).trainer.profiler
    assert type(simple).__name__ == "SimpleProfiler"


@pytest.mark.parametrize(
    "yaml_text, named",
    [
        ("model:\n  label_smothing: 0.1\n", "label_smothing"),  # misspelt key
        ("data:\n  init_args:\n    batch_size: many\n", "batch_size"),  # wrong type
        ("trainer:\n  max_epoch: 3\n", "max_epoch"),
        ("model:\n  net:\n    class_path: template.nets.ResNet99\n", "ResNet99"),
        ("model:\n  lr_scheduler:\n    class_path: torch.optim.lr_scheduler.StepLR\n", "required: step_size"),
        # A section of arguments beside init_args too, and a class's arguments beside its class_path: the forms said.
        ("data:\n  init_args:\n    val_fraction: 0.3\n  val_fraction: 0.2\n", "one of: a class path (str); a dict"),
        ("model:\n  optimizer:\n    class_path: torch.optim.SGD\n    lr: 0.1\n", "arguments go under init_args"),
    ],
)
def test_config_errors_fail_before_training_and_name_the_key(tmp_path, capsys, yaml_text, named):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    with pytest.raises(SystemExit) as exit_info:
        cli(["fit", "--config", str(config), "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert named in error
    # One line of reason, not jsonargparse's tree of every Union member it tried, nor every option.
    assert "Union subtypes" not in error and "Given value type" not in error and len(error.splitlines()) <= 3
    assert not (tmp_path / "runs").exists()  # nothing ran


@pytest.mark.parametrize(
    "args, says",
    [
        (["--data.batch_sise", "64"], "Option 'batch_sise' is not accepted; did you mean 'batch_size'?"),
        (["--model.lr_schedulr", "x"], "did you mean 'lr_scheduler'?"),
        # An option of another DataModule (the image folders' root with the default digits: --config forgotten).
        (["--data.root", "photos"], "an option of CIFAR10DataModule, ImageFolderDataModule: choose that class first"),
        (["--data.cache_dir", "c"], "an option of ImageFolderDataModule: choose that class first (--data NAME)"),
    ],
)
def test_an_option_the_chosen_class_does_not_take_is_told_where_it_belongs(tmp_path, capsys, args, says):
    with pytest.raises(SystemExit) as exit_info:
        cli(["fit", *args, "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert says in error and len(error.splitlines()) <= 3, error
    assert not (tmp_path / "runs").exists()


def test_the_hint_for_a_refused_option_never_imports_or_fails():
    message = "Problem with given class_path 'not_imported.Module':\n  Option 'root' is not accepted"
    assert taken_elsewhere(message) == message  # a class no parse imported: the message as it was
    assert "not_imported" not in sys.modules
    # The classes to suggest come from the Union jsonargparse built from the annotation, never from a given value.
    refused = "Problem with given class_path 'template.data.DigitsDataModule':\n  Option 'root' is not accepted"
    given = f"{refused}\n  Given value: \"<class 'template.data.base.ImageDataModule'>\""
    assert taken_elsewhere(given) == given
    union = f"{refused}\n  Subtypes: [<class 'template.data.base.ImageDataModule'>, <class 'NoneType'>]"
    assert "an option of CIFAR10DataModule, ImageFolderDataModule" in taken_elsewhere(union)


@pytest.fixture
def print_config(capsys, monkeypatch):
    """`template fit ARGS --print_config`, in this process, from the repository root."""
    monkeypatch.chdir(REPO)

    def printed(*args: str) -> str:
        with pytest.raises(SystemExit) as exit_info:
            cli(["fit", *args, "--print_config"])
        assert exit_info.value.code in (0, None)
        return capsys.readouterr().out

    return printed


def test_an_option_before_a_config_that_sets_it_again_is_named(print_config, recwarn):
    """Read in order, the file's value ran: ``--data.batch_size 16 --config configs/imagefolder.yaml`` trained with
    its 32, unsaid."""
    printed = print_config(
        "--data.batch_size", "16", "--trainer.max_epochs", "1", "--config", "configs/imagefolder.yaml"
    )
    assert "batch_size: 32" in printed and "max_epochs: 1" in printed  # jsonargparse's order, as before
    said = [str(w.message) for w in recwarn if "given before a --config" in str(w.message)]
    assert len(said) == 1 and said[0].startswith("--data.batch_size given before a --config that sets it again")
    print_config("--config", "configs/imagefolder.yaml", "--data.batch_size", "16")
    print_config("--data", "template.data.DigitsDataModule", "--config", "configs/augment/light.yaml")  # its args alone
    assert not [w for w in recwarn if "given before a --config" in str(w.message)][1:]  # the right order: no more


def test_a_config_of_class_names_that_read_as_numbers_is_read_back_as_written(print_config, tmp_path):
    """Folders named 1e3 or 1.5e3 were written bare into config.yaml, which jsonargparse reads back as floats: the
    run's config.yaml, and every evaluation's of its checkpoint, failed as --config (Expected a str, got 1000.0)."""
    root = write_image_folder(tmp_path / "images", classes=("1e3", "1.5e3", "cat"), per_class=2)
    quoted = {"data": {"class_path": "ImageFolderDataModule", "init_args": {"classes": ["1e3", "1.5e3", "cat"]}}}
    (tmp_path / "record.json").write_text(json.dumps(quoted))  # as a checkpoint's record is given: JSON
    options = ["--config", str(tmp_path / "record.json"), "--data.root", str(root), "--data.image_size", "8"]
    (tmp_path / "config.yaml").write_text(print_config(*options))
    again = yaml.safe_load(print_config("--config", str(tmp_path / "config.yaml")))
    assert again["data"]["init_args"]["classes"] == ["1e3", "1.5e3", "cat"]


def test_the_recipe_defaults_are_read_from_configs_default_yaml_alone(print_config, tmp_path, monkeypatch):
    printed = yaml.safe_load(print_config())
    model = printed["model"]["init_args"]
    assert model["label_smoothing"] == 0.1 and model["optimizer"]["init_args"]["lr"] == 0.003
    recipe = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    recipe["model"]["init_args"]["optimizer"]["init_args"]["lr"] = 0.5
    recipe["trainer"]["max_epochs"] = 7
    (tmp_path / "default.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.setattr("template.options.DEFAULT_CONFIG", tmp_path / "default.yaml")
    monkeypatch.setattr("template.cli.DEFAULT_CONFIG", tmp_path / "default.yaml")
    changed = yaml.safe_load(print_config())
    assert (
        changed["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.5 and changed["trainer"]["max_epochs"] == 7
    )
    # An option given overrides the file; choosing another DataModule takes its own defaults, not the digits'.
    cifar = yaml.safe_load(print_config("--data", "template.data.CIFAR10DataModule", "--trainer.max_epochs", "3"))
    assert cifar["data"]["init_args"]["batch_size"] == 512 and cifar["trainer"]["max_epochs"] == 3


CONFIG_SETS = [
    ["configs/cifar10_resnet18.yaml"],
    ["configs/cifar10_fast.yaml"],
    ["configs/cifar10_airbench.yaml"],
    ["configs/imagefolder.yaml"],
    ["configs/imagefolder.yaml", "configs/finetune.yaml"],
    ["configs/imagefolder.yaml", "configs/augment/light.yaml"],
    ["configs/default.yaml", "configs/augment/strong.yaml"],
    ["configs/default.yaml", "configs/trainer/ddp.yaml"],
    ["configs/cifar10_resnet18.yaml", "configs/trainer/ddp_multinode.yaml"],
    ["configs/default.yaml", "configs/trainer/fast_dev_run.yaml"],
    ["configs/imagefolder.yaml", "configs/finetune_timm.yaml"],
    ["configs/logger/mlflow.yaml", "configs/logger/wandb.yaml"],
]


def test_the_config_sets_cover_every_config_file():
    listed = {path for configs in CONFIG_SETS for path in configs}
    # configs/sweep/ holds search spaces, not fit configs: each is checked against fit's options below.
    fit_configs = {path for path in (REPO / "configs").rglob("*.yaml") if path.parent.name != "sweep"}
    assert listed == {str(path.relative_to(REPO)) for path in fit_configs}


@pytest.mark.parametrize("space", sorted((REPO / "configs" / "sweep").glob("*.yaml")), ids=lambda path: path.name)
def test_every_search_space_reads_and_names_fit_options(print_config, space):
    print_config(*example_options(read_space(str(space))))  # a key that is no fit option fails to parse


@pytest.mark.parametrize("configs", CONFIG_SETS)
def test_every_config_parses_and_composes(print_config, configs):
    args = [arg for path in configs for arg in ("--config", path)]
    printed = print_config(*args)
    if "logger" in configs[0]:  # each tracker added after TensorBoard, which writes the run directory
        loggers = [logger["class_path"] for logger in yaml.safe_load(printed)["trainer"]["logger"]]
        assert [name.rsplit(".", 1)[1] for name in loggers] == ["TensorBoardLogger", "MLFlowLogger", "WandbLogger"]
    assert (REPO / configs[0]).is_file()


def test_console_script_runs():
    script = Path(sys.executable).parent / "template"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "{fit,validate,test,predict}" in result.stdout


def test_a_checkpoint_whose_datamodule_cannot_be_imported_is_refused_naming_it(run_cli, tmp_path, capsys):
    run = run_cli(
        "fit", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"
    )
    checkpoint = torch.load(run.trainer.checkpoint_callback.best_model_path, weights_only=True)
    assert checkpoint["datamodule_hyper_parameters"]["_class_path"] == "template.data.DigitsDataModule"
    checkpoint["datamodule_hyper_parameters"]["_class_path"] = "somewhere.gone.SomeDataModule"
    moved = tmp_path / "moved.ckpt"
    torch.save(checkpoint, moved)
    with pytest.raises(SystemExit) as exit_info:  # not in the registry: never imported
        main(["validate", *run_cli.tiny_args, "--ckpt_path", str(moved)])
    assert exit_info.value.code == 1
    error = capsys.readouterr().err
    assert (
        "datamodule_hyper_parameters._class_path is 'somewhere.gone.SomeDataModule', which is no data registered by the modules"
        in error
    )
    assert "name it again: --data somewhere.gone.SomeDataModule" in error


def test_a_checkpoint_is_evaluated_with_its_runs_configuration_and_options_given_override_it(run_cli, tmp_path):
    trained = run_cli(
        "fit", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
        "--data.batch_size", "16", "--data.crop_padding", "2", "--model.label_smoothing", "0.3",
    )  # fmt: skip
    last = trained.trainer.checkpoint_callbacks[-1].last_model_path or next(run_cli.runs_dir.rglob("last.ckpt"))
    quick = ["--trainer.limit_val_batches", "1"]
    evaluated = run_cli("validate", "--ckpt_path", "last", *quick)
    assert evaluated.datamodule.batch_size == 16 and evaluated.datamodule.crop_padding == 2  # the run's, not 64 and 1
    assert evaluated.model.label_smoothing == 0.3 and evaluated.model.flip_tta is False
    assert Path(evaluated.trainer.log_dir).name == "version_1"  # a new version beside the trained one
    # Options given win over the run's configuration, the model's too (Lightning alone would put the
    # checkpoint's hyper-parameters back over them).
    overridden = run_cli(
        "validate", "--ckpt_path", str(last), "--data.batch_size", "8", "--model.flip_tta", "true", *quick
    )
    assert overridden.datamodule.batch_size == 8 and overridden.model.flip_tta is True
    assert overridden.model.label_smoothing == 0.3
    # A checkpoint that left its run directory: what it records of the model and the data.
    moved = tmp_path / "elsewhere.ckpt"
    moved.write_bytes(Path(last).read_bytes())
    alone = run_cli("validate", "--ckpt_path", str(moved), *quick)
    assert alone.datamodule.batch_size == 16 and alone.model.label_smoothing == 0.3


def test_data_options_are_set_aside_with_their_values_whatever_their_form():
    argv = [
        "test",
        "--data",
        "a.B",
        "--data=c.D",
        "--data.root",
        "r",
        "--data.size=3",
        "--ckpt_path",
        "x",
        "--datax",
        "1",
    ]
    assert without_data_options(argv) == ["test", "--ckpt_path", "x", "--datax", "1"]


def mistakes(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """Ordinary mistakes: the command line, and what its one message must say."""
    no_test = write_image_folder(tmp_path / "no_test", splits=("train",))
    empty = write_image_folder(tmp_path / "empty_class", splits=("train",))
    (empty / "train" / "zebra").mkdir(exist_ok=True)
    one_class = write_image_folder(tmp_path / "one_class", classes=("cat",), per_class=20, splits=("train",))
    unreadable = write_image_folder(tmp_path / "unreadable", splits=("train",))
    (unreadable / "train" / "cat" / "broken.jpg").write_bytes(b"not an image")
    (tmp_path / "file").write_text("a file where the runs directory should be")
    torch.save(ResNetSmall(num_classes=3).state_dict(), tmp_path / "weights.pt")  # evaluated: weights, if untrained
    folder = ["--config", str(REPO / "configs" / "imagefolder.yaml"), "--data.num_workers", "0", "--data.root"]
    cache, weights = ["--data.cache_dir", str(tmp_path / "cache")], ["--weights_file", str(tmp_path / "weights.pt")]
    return {
        "no trained weights": (["test"], "test with no --ckpt_path would score a network of random weights"),
        "no test folder": (["test", *folder, str(no_test), "--data.test_fraction", "0", *cache, *weights], "no test/"),
        "no predict_path": (["predict", *folder, str(no_test), *cache, *weights], "predict needs images"),
        "an empty class folder": (["fit", *folder, str(empty), *cache], "empty class folder"),
        "a single class": (["fit", *folder, str(one_class), *cache], "only one class folder"),
        "an unreadable image": (["fit", *folder, str(unreadable), *cache], "broken.jpg"),
        "runs directory not writable": (
            ["fit", "--trainer.logger.init_args.save_dir", str(tmp_path / "file")],
            "Not a directory",
        ),
    }


@pytest.mark.slow
def test_ordinary_mistakes_end_in_one_message_and_leave_no_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    quiet = ["--trainer.enable_progress_bar", "false", "--trainer.accelerator", "cpu"]
    for mistake, (args, says) in mistakes(tmp_path).items():
        with pytest.raises(SystemExit) as exit_info:
            main([*args, *quiet])
        error = capsys.readouterr().err
        assert exit_info.value.code == 1, mistake
        assert says in error and "Traceback" not in error and "Union subtypes" not in error, (mistake, error)
        assert "TRACEBACK=1 shows the traceback" in error
        assert not (tmp_path / "runs").exists(), mistake  # no empty run directory left behind
    monkeypatch.setenv("TRACEBACK", "1")  # the switch for the whole story
    args, _ = mistakes(tmp_path)["no test folder"]
    with pytest.raises(FileNotFoundError, match="no test/ folder"):
        main([*args, *quiet])


def test_a_fit_with_checkpointing_off_trains_and_keeps_no_checkpoint(run_cli):
    """``--trainer.enable_checkpointing false`` failed on the recipe's own ModelCheckpoints (Lightning refuses any
    with it off); they now keep nothing, and the run's record says so."""
    limits = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1", "--trainer.max_epochs", "2"]
    fitted = run_cli("fit", "--trainer.enable_checkpointing", "false", *limits)
    assert fitted.trainer.current_epoch == 2
    assert not list(run_cli.runs_dir.rglob("*.ckpt"))
    record = yaml.safe_load(next(run_cli.runs_dir.rglob("config.yaml")).read_text())
    assert record["checkpoint"]["save_top_k"] == record["last_checkpoint"]["save_top_k"] == 0
    own = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint", "--trainer.callbacks.filename", "mine"]
    with pytest.raises(
        ValueError, match="enable_checkpointing is false, and trainer.callbacks holds a ModelCheckpoint"
    ):
        run_cli("fit", "--trainer.enable_checkpointing", "false", *own, *limits)  # one of yours: which is meant?


@pytest.mark.parametrize("precision", ["bf16-true", "64-true"])
def test_a_true_precision_trains_on_inputs_of_its_dtype(run_cli, precision):
    """The batch is made float (normalised) after Lightning casts it: a network in bfloat16 or float64 was fed
    float32 ("Input type (torch.FloatTensor) and weight type ... should be the same"), even the summary's example."""
    fitted = run_cli(
        "fit",
        "--trainer.precision",
        precision,
        "--trainer.fast_dev_run",
        "true",
        "--trainer.enable_model_summary",
        "true",
    )
    assert (
        next(fitted.model.net.parameters()).dtype == {"bf16-true": torch.bfloat16, "64-true": torch.float64}[precision]
    )


def test_runs_of_data_other_than_the_recipes_are_named_after_their_datamodule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_image_folder(tmp_path / "photos", per_class=4)
    photos = ["--data", "template.data.ImageFolderDataModule", "--data.root", str(tmp_path / "photos")]
    for given, name in (
        ([], "digits"),
        (photos, "imagefolder"),
        ([*photos, "--trainer.logger.init_args.name", "x"], "x"),
    ):
        built = cli([*tiny_args(tmp_path / "runs"), *given], run=False)
        assert built.trainer.logger.name == name, given  # not runs/digits for photos


def test_names_from_a_file_reach_a_csv_as_text_no_spreadsheet_runs_and_no_terminal_obeys():
    # A checkpoint's class names, an image's file name: `cat predictions.csv` must not clear or recolour the terminal.
    assert spreadsheet_safe("\x1b[2J\x1b[31mowl") == "\\x1b[2J\\x1b[31mowl"
    assert spreadsheet_safe('=HYPERLINK("x")') == '\'=HYPERLINK("x")' and spreadsheet_safe("\t=1") == "\\t=1"
    assert spreadsheet_safe("chat tigré; 2") == "chat tigré; 2"  # an ordinary name stays as it is
    alike = ["=1+1.png", "'=1+1.png", "a\nb.png", "a\\nb.png", "'x", "x"]  # each written otherwise: one id a file
    assert len({spreadsheet_safe(name) for name in alike}) == len(alike)
