"""A stranger's checkpoint of plain values runs nothing, imports nothing and deletes nothing."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import tiny_args

from template.checkpoints import (
    CheckpointError,
    DamagedCheckpointError,
    UnsafeCheckpointError,
    find_checkpoint,
    load_checkpoint,
    read_checkpoint,
)
from template.cli import cli
from template.module import ClassificationModule

SENTINEL = "sentinel_{name}"
SENTINEL_CODE = "from pathlib import Path\nPath({marker!r}).touch()\nclass Net: pass\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A real checkpoint of one short epoch, written by the CLI."""
    root = tmp_path_factory.mktemp("trained")
    here = os.getcwd()
    os.chdir(root)
    try:
        cli(["fit", *tiny_args(root / "runs"), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3"])
    finally:
        os.chdir(here)
    return root / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"


def attacks(marker: Path, sentinel: str) -> dict[str, tuple[str, dict]]:
    """Each attack: the key it is refused at, and what it changes in the checkpoint's hyper-parameters."""
    shell = {"class_path": "os.system", "init_args": {"command": f"touch {marker}"}}
    popen = {"class_path": "subprocess.Popen", "init_args": {"args": ["touch", str(marker)]}}
    resnet = {"class_path": "torchvision.models.ResNet", "init_args": {"block": "torchvision.models.resnet.BasicBlock"}}
    quantizable = "torchvision.models.quantization.QuantizableResNet"
    return {
        "optimizer": ("hyper_parameters.optimizer.class_path", {"optimizer": shell}),
        "scheduler": ("hyper_parameters.lr_scheduler.class_path", {"lr_scheduler": shell}),
        "network": ("hyper_parameters.net.class_path", {"net": {"class_path": f"{sentinel}.Net"}}),
        "nested network argument": (
            "hyper_parameters.net.init_args.norm_layer.class_path",
            {"net": {**resnet, "init_args": {**resnet["init_args"], "layers": [1, 1, 1, 1], "norm_layer": popen}}},
        ),
        "data": ("datamodule_hyper_parameters._class_path", {"data": f"{sentinel}.Net"}),
        "instantiator": ("hyper_parameters._instantiator", {"_instantiator": "os.system"}),
        # jsonargparse reads the dots as a path into the config: a class path the check must not miss.
        "dotted key": ("hyper_parameters key", {"net.class_path": f"{sentinel}.Net"}),
        # An argument whose annotation does not resolve (torch's own, here): its strings are checked all the same.
        "unreadable annotation": (
            "hyper_parameters.net.init_args.model",
            {"net": {"class_path": "torch.optim.swa_utils.AveragedModel", "init_args": {"model": f"{sentinel}.Net"}}},
        ),
        # An argument passed on through **kwargs to a parent class's signature.
        "argument through **kwargs": (
            "hyper_parameters.net.init_args.norm_layer",
            {
                "net": {
                    "class_path": quantizable,
                    "init_args": {**resnet["init_args"], "layers": [1, 1, 1, 1], "norm_layer": f"{sentinel}.Net"},
                }
            },
        ),
        "a __main__ module": ("hyper_parameters.net.class_path", {"net": {"class_path": "template.__main__.Net"}}),
    }


def doctor(trained: Path, tmp_path: Path, change: dict) -> Path:
    checkpoint = torch.load(trained, weights_only=True)
    if "data" in change:
        checkpoint["datamodule_hyper_parameters"]["_class_path"] = change.pop("data")
    checkpoint["hyper_parameters"].update(change)
    path = tmp_path / "doctored.ckpt"
    torch.save(checkpoint, path)  # tensors, dicts and strings: weights_only loads it
    return path


@pytest.fixture
def sentinel(tmp_path, monkeypatch, request):
    """A module on sys.path that leaves a marker when imported."""
    name = SENTINEL.format(name=abs(hash(request.node.name)))
    marker = tmp_path / "imported"
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / f"{name}.py").write_text(SENTINEL_CODE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    yield name, marker
    sys.modules.pop(name, None)


@pytest.mark.parametrize("attack", list(attacks(Path("m"), "s")))
@pytest.mark.parametrize("command", ["validate", "test", "predict", "fit"])
def test_a_checkpoint_naming_code_is_refused_by_every_command(
    trained, tmp_path, sentinel, attack, command, capsys, monkeypatch
):
    name, imported = sentinel
    ran = tmp_path / "ran"
    key, change = attacks(ran, name)[attack]
    path = doctor(trained, tmp_path, change)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli([command, *tiny_args(tmp_path / "runs"), "--ckpt_path", str(path), "--trainer.max_epochs", "2"])
    assert exit_info.value.code != 0
    error = capsys.readouterr().err
    assert f"refusing {path}" in error and key in error and "No untrusted module was imported" in error
    assert not ran.exists() and not imported.exists() and name not in sys.modules


@pytest.mark.parametrize("attack", list(attacks(Path("m"), "s")))
def test_load_from_checkpoint_refuses_a_checkpoint_naming_code(trained, tmp_path, sentinel, attack):
    name, imported = sentinel
    ran = tmp_path / "ran"
    key, change = attacks(ran, name)[attack]
    path = doctor(trained, tmp_path, change)
    with pytest.raises(UnsafeCheckpointError, match=key.replace(".", r"\.")):
        ClassificationModule.load_from_checkpoint(path, weights_only=True)  # the notebook's call
    with pytest.raises(UnsafeCheckpointError, match=key.replace(".", r"\.")):
        load_checkpoint(path)  # what export and load_weights read with
    assert not ran.exists() and not imported.exists() and name not in sys.modules


def test_a_refused_checkpoint_exits_non_zero_from_the_command_line(trained, tmp_path, sentinel):
    name, imported = sentinel
    ran = tmp_path / "ran"
    path = doctor(trained, tmp_path, attacks(ran, name)["optimizer"][1])
    environment = {**os.environ, "PYTHONPATH": f"{tmp_path / 'modules'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(
        [sys.executable, "-m", "template", "validate", "--ckpt_path", str(path), "--trainer.accelerator", "cpu"],
        cwd=tmp_path, capture_output=True, text=True, env=environment, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0 and "hyper_parameters.optimizer.class_path" in result.stderr
    assert not ran.exists() and not imported.exists()


def test_a_trusted_module_may_be_named_once_listed(trained, tmp_path, sentinel, monkeypatch):
    name, imported = sentinel
    path = doctor(trained, tmp_path, {"data": f"{name}.Net"})
    monkeypatch.setenv("CHECKPOINT_TRUSTED_MODULES", f"somewhere_else, {name}")
    with pytest.raises(UnsafeCheckpointError, match="not a lightning.pytorch.core.datamodule.LightningDataModule"):
        read_checkpoint(path, ClassificationModule)  # imported now: the user trusts it; but it is no DataModule
    assert imported.exists()


def test_the_checkpoints_the_template_writes_pass_every_check(trained):
    checkpoint = read_checkpoint(trained, ClassificationModule)
    assert checkpoint["integrity"]["algorithm"] == "sha256"
    model = ClassificationModule.load_from_checkpoint(trained, weights_only=True)
    assert torch.equal(model.net.head.weight, checkpoint["state_dict"]["net.head.weight"])


def test_flipped_bytes_in_a_weight_are_refused(trained, tmp_path, capsys, monkeypatch):
    damaged = tmp_path / "damaged.ckpt"
    data = bytearray(trained.read_bytes())
    tensor = torch.load(trained, weights_only=True)["state_dict"]["net.head.weight"]
    at = data.find(tensor.numpy().tobytes()[:64])  # the tensor's bytes, stored as they are in the zip
    assert at > 0
    data[at : at + 64] = bytes(b ^ 0xFF for b in data[at : at + 64])
    damaged.write_bytes(bytes(data))
    assert not torch.equal(torch.load(damaged, weights_only=True)["state_dict"]["net.head.weight"], tensor)
    with pytest.raises(DamagedCheckpointError, match="tensors differ from the digest"):
        load_checkpoint(damaged)
    with pytest.raises(DamagedCheckpointError):
        ClassificationModule.load_from_checkpoint(damaged, weights_only=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DamagedCheckpointError, match=f"{damaged} is damaged"):
        cli(["validate", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(damaged)])


def test_a_checkpoint_from_another_tool_loads_with_a_note(trained, tmp_path, caplog):
    checkpoint = torch.load(trained, weights_only=True)
    del checkpoint["integrity"]
    torch.save(checkpoint, tmp_path / "other.ckpt")
    with caplog.at_level("INFO"):
        loaded = load_checkpoint(tmp_path / "other.ckpt")
    assert "carries no digest" in caplog.text and loaded["state_dict"].keys() == checkpoint["state_dict"].keys()


def test_a_plain_state_dict_or_malformed_checkpoint_is_named_as_such(trained, tmp_path, capsys, monkeypatch):
    weights = torch.load(trained, weights_only=True)["state_dict"]
    torch.save(weights, tmp_path / "weights.pt")
    with pytest.raises(CheckpointError, match="not a Lightning checkpoint"):
        read_checkpoint(tmp_path / "weights.pt")
    malformed = torch.load(trained, weights_only=True)
    malformed["callbacks"] = ["not", "a", "dict"]
    torch.save(malformed, tmp_path / "malformed.ckpt")
    monkeypatch.chdir(tmp_path)
    for path, says in (("weights.pt", "not a Lightning checkpoint"), ("malformed.ckpt", "its callbacks is a list")):
        with pytest.raises(SystemExit):
            cli(["validate", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(tmp_path / path)])
        assert says in capsys.readouterr().err


def test_a_legacy_format_checkpoint_of_plain_values_is_not_refused(trained, tmp_path):
    checkpoint = torch.load(trained, weights_only=True)
    torch.save(checkpoint, tmp_path / "legacy.ckpt", _use_new_zipfile_serialization=False)
    loaded = read_checkpoint(tmp_path / "legacy.ckpt", ClassificationModule)
    assert torch.equal(loaded["state_dict"]["net.head.weight"], checkpoint["state_dict"]["net.head.weight"])


@pytest.mark.slow
def test_resuming_never_deletes_what_a_checkpoint_points_outside_its_run(trained, tmp_path, capsys, monkeypatch):
    run = tmp_path / "runs" / "digits" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text((trained.parent.parent / "config.yaml").read_text())
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    outside = str(run / "checkpoints" / ".." / ".." / ".." / ".." / "precious")
    checkpoint = torch.load(trained, weights_only=True)
    del checkpoint["integrity"]  # a digest detects damage, not intent: an attacker writes a new one or none
    for name, state in checkpoint["callbacks"].items():
        if name.startswith("ModelCheckpoint"):
            state.update(dirpath=str(run / "checkpoints"), best_model_path=outside, kth_best_model_path=outside)
            state.update(last_model_path=outside, best_k_models={outside: torch.tensor(0.0)})
    torch.save(checkpoint, run / "checkpoints" / "last.ckpt")
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli(["fit", *tiny_args(tmp_path / "runs"), "--ckpt_path", "last", "--trainer.max_epochs", "3",
             "--trainer.limit_train_batches", "3"])  # fmt: skip
    assert (precious / "thesis.tex").read_text() == "years of work"
    said = [
        str(warning.message) for warning in caught if "ignoring path(s) in its ModelCheckpoint" in str(warning.message)
    ]
    assert said and "precious" in said[0]


def test_best_is_the_best_monitored_value_not_the_newest_file(tmp_path):
    directory = tmp_path / "runs" / "digits" / "version_0" / "checkpoints"
    directory.mkdir(parents=True)
    key = "ModelCheckpoint{'monitor': 'val/acc', 'mode': 'max', 'every_n_train_steps': 0}"
    for name, score in (("best-epoch001", 0.9), ("best-epoch002", 0.95), ("best-epoch003", 0.91)):
        state = {key: {"monitor": "val/acc", "current_score": torch.tensor(score)}}
        torch.save({"callbacks": state, "pytorch-lightning_version": "2.6"}, directory / f"{name}.ckpt")
    torch.save({"callbacks": {}}, directory / "last.ckpt")
    assert find_checkpoint("best", tmp_path / "runs").name == "best-epoch002.ckpt"
    low = "ModelCheckpoint{'monitor': 'val/loss', 'mode': 'min', 'every_n_train_steps': 0}"
    for name, score in (("best-epoch001", 0.3), ("best-epoch002", 0.5), ("best-epoch003", 0.4)):
        state = {low: {"monitor": "val/loss", "current_score": torch.tensor(score)}}
        torch.save({"callbacks": state, "pytorch-lightning_version": "2.6"}, directory / f"{name}.ckpt")
    assert find_checkpoint("best", tmp_path / "runs").name == "best-epoch001.ckpt"


def test_a_function_of_a_trusted_module_is_accepted_where_a_callable_is_expected(trained, tmp_path):
    layer = {"class_path": "torch.nn.TransformerEncoderLayer", "init_args": {"activation": "torch.nn.functional.gelu"}}
    path = doctor(trained, tmp_path, {"net": {"class_path": "torch.nn.Sequential"}, "extra": layer})
    read_checkpoint(path, ClassificationModule, tensors=False)  # no error: gelu is a function of torch
    path = doctor(trained, tmp_path, {"extra": {**layer, "init_args": {"activation": "os.system"}}})
    with pytest.raises(UnsafeCheckpointError, match="extra.init_args.activation names 'os.system'"):
        read_checkpoint(path, ClassificationModule, tensors=False)  # imported, but not trusted


@pytest.mark.slow
def test_a_checkpoint_outside_a_run_never_makes_fit_delete_its_neighbours(trained, tmp_path, monkeypatch):
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / "valuable.ckpt").write_text("someone's model")
    checkpoint = torch.load(trained, weights_only=True)
    del checkpoint["integrity"]
    relative = "runs/digits/version_0/checkpoints/../../../../downloads/valuable.ckpt"  # resolves beside it
    for name, state in checkpoint["callbacks"].items():
        if name.startswith("ModelCheckpoint"):
            state.update(best_model_path=relative, kth_best_model_path=relative, last_model_path=relative)
    torch.save(checkpoint, downloads / "evil.ckpt")
    monkeypatch.chdir(tmp_path)
    cli(["fit", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(downloads / "evil.ckpt"),
         "--trainer.max_epochs", "3", "--trainer.limit_train_batches", "3"])  # fmt: skip
    assert (downloads / "valuable.ckpt").read_text() == "someone's model"


def test_metric_names_from_a_checkpoint_never_reach_metrics_csv_as_formulas():
    from template.callbacks import TrainingMonitor

    monitor = TrainingMonitor()
    monitor.load_state_dict({"rows": [{"epoch": 0, '=HYPERLINK("http://x")': 1.0}]})
    assert monitor.state_dict()["rows"] == []
    monitor.load_state_dict({"rows": [{"epoch": 0, "val/acc": 0.5}]})
    assert monitor.state_dict()["rows"] == [{"epoch": 0, "val/acc": 0.5}]


def config_attacks(marker: Path, sentinel: str) -> dict[str, tuple[str, callable]]:
    """Each attack on a run's config.yaml: the key it is refused at, and how it changes the config."""

    def setting(*keys: str, value) -> callable:
        def change(config: dict) -> None:
            for key in keys[:-1]:
                config = config.setdefault(key, {})
            config[keys[-1]] = value

        return change

    shell = {"class_path": "os.system", "init_args": {"command": f"touch {marker}"}}
    tensorboard = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger"}
    stranger = {"class_path": f"{sentinel}.Net"}  # a tracker after TensorBoard
    return {
        "module": ("model.class_path", setting("model", "class_path", value=f"{sentinel}.Net")),
        "network": (
            "model.init_args.net.class_path",
            setting("model", "init_args", "net", value={"class_path": f"{sentinel}.Net"}),
        ),
        "optimizer": ("model.init_args.optimizer.class_path", setting("model", "init_args", "optimizer", value=shell)),
        "data": ("data.class_path", setting("data", value={"class_path": f"{sentinel}.Net"})),
        "callback": ("trainer.callbacks[0].class_path", setting("trainer", "callbacks", value=[shell])),
        "logger": ("trainer.logger.class_path", setting("trainer", "logger", value={"class_path": f"{sentinel}.Net"})),
        "tracker": ("trainer.logger[1].class_path", setting("trainer", "logger", value=[tensorboard, stranger])),
        "plugin": ("trainer.plugins", setting("trainer", "plugins", value=f"{sentinel}.Net")),
        "callback section": (
            "monitor.csv_name.class_path",
            setting("monitor", "csv_name", value={"class_path": "os.system"}),
        ),
        "unknown key": ("anything", setting("anything", value=f"{sentinel}.Net")),
    }


@pytest.mark.parametrize("attack", list(config_attacks(Path("m"), "s")))
def test_a_runs_config_naming_code_is_refused_before_anything_is_imported(trained, tmp_path, sentinel, attack, capsys):
    """Evaluating starts from the run's config.yaml: it is checked as the checkpoint beside it is."""
    import shutil

    import yaml

    name, imported = sentinel
    ran = tmp_path / "ran"
    key, change = config_attacks(ran, name)[attack]
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    change(config)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_info:
        cli(["test", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt")])
    assert exit_info.value.code != 0
    error = capsys.readouterr().err
    assert f"refusing {run_dir / 'config.yaml'}: its {key} names" in error
    assert not ran.exists() and not imported.exists() and name not in sys.modules


def test_a_damaged_runs_config_is_named(trained, tmp_path, capsys):
    import shutil

    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    (run_dir / "config.yaml").write_text("model: [unclosed\n")
    with pytest.raises(SystemExit):
        cli(["validate", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt")])
    assert f"{run_dir / 'config.yaml'}, the run's configuration, cannot be read" in capsys.readouterr().err


def test_a_trusted_function_is_a_network_only_if_it_builds_one():
    from torch import nn

    from template.untrusted import Expect, check_value

    network = Expect(True, nn.Module, False)
    check_value({"class_path": "torchvision.models.resnet18", "init_args": {"num_classes": 3}}, "net", network, "x")
    with pytest.raises(UnsafeCheckpointError, match="net.class_path names 'torch.zeros'"):
        check_value({"class_path": "torch.zeros", "init_args": {}}, "net", network, "x")
