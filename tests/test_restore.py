"""A stranger's checkpoint of plain values runs nothing, imports nothing and deletes nothing."""

import os
import pkgutil
import re
import shutil
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import onnx
import pytest
import safetensors.torch
import torch
import yaml
from conftest import tiny_args, write_image_folder

from template import restore
from template.checkpoints import (
    AtomicCheckpointIO,
    CheckpointError,
    DamagedCheckpointError,
    UnsafeCheckpointError,
    check_checkpoint_states,
    find_checkpoint,
    load_checkpoint,
    read_checkpoint,
    read_weights,
)
from template.cli import cli
from template.commands import main
from template.module import ClassificationModule
from template.nets import ResNetSmall
from template.restore import is_path, parameters

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


ENTRIES = ("validate", "test", "predict", "fit", "export", "load_from_checkpoint")


def enter(entry: str, path: Path, tmp_path: Path, *options: str) -> None:
    """Use checkpoint ``path`` through ``entry`` as a user would, in tmp_path, with runs in tmp_path/runs."""
    if entry == "load_from_checkpoint":
        ClassificationModule.load_from_checkpoint(path)  # the notebook's call
    elif entry == "export":
        main(
            ["export", "--ckpt_path", str(path), "--format", "safetensors", "--output", str(tmp_path / "runs" / "n.st")]
        )
    else:
        quick = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
        main([entry, *tiny_args(tmp_path / "runs"), "--ckpt_path", str(path), *quick, *options])


def code_attacks(tmp_path: Path, sentinel: str, marker: Path) -> dict[str, tuple[str, object, dict]]:
    """Each attack on a checkpoint's hyper-parameters: the key it is refused at, the name refused, the change."""
    hub = tmp_path / "hub"  # torch.hub.load(source="local") runs the folder's hubconf.py
    hub.mkdir(exist_ok=True)
    (hub / "hubconf.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).touch()\ndef net(): pass\n")
    (tmp_path / "net.yaml").write_text(f"class_path: {sentinel}.Net\n")
    fx = {"body": {"_code": "x"}, "import_block": f"import os; os.system('touch {marker}')"}
    return {
        # Functions of trusted packages whose return type is nn.Module, which execute code.
        "builder running code": (
            "net.class_path", "torch.fx.graph_module.reduce_graph_module",
            {"net": {"class_path": "torch.fx.graph_module.reduce_graph_module", "init_args": fx}},
        ),
        "builder loading a hubconf": (
            "net.class_path", "torch.hub.load",
            {"net": {"class_path": "torch.hub.load", "init_args": {"repo_or_dir": str(hub), "model": "net",
                                                                   "source": "local"}}},
        ),
        # Strings jsonargparse would parse as YAML, or open as a file of YAML.
        "network as a YAML string": ("net", f"{{class_path: {sentinel}.Net}}", {"net": f"{{class_path: {sentinel}.Net}}"}),
        "optimizer as a YAML string": (
            "optimizer", "{class_path: os.system}", {"optimizer": "{class_path: os.system}"},
        ),
        "network as a YAML file": ("net", str(tmp_path / "net.yaml"), {"net": str(tmp_path / "net.yaml")}),
        "unknown network": ("net.class_path", f"{sentinel}.Net", {"net": {"class_path": f"{sentinel}.Net"}}),
        "unknown module": ("_class_path", f"{sentinel}.Net", {"_class_path": f"{sentinel}.Net"}),
        # A string where a registered builder's **kwargs take a callable (ResNet's norm_layer).
        "string through **kwargs": (
            "net.init_args.norm_layer", f"{sentinel}.Net",
            {"net": {"class_path": "torchvision.models.resnet18", "init_args": {"norm_layer": f"{sentinel}.Net"}}},
        ),
        # Pretrained weights anywhere in the network (a builder nested as another's argument, pretrained=True
        # through **kwargs): torch hub's loader would unpickle the cached file (made to run code below).
        "pretrained weights nested in a network": (
            "net", "torchvision.models.VGG",
            {"net": {"class_path": "torchvision.models.VGG", "init_args": {"features": {
                "class_path": "torchvision.models.resnet18", "init_args": {"weights": "IMAGENET1K_V1"}}}}},
        ),
        "pretrained through **kwargs": (
            "net", "torchvision.models.resnet18",
            {"net": {"class_path": "torchvision.models.resnet18", "init_args": {"pretrained": True}}},
        ),
        # Literal arguments that would build a network of gigabytes: its shapes must be the file's tensors'.
        "a network far larger than its tensors": (
            "net", "template.nets.ResNet",
            {"net": {"class_path": "template.nets.ResNet", "init_args": {"widths": [8, 8, 8, 9000],
                                                                        "blocks_per_stage": [1, 1, 1, 1]}}},
        ),
        # A class the user's own configuration names (the default logger), where a network belongs: it would
        # be built, and its save_dir (an ftp:// URL) opened.
        "a class of the user's config of another kind": (
            "net.class_path", "lightning.pytorch.loggers.TensorBoardLogger",
            {"net": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                     "init_args": {"save_dir": "ftp://127.0.0.1:9/x"}}},
        ),
        "a network of a hundred million blocks": (
            "net.init_args", {"widths": [1], "blocks_per_stage": [100_000_000]},
            {"net": {"class_path": "template.nets.ResNet",
                     "init_args": {"widths": [1], "blocks_per_stage": [100_000_000]}}},
        ),
        "enum member that is none": (  # never read: pretrained weights never come from a file
            "net", "torchvision.models.resnet18",
            {"net": {"class_path": "torchvision.models.resnet18", "init_args": {"weights": f"{sentinel}.Net"}}},
        ),
    }  # fmt: skip


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_checkpoint_naming_code_is_refused_in_one_line_by_every_entry_point(
    trained, tmp_path, sentinel, entry, capsys, monkeypatch
):
    name, imported = sentinel
    ran = tmp_path / "ran"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # a hub cache whose resnet18 file runs code
    (tmp_path / "torch" / "hub" / "checkpoints").mkdir(parents=True)
    torch.save({"x": Payload(str(ran))}, tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth")
    for attack, (key, value, change) in code_attacks(tmp_path, name, ran).items():
        path = doctor(trained, tmp_path, change)
        refusal = f"refusing {path}: its hyper_parameters.{key} is {value!r}"
        if entry == "load_from_checkpoint":
            with pytest.raises(UnsafeCheckpointError) as error:
                enter(entry, path, tmp_path)
            said = str(error.value)
        else:
            with pytest.raises(SystemExit) as exit_info:
                enter(entry, path, tmp_path)
            assert exit_info.value.code != 0, attack
            said = capsys.readouterr().err
        assert refusal in said and len([line for line in said.splitlines() if "refusing" in line]) == 1, (attack, said)
        assert not ran.exists() and not imported.exists() and name not in sys.modules, attack


def place_options(parser, config) -> list[str]:
    """Every option of ``parser`` that names a place (a path-typed one, or a directory, file, root or name), by key:
    its own arguments and those of the classes its configuration names (logger, callbacks, data), enumerated."""
    place = re.compile(r"(dir|path|file|root|name)")
    found = [
        action.dest
        for action in parser._actions
        if action.dest.count(".")
        and (is_path(getattr(action, "_typehint", None) or action.type) or place.search(action.dest.rpartition(".")[2]))
    ]

    def walk(value, key: str) -> None:
        if isinstance(value, dict) and isinstance(value.get("class_path"), str):
            for name, annotation in parameters(pkgutil.resolve_name(value["class_path"]))[0].items():
                if is_path(annotation) or place.search(name):
                    found.append(f"{key}.init_args.{name}")
        for name, item in value.items() if isinstance(value, dict) else enumerate(value or []):
            if isinstance(item, dict | list):
                walk(item, f"{key}.{name}" if isinstance(name, str) else f"{key}[{name}]")

    config = yaml.safe_load(parser.dump(config, skip_check=True))
    for data in ("template.data.ImageFolderDataModule", "template.data.CIFAR10DataModule"):
        config[f"data_{data}"] = {"class_path": data}  # every DataModule's places too
    walk(config, "")
    return sorted({key.lstrip(".") for key in found if not key.startswith(".model.init_args.class_names")})


def plant(config: dict, key: str, value) -> None:
    """Set dotted ``key`` (``trainer.logger.init_args.save_dir``, ``x[0].y``) in ``config`` to ``value``."""
    parts = re.findall(r"[^.\[\]]+", key)
    for part in parts[:-1]:
        config = config[int(part)] if isinstance(config, list) else config.setdefault(part, {})
    config[parts[-1]] = value


@pytest.mark.slow
def test_no_place_a_run_or_its_checkpoint_names_is_ever_written_or_read(trained, tmp_path, monkeypatch):
    """Every place-naming option the parser accepts, planted in a run's config.yaml and in its checkpoint,
    pointing outside: every entry point writes only under the user's runs directory."""
    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "evil"
    built = cli(tiny_args(tmp_path / "runs"), run=False)
    keys = place_options(built.parser, built.config)
    assert {
        "trainer.default_root_dir",
        "checkpoint.dirpath",
        "predictions.filename",
        "trainer.logger.init_args.save_dir",
        "data_template.data.ImageFolderDataModule.init_args.cache_dir",
    } <= set(keys)
    images = write_image_folder(tmp_path / "images", classes=[str(d) for d in range(10)], per_class=2,
                                splits=("train", "val", "test"), size=(8, 8))  # fmt: skip
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    folder = {"_class_path": "template.data.ImageFolderDataModule", "image_size": 8, "channels": "grayscale"}
    checkpoint["datamodule_hyper_parameters"] = folder
    checkpoint["ImageFolderDataModule"] = checkpoint.pop("DigitsDataModule")  # its state, under its class's name
    for key in keys:
        section, _, rest = key.partition(".")
        if section.startswith("data_"):  # a DataModule's places: in config.yaml's data, and in the checkpoint's
            plant(config, f"data.{rest}", str(evil / key))
            checkpoint["datamodule_hyper_parameters"][rest.rpartition(".")[2]] = str(evil / key)
        else:
            plant(config, key, str(evil / key))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    del checkpoint["integrity"]  # a digest detects damage, not intent
    torch.save(checkpoint, run_dir / "checkpoints" / "last.ckpt")
    outside_before = {p for p in tmp_path.rglob("*") if "runs" not in p.parts}
    data = ["--data.root", str(images), "--data.cache_dir", str(tmp_path / "runs" / "cache")]
    for entry in ENTRIES:
        extra = [*data, "--data.predict_path", str(images / "test")] if entry == "predict" else data
        enter(entry, run_dir / "checkpoints" / "last.ckpt", tmp_path, *extra if entry in ENTRIES[:4] else ())
        assert not evil.exists(), entry
        assert {p for p in tmp_path.rglob("*") if "runs" not in p.parts} == outside_before, entry


def test_a_yaml_alias_bomb_in_a_runs_config_is_refused_at_once(trained, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    bomb = ["a: &a ['lol','lol','lol','lol','lol','lol','lol','lol','lol']"]
    bomb += [f"{b}: &{b} [*{a},*{a},*{a},*{a},*{a},*{a},*{a},*{a},*{a}]" for a, b in zip("abcdefgh", "bcdefghi")]
    (run_dir / "config.yaml").write_text("\n".join(bomb) + "\ntrainer: *i\n")
    started = time.perf_counter()
    with pytest.raises(SystemExit):
        enter("fit", run_dir / "checkpoints" / "last.ckpt", tmp_path)
    assert time.perf_counter() - started < 30  # a parse, refused at the first alias: not minutes and gigabytes
    assert f"refusing {run_dir / 'config.yaml'}: an alias (*a)" in capsys.readouterr().err
    (run_dir / "config.yaml").write_text("trainer:\n" + "  " * 40 + "x: 1\n" + "a: " + "[" * 100 + "]" * 100 + "\n")
    with pytest.raises(SystemExit):
        enter("fit", run_dir / "checkpoints" / "last.ckpt", tmp_path)
    assert "nested deeper than" in capsys.readouterr().err
    for value in ("9" * 5000, "2001-02-30"):  # parsed, then refused by Python's int and date
        (run_dir / "config.yaml").write_text(f"seed_everything: {value}\n")
        with pytest.raises(SystemExit):
            enter("fit", run_dir / "checkpoints" / "last.ckpt", tmp_path)
        assert f"refusing {run_dir / 'config.yaml'}: " in capsys.readouterr().err


def test_a_module_of_your_own_is_named_again_or_registered(trained, tmp_path, monkeypatch, capsys):
    (tmp_path / "mine.py").write_text(
        "from template.module import ClassificationModule\nfrom template.restore import register\n\n\n"
        "class Mine(ClassificationModule):\n    pass\n\n\n@register\nclass Other(ClassificationModule):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = doctor(trained, tmp_path, {"_class_path": "mine.Mine"})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        enter("validate", path, tmp_path)
    assert "name it again: --model mine.Mine" in capsys.readouterr().err and "mine" not in sys.modules
    assert type(cli(["validate", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(path), "--model", "mine.Mine",
                      "--trainer.limit_val_batches", "1"]).model).__name__ == "Mine"  # fmt: skip
    path = doctor(trained, tmp_path, {"_class_path": "mine.Other"})  # registered where it is defined
    assert type(ClassificationModule.load_from_checkpoint(path)).__name__ == "ClassificationModule"
    sys.modules.pop("mine", None)


def test_register_takes_a_kind_for_a_builder_and_an_old_name_for_a_moved_class(monkeypatch):
    monkeypatch.setattr(restore, "_registered", {})

    @restore.register(name="old_package.nets.Moved")
    class Moved(torch.nn.Linear):
        pass

    def sgd(params, lr: float = 0.1) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr)

    restore.register(sgd, kind="optimizer")
    found = restore.registry()
    assert found["old_package.nets.Moved"] == found[f"{Moved.__module__}.{Moved.__qualname__}"] == ("net", Moved)
    assert found[f"{sgd.__module__}.{sgd.__qualname__}"] == ("optimizer", sgd)
    with pytest.raises(ValueError, match="kind='optimiser' is not one of"):
        restore.register(sgd, kind="optimiser")


def test_the_checkpoints_the_template_writes_pass_every_check(trained):
    checkpoint = read_checkpoint(trained)
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
    with pytest.raises(DamagedCheckpointError, match="tensors differ from the digest"):  # --weights_file too
        read_weights(damaged, 1 << 30)
    with pytest.raises(DamagedCheckpointError):
        ClassificationModule.load_from_checkpoint(damaged, weights_only=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DamagedCheckpointError, match=f"{damaged} is damaged"):
        cli(["validate", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(damaged)])


def test_a_checkpoint_whose_entries_are_compressed_is_refused_before_any_is_inflated(trained, tmp_path):
    """torch.save stores its entries as they are: a deflated data.pkl of a few bytes can inflate to gigabytes."""
    bomb = tmp_path / "bomb.ckpt"
    with zipfile.ZipFile(trained) as source, zipfile.ZipFile(bomb, "w") as target:
        for entry in source.infolist():
            deflated = entry.filename.endswith("/data.pkl")
            padding = b"\0" * (1 << 20) if deflated else b""  # after the pickle's end: the unpickler never reads it
            target.writestr(entry.filename, source.read(entry) + padding, zipfile.ZIP_DEFLATED if deflated else 0)
    assert bomb.stat().st_size < trained.stat().st_size + 4096
    with pytest.raises(CheckpointError, match="it is a zip archive of compressed entries"):
        load_checkpoint(bomb)


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
    with pytest.raises(CheckpointError, match=re.escape(f"give them as --weights_file {tmp_path / 'weights.pt'}")):
        read_checkpoint(tmp_path / "weights.pt")  # the command line's way to start from them
    malformed = torch.load(trained, weights_only=True)
    malformed["callbacks"] = ["not", "a", "dict"]
    torch.save(malformed, tmp_path / "malformed.ckpt")
    stateless = {key: value for key, value in malformed.items() if key not in ("state_dict", "callbacks")}
    torch.save(stateless, tmp_path / "stateless.ckpt")
    monkeypatch.chdir(tmp_path)
    named = {"weights.pt": "not a Lightning checkpoint", "malformed.ckpt": "its callbacks is a list",
             "stateless.ckpt": "without a state_dict"}  # fmt: skip
    for path, says in named.items():
        with pytest.raises(SystemExit) as exit_info:
            main(["validate", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(tmp_path / path)])
        assert exit_info.value.code == 1 and says in capsys.readouterr().err


def test_what_is_no_checkpoint_is_named_for_what_it_is_by_every_entry_point(trained, tmp_path, capsys, monkeypatch):
    """An export, a config or a run directory as --ckpt_path read as "needs arbitrary pickled objects (Weights)",
    torch's weights_only advice or "no such file"; each is named for what it is, with what to give instead."""
    run_dir = trained.parents[1]
    torch.jit.script(torch.nn.Linear(2, 2)).save(tmp_path / "net.torchscript.pt")
    safetensors.torch.save_file({"weight": torch.zeros(2)}, tmp_path / "net.safetensors")
    onnx.save(onnx.helper.make_model(onnx.helper.make_graph([], "net", [], [])), tmp_path / "net.onnx")
    export = "give the .ckpt of the run it came from (exported files are for deployment), or --ckpt_path best"
    named = {
        run_dir: f"it is a directory; give one of its checkpoints ({run_dir / 'checkpoints' / 'best-epoch000.ckpt'}, ",
        tmp_path / "net.torchscript.pt": f"it is a TorchScript archive; {export}",
        tmp_path / "net.safetensors": f"it is a safetensors file; {export}",
        tmp_path / "net.onnx": f"it is no file torch.save wrote; {export}",
        run_dir / "config.yaml": f"it is no file torch.save wrote; {export}",
        tmp_path / "fifo.ckpt": f"it is no regular file (a FIFO, socket or device); {export}",  # opened, it would hang
    }
    os.mkfifo(tmp_path / "fifo.ckpt")
    monkeypatch.chdir(tmp_path)
    for path, says in named.items():
        said = f"{path} is not a Lightning checkpoint (.ckpt written by fit) nor any torch.save file: {says}"
        for entry in ("test", "export"):
            with pytest.raises(SystemExit):
                enter(entry, path, tmp_path)
            error = capsys.readouterr().err
            assert said in error and "pickled" not in error and "weights_only" not in error, (entry, error)
        with pytest.raises(CheckpointError, match=re.escape(said)):
            enter("load_from_checkpoint", path, tmp_path)
    unsafe = tmp_path / "unsafe.ckpt"  # an attack in torch's legacy format is still refused as one
    torch.save({"state_dict": {}, "x": Payload(str(tmp_path / "ran"))}, unsafe, _use_new_zipfile_serialization=False)
    with pytest.raises(UnsafeCheckpointError, match="needs arbitrary pickled objects"):
        read_checkpoint(unsafe)
    assert not (tmp_path / "ran").exists()


def test_a_legacy_format_checkpoint_of_plain_values_is_not_refused(trained, tmp_path):
    checkpoint = torch.load(trained, weights_only=True)
    torch.save(checkpoint, tmp_path / "legacy.ckpt", _use_new_zipfile_serialization=False)
    loaded = read_checkpoint(tmp_path / "legacy.ckpt")
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


def test_a_best_checkpoint_deleted_since_is_said_to_be_gone_not_outside_the_run(tmp_path):
    """A SIGTERM while checkpoints were written left a state naming a deleted best: "does not resolve inside"."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.yaml").write_text("{}")
    gone = str(tmp_path / "checkpoints" / "best-epoch000.ckpt")
    checkpoint = {"callbacks": {"ModelCheckpoint{'monitor': 'val/acc'}": {"best_model_path": gone}}}
    with pytest.warns(UserWarning, match="do not resolve to a checkpoint in .* \\(gone, or elsewhere\\)"):
        check_checkpoint_states(checkpoint, tmp_path / "checkpoints" / "last.ckpt")


LIGHTNING = {"pytorch-lightning_version": "2.6", "state_dict": {}}  # what every ModelCheckpoint file has


def test_best_is_the_best_monitored_value_not_the_newest_file(tmp_path):
    directory = tmp_path / "runs" / "digits" / "version_0" / "checkpoints"
    directory.mkdir(parents=True)

    def state(metric: str, name: str, score: torch.Tensor) -> dict:  # as the ModelCheckpoint that saved it keeps it
        return {"monitor": metric, "current_score": score, "best_k_models": {str(directory / f"{name}.ckpt"): score}}

    key = "ModelCheckpoint{'monitor': 'val/acc', 'mode': 'max', 'every_n_train_steps': 0}"
    for name, score in (("best-epoch001", 0.9), ("best-epoch002", 0.95), ("best-epoch003", 0.91)):
        torch.save(
            {"callbacks": {key: state("val/acc", name, torch.tensor(score))}, **LIGHTNING}, directory / f"{name}.ckpt"
        )
    torch.save({"callbacks": {}}, directory / "last.ckpt")
    assert find_checkpoint("best", tmp_path / "runs").name == "best-epoch002.ckpt"
    low = "ModelCheckpoint{'monitor': 'val/loss', 'mode': 'min', 'every_n_train_steps': 0}"
    for name, score in (("best-epoch001", 0.3), ("best-epoch002", 0.5), ("best-epoch003", 0.4)):
        torch.save(
            {"callbacks": {low: state("val/loss", name, torch.tensor(score))}, **LIGHTNING}, directory / f"{name}.ckpt"
        )
    assert find_checkpoint("best", tmp_path / "runs").name == "best-epoch001.ckpt"
    bomb = {low: state("val/loss", "best-epoch004", torch.zeros(1).expand(1 << 34))}  # 16 GiB if compared
    torch.save({"callbacks": bomb, **LIGHTNING}, directory / "best-epoch004.ckpt")
    assert find_checkpoint("best", tmp_path / "runs").name == "best-epoch001.ckpt"  # not a score: not the best
    torch.save([1, 2], directory / "best-epoch005.ckpt")  # no checkpoint: passed over, said
    torch.save({"callbacks": bomb}, directory / "best-epoch006.ckpt", _use_new_zipfile_serialization=False)  # legacy
    with pytest.warns(UserWarning, match="passing over .*best-epoch005.ckpt is not a Lightning checkpoint"):
        assert find_checkpoint("best", tmp_path / "runs").name == "best-epoch001.ckpt"


def test_best_and_last_look_where_runs_lie_not_down_a_planted_tree(tmp_path, monkeypatch):
    checkpoints = tmp_path / "runs" / "digits" / "cv_0" / "fold_1" / "checkpoints"  # a cv fold's: 3 folders down
    checkpoints.mkdir(parents=True)
    torch.save({"callbacks": {}}, checkpoints / "last.ckpt")
    deep = tmp_path / "runs" / "planted"
    deep.mkdir()
    monkeypatch.chdir(deep)
    try:
        for _ in range(1200):  # deeper than Python's recursion limit: a recursive walk fails, naming nothing
            os.mkdir("a")
            os.chdir("a")
        assert find_checkpoint("last", tmp_path / "runs") == checkpoints / "last.ckpt"
    finally:  # undone level by level: shutil.rmtree (pytest's clean-up) would recurse too
        subprocess.run(["rm", "-rf", str(deep)], check=True)


def test_the_latest_run_is_the_one_written_last_never_a_copy_dated_in_the_future_nor_a_fifo(tmp_path):
    """``--ckpt_path best`` / ``last`` take the run whose last.ckpt was written last: a stranger's run unpacked with its
    author's clock (tar keeps file times) or a FIFO by that name must not pass for it (nor hang the search)."""
    runs = tmp_path / "runs"
    for run in ("mine", "stranger", "fifo"):
        (runs / run / "version_0" / "checkpoints").mkdir(parents=True)
    torch.save({"callbacks": {}}, runs / "mine" / "version_0" / "checkpoints" / "last.ckpt")
    stranger = runs / "stranger" / "version_0" / "checkpoints" / "last.ckpt"
    torch.save({"callbacks": {}}, stranger)
    os.utime(stranger, (time.time() + 86_400 * 365, time.time() + 86_400 * 365))
    os.mkfifo(runs / "fifo" / "version_0" / "checkpoints" / "last.ckpt")
    with pytest.warns(UserWarning, match="dated in the future"):
        assert find_checkpoint("last", runs) == runs / "mine" / "version_0" / "checkpoints" / "last.ckpt"
    stopped = runs / "stopped" / "version_0" / "checkpoints"  # pre-empted within its first epoch: no last.ckpt yet
    stopped.mkdir(parents=True)
    torch.save({"callbacks": {}}, stopped / "preempted.ckpt")
    assert find_checkpoint("last", runs) == stopped / "preempted.ckpt"
    time.sleep(0.01)
    torch.save({"callbacks": {}}, stopped / "last.ckpt")  # resumed, and on past an epoch's end
    assert find_checkpoint("last", runs) == stopped / "last.ckpt"
    (stopped / "preempted.ckpt").touch()  # pre-empted again, within a later epoch
    assert find_checkpoint("last", runs) == stopped / "preempted.ckpt"
    shutil.rmtree(runs / "stopped")
    os.mkfifo(runs / "mine" / "version_0" / "checkpoints" / "best-epoch001.ckpt")
    with pytest.warns(UserWarning), pytest.raises(FileNotFoundError, match="holds no best"):
        find_checkpoint("best", runs)


def test_best_and_last_take_the_latest_run_of_the_run_name_the_command_gives(trained, tmp_path, monkeypatch, capsys):
    """A command naming its runs (--trainer.logger.init_args.name, a --config's or --data's name) took the latest run
    of any name: a resume under another name continued another run, a test of a config scored another model."""
    monkeypatch.chdir(tmp_path)
    mine = shutil.copytree(trained.parents[1], tmp_path / "runs" / "mine" / "version_0") / "checkpoints" / "last.ckpt"
    latest = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0") / "checkpoints"
    os.utime(mine, (time.time() - 60, time.time() - 60))  # copies keep the fixture's times: the older run's, older
    os.utime(latest / "last.ckpt")
    quick = [*tiny_args(tmp_path / "runs"), "--trainer.limit_val_batches", "1"]
    cli(["validate", *quick, "--ckpt_path", "last"])
    assert f"--ckpt_path last -> {latest / 'last.ckpt'}" in capsys.readouterr().out  # no name given: the latest run
    cli(["fit", *quick, "--ckpt_path", "last", "--trainer.logger.init_args.name", "mine", "--trainer.max_epochs", "1"])
    assert f"--ckpt_path last -> {mine}" in capsys.readouterr().out  # a resume of the run it names
    cli(["validate", *quick, "--ckpt_path", "last", "--trainer.logger.init_args.name", "mine"])
    assert f"--ckpt_path last -> {mine}" in capsys.readouterr().out  # evaluated, and logged beside it
    cli(["validate", *quick, "--ckpt_path", "last", "--trainer.logger", "false"])  # no TensorBoard: no name
    assert "--ckpt_path last -> runs/digits/version_0/checkpoints/last.ckpt" in capsys.readouterr().out  # ./runs
    (tmp_path / "data.yaml").write_text("class_path: template.data.DigitsDataModule\n")  # a file, not a class name
    cli(["validate", *quick, "--ckpt_path", "last", "--data", str(tmp_path / "data.yaml")])
    assert f"--ckpt_path last -> {latest / 'last.ckpt'}" in capsys.readouterr().out
    with pytest.raises(
        FileNotFoundError,
        match=r"no run with checkpoints/last.ckpt under .*runs/imagefolder \(this command.s run name, from its --config, --data or logger name: imagefolder\); ",
    ):
        root = str(write_image_folder(tmp_path / "images", per_class=2))
        cli(["validate", *quick, "--ckpt_path", "best", "--data", "ImageFolderDataModule", "--data.root", root])


def test_weights_that_give_nan_outputs_are_never_scored_nor_written_as_predictions(trained, tmp_path, capsys):
    """Finite weights may give NaN outputs (a BatchNorm's running_var below 0): test printed an accuracy of the NaN
    logits' argmax, and predict wrote a class and probability nan for every image, exit status 0 both."""
    checkpoint = torch.load(trained, weights_only=True)
    del checkpoint["integrity"]  # a digest detects damage, not intent
    checkpoint["state_dict"]["net.stem.1.running_var"].fill_(-1.0)
    torch.save(checkpoint, tmp_path / "negative_variance.ckpt")
    for command, says in (("test", "test/loss is nan: the network's outputs are NaN"), ("predict", "for 360 of 360")):
        with pytest.raises(SystemExit, match="1"):
            main([command, *tiny_args(tmp_path / "runs"), "--ckpt_path", str(tmp_path / "negative_variance.ckpt")])
        assert says in capsys.readouterr().err
    assert not list((tmp_path / "runs").rglob("predictions.csv"))
    # Nor by a fit's own validation, where its score chose the best checkpoint.
    with pytest.raises(SystemExit, match="1"):
        one = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1", "--trainer.num_sanity_val_steps", "0"]
        main(["fit", *tiny_args(tmp_path / "runs"), "--weights_file", str(tmp_path / "negative_variance.ckpt"), *one])
    assert "at epoch 0, val/loss is nan: the network's outputs are NaN" in capsys.readouterr().err
    assert not list((tmp_path / "runs").rglob("best*.ckpt"))


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


def test_a_resume_whose_best_scores_are_not_those_its_kept_files_record_is_refused(run_cli):
    """A last.ckpt whose ModelCheckpoint state said its best scored 0.99 (the file itself: 0.2): the resume saved no
    better epoch, and its summary named a best of 0.99."""
    one = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    run_cli("fit", "--trainer.max_epochs", "1", *one)
    last = run_cli.runs_dir / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    del checkpoint["integrity"]  # a digest detects damage, not intent
    state = next(state for name, state in checkpoint["callbacks"].items() if "val/acc" in name)
    state["best_model_score"] = torch.tensor(0.99)
    state["best_k_models"] = dict.fromkeys(state["best_k_models"], torch.tensor(0.99))
    torch.save(checkpoint, last)
    with pytest.raises(CheckpointError, match=r"its ModelCheckpoint state scores best-epoch000.ckpt 0.99, which that"):
        run_cli("fit", "--ckpt_path", "last", "--trainer.max_epochs", "2", *one)
    # A worse score is an older one's (a file name kept again is overwritten by a better epoch): no damage.
    state["best_model_score"] = torch.tensor(0.0)
    state["best_k_models"] = dict.fromkeys(state["best_k_models"], torch.tensor(0.0))
    torch.save(checkpoint, last)
    assert run_cli("fit", "--ckpt_path", "last", "--trainer.max_epochs", "2", *one).trainer.current_epoch == 2


def test_metric_names_from_a_checkpoint_never_reach_metrics_csv_as_formulas():
    from template.callbacks import TrainingMonitor

    monitor = TrainingMonitor()
    monitor.load_state_dict({"rows": [{"epoch": 0, '=HYPERLINK("http://x")': 1.0}]})
    assert monitor.state_dict()["rows"] == []
    monitor.load_state_dict({"rows": [{"epoch": 0, "val/acc": 0.5}]})
    assert monitor.state_dict()["rows"] == [{"epoch": 0, "val/acc": 0.5}]


class Payload:
    """Unpickling this runs a shell command."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_links_planted_in_a_run_directory_never_lead_a_write_outside_it(trained, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("kept")
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    (run_dir / "metrics.csv").unlink()
    (run_dir / "metrics.csv").symlink_to(outside / "victim")
    enter("fit", run_dir / "checkpoints" / "last.ckpt", tmp_path)  # resumed into a new run directory
    assert (outside / "victim").read_text() == "kept" and (tmp_path / "runs" / "digits" / "version_1").is_dir()
    planted = run_dir / "checkpoints" / f".last.ckpt.{os.getpid()}.tmp"  # this writer's own temporary name
    planted.symlink_to(outside / "victim")
    AtomicCheckpointIO().save_checkpoint({"step": 1}, run_dir / "checkpoints" / "last.ckpt")
    assert (outside / "victim").read_text() == "kept"
    assert not (run_dir / "checkpoints" / "last.ckpt").is_symlink() and not planted.exists()


@pytest.mark.parametrize(
    "plant", ["fifo", "folder", "link in a subfolder", "hard link", "too many entries", "1,500 levels"]
)
def test_a_run_directory_holding_what_no_run_writes_is_resumed_into_a_new_one(trained, tmp_path, plant):
    """A FIFO by a name the run opens (it would wait forever), a folder by a name it writes (it failed at the epoch's
    end, the epoch lost), a link one folder down, a file with a second name elsewhere (a write in place lands there
    too), a folder of a million files: not the run's own, so a fit resumes into a new run directory."""
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    assert restore.own_run(run_dir / "checkpoints" / "last.ckpt", tmp_path / "runs") == run_dir.resolve()
    if plant == "fifo":
        (run_dir / "metrics.csv").unlink()
        os.mkfifo(run_dir / "metrics.csv")
    elif plant == "folder":
        (run_dir / "metrics.csv").unlink()
        (run_dir / "metrics.csv").mkdir()
    elif plant == "link in a subfolder":
        (run_dir / "checkpoints" / "deeper").mkdir()
        (run_dir / "checkpoints" / "deeper" / "note").symlink_to(tmp_path)
    elif plant == "hard link":
        (run_dir / "checkpoints" / "deeper").mkdir()
        os.link(run_dir / "hparams.yaml", run_dir / "checkpoints" / "deeper" / "note")
    elif plant == "too many entries":
        for i in range(restore.MAX_RUN_ENTRIES):
            (run_dir / f"{i}.txt").touch()
    else:  # Path.rglob recursed a frame a level: "maximum recursion depth exceeded", naming nothing
        here = os.getcwd()
        os.chdir(run_dir)
        try:
            for _ in range(1500):
                os.mkdir("d")
                os.chdir("d")
        finally:
            os.chdir(here)
    with pytest.warns(UserWarning, match="resumed into a new run directory"):
        assert restore.own_run(run_dir / "checkpoints" / "last.ckpt", tmp_path / "runs") is None
    for level in range(1500, 0, -1) if plant == "1,500 levels" else ():  # shutil.rmtree recurses a frame a level
        os.rmdir(Path(run_dir, *["d"] * level))


@pytest.mark.parametrize("linked", ["metrics.csv", "checkpoints/last.ckpt"])
def test_a_run_file_hard_linked_from_outside_is_left_as_it_was_by_a_resume(trained, tmp_path, monkeypatch, linked):
    """A stranger's run whose file is a second name of one outside it: a resume into that run would rewrite the
    outside file in place (metrics.csv, Lightning's hparams.yaml), so it goes into a new run directory."""
    monkeypatch.chdir(tmp_path)
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    victim = tmp_path / "outside" / "victim"
    victim.parent.mkdir()
    shutil.copyfile(run_dir / linked, victim)  # the run's own bytes: a run reads it as its file
    (run_dir / linked).unlink()
    os.link(victim, run_dir / linked)
    kept = victim.read_bytes()
    with pytest.warns(UserWarning, match=f"{linked}.*resumed into a new run directory"):
        enter("fit", run_dir / "checkpoints" / "last.ckpt", tmp_path)
    assert victim.read_bytes() == kept
    assert (tmp_path / "runs" / "digits" / "version_1" / "metrics.csv").is_file()


def test_the_metrics_a_resume_writes_replace_a_hard_linked_file_not_write_through_it(trained, tmp_path, monkeypatch):
    """Behind the check of the run directory: metrics.csv is written as a new file renamed over the old name, so
    another name of the old file keeps its bytes."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(restore, "own_entry", lambda path: True)  # as if the link came after the check
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    victim = tmp_path / "victim.csv"
    os.link(run_dir / "metrics.csv", victim)
    kept = victim.read_bytes()
    enter("fit", run_dir / "checkpoints" / "last.ckpt", tmp_path)
    assert victim.read_bytes() == kept and (run_dir / "metrics.csv").read_bytes() != kept
    assert not (tmp_path / "runs" / "digits" / "version_1").exists()


@pytest.mark.parametrize("entry", ["test", "fit"])
def test_a_run_folder_linked_elsewhere_is_refused_before_anything_is_written(trained, tmp_path, monkeypatch, entry):
    """An unpacked stranger's runs/<name> (or runs/<name>/version_N) that links out of the runs directory: a new
    run (a test of a checkpoint of that name, a fit there) would write its files where the link leads."""
    monkeypatch.chdir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "digits").symlink_to(outside)
    checkpoint = trained if entry == "test" else None
    with pytest.raises(SystemExit, match="1"):
        enter(entry, checkpoint, tmp_path) if checkpoint else main(["fit", *tiny_args(tmp_path / "runs")])
    assert list(outside.iterdir()) == []


def test_print_config_of_a_checkpoint_shows_what_a_config_of_it_runs(trained, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        cli(["test", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(trained), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["ckpt_path"] == str(trained)  # `test --config printed.yaml` tests the trained weights


def test_evaluating_a_checkpoint_on_splits_drawn_otherwise_than_its_runs_is_refused(trained, tmp_path, monkeypatch):
    """Another split_seed, fraction or fold draws val and test again, mixing in images the run trained on: validate
    and test refuse, naming each option and both values; the run's own values given again, and predict, run."""
    monkeypatch.chdir(tmp_path)

    def run(command: str, *options: str):
        return cli([command, *tiny_args(tmp_path / "runs"), "--ckpt_path", str(trained), *options])

    changes = r"data.test_fraction 0.2 in its run, 0.3 given; data.split_seed 0 in its run, 1 given\. Leave them out"
    with pytest.raises(ValueError, match=f"draw other splits than its run's, so its test split may hold .*{changes}"):
        run("test", "--data.split_seed", "1", "--data.test_fraction", "0.3")
    with pytest.raises(ValueError, match=r"its val split .*: data.folds None in its run, 3 given; data.fold 0 in its"):
        run("validate", "--data.folds", "3", "--data.fold", "1")
    assert (
        "test/acc"
        in run("test", "--data.split_seed", "0", "--trainer.limit_test_batches", "1").trainer.callback_metrics
    )
    run("predict", "--data.split_seed", "1", "--trainer.limit_predict_batches", "1")


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_checkpoint_that_would_allocate_what_it_never_held_is_refused(trained, tmp_path, monkeypatch, entry):
    """A few bytes can declare gigabytes: an expanded tensor (stride 0) in the weights or anywhere else (it would be
    copied to be hashed), a network larger than the machine described by tensors of the same kind, thousands of
    tiny layers that take minutes to build. Each is refused before anything of that size exists."""
    monkeypatch.chdir(tmp_path)
    checkpoint = torch.load(trained, weights_only=True)
    attacks = {
        "expanded weight": lambda c: c["state_dict"].update({"net.head.weight": torch.zeros(1).expand(10, 128)}),
        "expanded elsewhere": lambda c: c["loops"].update({"bomb": torch.zeros(1).expand(1 << 34)}),
        "many layers": lambda c: c["state_dict"].update({f"net.extra{i}": torch.zeros(1) for i in range(10_001)}),
        # 8 MB stored once, 1.6 GB to hash and check as 200 views (the hostile trial's: 17 minutes from 19 MB)
        "views of one storage": lambda c: c["callbacks"].update({"bomb": [shared[i:] for i in range(0, 2000, 10)]}),
        "meta weight": lambda c: c["state_dict"].update({"net.head.weight": torch.empty(10, 128, device="meta")}),
    }
    shared = torch.zeros(2_000_000)
    for change in attacks.values():
        doctored = {**checkpoint, **{key: dict(checkpoint[key]) for key in ("state_dict", "loops", "callbacks")}}
        doctored.pop("integrity")  # another tool's checkpoint: no digest to disagree with
        change(doctored)
        torch.save(doctored, tmp_path / "bomb.ckpt")
        with pytest.raises((SystemExit, CheckpointError)):
            enter(entry, tmp_path / "bomb.ckpt", tmp_path)
    monkeypatch.setattr(os, "sysconf", lambda name: 1 << (6 if name == "SC_PHYS_PAGES" else 12))  # 256 KiB of memory
    with pytest.raises((SystemExit, CheckpointError)):
        enter(entry, trained, tmp_path)


def test_a_network_record_of_many_or_large_layers_is_refused_before_it_is_built(trained, tmp_path, monkeypatch):
    """Sizes each within bounds still describe twenty thousand blocks (a minute and gigabytes to build, even on the meta
    device), or, for a network that cannot be built on the meta device and so is built for real, a layer of gigabytes.
    Either build stops once it holds far more than the checkpoint's tensors do."""
    monkeypatch.setattr(restore, "_registered", dict(restore._registered))

    def reading(width: int, blocks: int) -> torch.nn.Module:
        torch.ones(1).item()  # reads a value: not on the meta device
        return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(blocks)])

    restore.register(reading, name="reading")
    records = [
        ("template.nets.ResNet", {"widths": [1, 1, 1, 1], "blocks_per_stage": [5000] * 4}),
        ("reading", {"width": 1, "blocks": 60_000}),
        ("reading", {"width": 8192, "blocks": 1}),
    ]
    for name, init_args in records:
        path = doctor(trained, tmp_path, {"net": {"class_path": name, "init_args": init_args}})
        started = time.perf_counter()
        with pytest.raises(UnsafeCheckpointError, match=re.escape(f"refusing {path}: its hyper_parameters.net is")):
            restore.restore(path, ClassificationModule, None, fit=False)
        assert time.perf_counter() - started < 10, (name, init_args)


def test_a_network_record_is_refused_where_the_builder_wraps_the_refusal_in_an_error_of_its_own(trained, tmp_path):
    """timm's builder turns the bounded build's refusal into an error of its own: that is still a refusal, not a
    network left to be built for real (a ViT 1,000 blocks deep: gigabytes, minutes)."""
    pytest.importorskip("timm")
    options = {"depth": 1000, "img_size": 8, "patch_size": 2}
    init_args = {"name": "vit_tiny_patch16_224", "num_classes": 10, "in_channels": 1, "options": options}
    path = doctor(trained, tmp_path, {"net": {"class_path": "template.nets.timm_net", "init_args": init_args}})
    started = time.perf_counter()
    with pytest.raises(UnsafeCheckpointError, match=re.escape(f"refusing {path}: its hyper_parameters.net is")):
        restore.restore(path, ClassificationModule, None, fit=False)
    assert time.perf_counter() - started < 20


@pytest.mark.parametrize("change", [{"bogus": 1}, {"zero_init_residual": 1}])
def test_arguments_a_builder_takes_through_kwargs_are_held_to_its_own_types(trained, tmp_path, change, capsys):
    """torchvision's builders take ``**kwargs`` on to the network: what jsonargparse would refuse there (an unknown
    name, a number for a bool) is the file's error, refused naming it, not a usage error blaming the user's options."""
    import torchvision

    checkpoint = torch.load(trained, weights_only=True)
    del checkpoint["integrity"]
    net = torchvision.models.resnet18(num_classes=10)
    checkpoint["state_dict"] = {f"net.{key}": value for key, value in net.state_dict().items()}
    init_args = {"num_classes": 10, **change}
    checkpoint["hyper_parameters"]["net"] = {"class_path": "torchvision.models.resnet18", "init_args": init_args}
    torch.save(checkpoint, tmp_path / "resnet18.ckpt")
    with pytest.raises(UnsafeCheckpointError, match=re.escape("its hyper_parameters.net.init_args is")):
        restore.restore(tmp_path / "resnet18.ckpt", ClassificationModule, None, fit=False)
    checkpoint["hyper_parameters"]["net"]["init_args"] = {"num_classes": 10, "zero_init_residual": True}
    torch.save(checkpoint, tmp_path / "resnet18.ckpt")
    restore.restore(tmp_path / "resnet18.ckpt", ClassificationModule, None, fit=False)  # its own type: restored


@pytest.mark.parametrize("entry", ["validate", "load_from_checkpoint"])
def test_a_mapping_of_plain_values_holding_a_class_path_is_never_built(trained, tmp_path, sentinel, entry):
    """timm_net's ``options`` (a mapping of plain values) took ``{"class_path": any.name, "init_args": ""}``, which the
    build then imported and called: any module, any function of no arguments. Only parameters that take a
    component build one."""
    pytest.importorskip("timm")
    name, marker = sentinel
    options = {"class_path": f"{name}.Net", "init_args": ""}
    init_args = {"name": "resnet18", "num_classes": 10, "in_channels": 1, "options": options}
    path = doctor(trained, tmp_path, {"net": {"class_path": "template.nets.timm_net", "init_args": init_args}})
    with pytest.raises((SystemExit, Exception)):
        enter(entry, path, tmp_path)
    assert not marker.exists() and name not in sys.modules


def test_a_network_record_never_loads_weights_a_builder_would_load_by_default(trained, tmp_path, monkeypatch):
    """torchvision's segmentation builders load an ImageNet backbone by default (``weights_backbone``), unpickling
    the hub cache's file as it finds it: a planted one ran code. Such builders are no classifiers and no registry
    names; and any builder's weights arguments are set to none where their defaults would load weights."""
    import torchvision

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    hub = tmp_path / "torch" / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    torch.save({"x": Payload(str(tmp_path / "ran"))}, hub / "mobilenet_v3_large-8738ca79.pth")  # its backbone's
    segmenter = torchvision.models.segmentation.lraspp_mobilenet_v3_large(weights_backbone=None, num_classes=10)
    checkpoint = torch.load(trained, weights_only=True)
    del checkpoint["integrity"]
    checkpoint["state_dict"] = {f"net.{key}": value for key, value in segmenter.state_dict().items()}
    name = "torchvision.models.segmentation.lraspp_mobilenet_v3_large"
    checkpoint["hyper_parameters"]["net"] = {"class_path": name, "init_args": {"num_classes": 10}}
    torch.save(checkpoint, tmp_path / "segmenter.ckpt")
    with pytest.raises(UnsafeCheckpointError, match="no net registered by the modules this command imports"):
        restore.restore(tmp_path / "segmenter.ckpt", ClassificationModule, None, fit=False)
    by_name = {"class_path": "torchvision.models.get_model", "init_args": {"name": "lraspp_mobilenet_v3_large"}}
    checkpoint["hyper_parameters"]["net"] = by_name  # torchvision's builder of any of its networks, by name
    torch.save(checkpoint, tmp_path / "segmenter.ckpt")
    with pytest.raises(UnsafeCheckpointError, match="no net registered by the modules this command imports"):
        restore.restore(tmp_path / "segmenter.ckpt", ClassificationModule, None, fit=False)
    assert not (tmp_path / "ran").exists()

    loaded = []
    monkeypatch.setattr(restore, "_registered", dict(restore._registered))

    @restore.register(name="eager")
    def eager(num_classes: int, in_channels: int, checkpoint_stages: bool, pretrained: bool = True) -> torch.nn.Module:
        loaded.append(pretrained)  # a download, or a file of the hub cache, unpickled
        return ResNetSmall(num_classes, in_channels, checkpoint_stages=checkpoint_stages)

    path = doctor(trained, tmp_path, {"net": {**torch.load(trained, weights_only=True)["hyper_parameters"]["net"]}})
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"]["net"]["class_path"] = "eager"
    checkpoint.pop("integrity", None)
    torch.save(checkpoint, path)
    restored = restore.restore(path, ClassificationModule, None, fit=False)
    assert loaded and not any(loaded), loaded
    assert restored.config["model"]["init_args"]["net"]["init_args"]["pretrained"] is False


def test_arguments_named_like_weights_that_load_none_are_restored_as_recorded():
    """Only a switch, a name or none loads weights: a width called ``pretrained_dim`` is the record's (else the net
    would be built another size), and ``weights_init: str`` keeps its default rather than becoming None."""

    def own(num_classes: int, pretrained_dim: int = 8, weights_init: str = "kaiming", weights: str | None = "a.pt"):
        raise AssertionError("never built here")

    given = {"num_classes": 3, "pretrained_dim": 16, "weights_init": "xavier", "weights": "b.pt"}
    kept = restore.arguments(own, given, "hyper_parameters.net.init_args", "x.ckpt", set())
    assert kept == {"num_classes": 3, "pretrained_dim": 16, "weights": None}


def progress(checkpoint: dict) -> dict:
    return checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def doubled(times: int) -> list:
    """A list of two of the same list, ``times`` deep: a few hundred bytes pickled, 2**times values walked."""
    value: list = [0]
    for _ in range(times):
        value = [value, value]
    return value


def group(checkpoint: dict, index: int) -> dict:
    return checkpoint["optimizer_states"][0]["param_groups"][index]


def weights_as(checkpoint: dict, dtype: torch.dtype) -> None:
    checkpoint["state_dict"]["net.head.weight"] = checkpoint["state_dict"]["net.head.weight"].to(dtype)


# Damage to what Lightning restores: the entry point, what the one refusal names, the change.
def averaged(checkpoint: dict, value: float, prefix: str = "module.") -> dict:
    """``checkpoint``'s float weights filled with ``value``, keyed as weight averaging's AveragedModel keys them."""
    weights = checkpoint["state_dict"].items()
    return {f"{prefix}{key}": w.clone().fill_(value) if w.is_floating_point() else w for key, w in weights}


STATE_ATTACKS = {
    "a schedule's counter of another type": (
        "fit",
        "lr_schedulers[0].last_epoch",
        lambda c: c["lr_schedulers"][0].update(last_epoch="x"),
    ),
    "a schedule longer than any run": (
        "fit",
        "lr_schedulers[0].total_steps",
        lambda c: c["lr_schedulers"][0].update(total_steps=10**18),
    ),
    "a learning rate of another type": (
        "fit",
        "optimizer_states[0].param_groups[0].lr",
        lambda c: c["optimizer_states"][0]["param_groups"][0].update(lr="x"),
    ),
    "no optimizer state": ("fit", "optimizer_states", lambda c: c.update(optimizer_states=[])),
    # Without them Lightning starts the run over, or loses the epoch's metrics and random states, without a word.
    "no loop state": ("fit", "it holds no loops,", lambda c: c.pop("loops")),
    "no callback or random states": (
        "fit",
        "no callbacks, rng_states",
        lambda c: [c.pop("callbacks"), c.pop("rng_states")],
    ),
    # Two names of one tensor, once wrapper prefixes are dropped: one silently stood in for the other in an export.
    "a weight named twice": (
        "export",
        "'net._orig_mod.head.weight' are both 'net.head.weight'",
        lambda c: c["state_dict"].update(
            {"net._orig_mod.head.weight": torch.zeros_like(c["state_dict"]["net.head.weight"])}
        ),
    ),
    # Settings no record holds, which torch restores over the run's: a silently other run, or code's attributes.
    "an optimizer group that maximizes the loss": (
        "fit",
        "optimizer_states[0].param_groups[1].maximize is True, where this run's recorded settings give False",
        lambda c: group(c, 1).update(maximize=True),
    ),
    "an optimizer group's other weight decay": (
        "fit",
        "optimizer_states[0].param_groups[0].weight_decay is 5.0, where this run's recorded settings give 0.05",
        lambda c: group(c, 0).update(weight_decay=5.0),
    ),
    "a learning rate above any the schedule sets": (
        "fit",
        "optimizer_states[0].param_groups[0].lr is 1000000000.0",
        lambda c: group(c, 0).update(lr=1e9),
    ),
    "a schedule's key that would replace a method": (
        "fit",
        "lr_schedulers[0] holds 'lr_factor'",
        lambda c: c["lr_schedulers"][0].update(lr_factor=1),
    ),
    "a schedule's key that would replace its optimizer": (
        "fit",
        "lr_schedulers[0] holds 'optimizer'",
        lambda c: c["lr_schedulers"][0].update(optimizer=1),
    ),
    "a schedule's other base rates": (
        "fit",
        "lr_schedulers[0].base_lrs[0] is 1.0, where this run's recorded settings give 0.003",
        lambda c: c["lr_schedulers"][0].update(base_lrs=[1.0, 1.0]),
    ),
    "a schedule counted past the checkpoint's steps": (
        "fit",
        "lr_schedulers[0].last_epoch is 1000",
        lambda c: c["lr_schedulers"][0].update(last_epoch=1000),
    ),
    "a loop counter of another type": (
        "fit",
        "loops.fit_loop.epoch_progress.current.completed",
        lambda c: progress(c).update(completed="x"),
    ),
    "a negative loop counter": (
        "fit",
        "loops.fit_loop.epoch_progress.current.completed",
        lambda c: progress(c).update(completed=-3),
    ),
    "an epoch beyond any run": ("fit", "epoch", lambda c: c.update(epoch=10**18)),
    "a negative step": ("fit", "global_step", lambda c: c.update(global_step=-7)),
    "random states of another kind": (
        "fit",
        "rng_states.python",
        lambda c: c.update(rng_states={"python": [1, 2], "numpy": "x", "torch": 3}),
    ),
    "a random state of another size": (
        "fit",
        "rng_states",
        lambda c: c["rng_states"].update(torch=torch.zeros(3, dtype=torch.uint8)),
    ),
    "a sampler epoch past any seed": (
        "fit",
        "DigitsDataModule.train_sampler.epoch",
        lambda c: c["DigitsDataModule"]["train_sampler"].update(epoch=10**30),
    ),
    "a split seed past any seed": (
        "validate",
        "datamodule_hyper_parameters.split_seed",
        lambda c: c["datamodule_hyper_parameters"].update(split_seed=10**40),
    ),
    "state nested thousands deep": ("fit", "callbacks.Deep[0][0]", lambda c: c["callbacks"].update(Deep=nested(5000))),
    "a list shared 2**28 times over": ("validate", "more than", lambda c: c["callbacks"].update(Shared=doubled(28))),
    "a schedule's abstract base class": (
        "fit",
        "hyper_parameters.lr_scheduler.class_path",
        lambda c: c["hyper_parameters"].update(lr_scheduler={"class_path": "torch.optim.lr_scheduler.LRScheduler"}),
    ),
    "loops Lightning cannot restore": ("fit", "KeyError: 'fit_loop'", lambda c: c["loops"].pop("fit_loop")),
    "NaN weights": (
        "validate",
        "net.head.weight",
        lambda c: c["state_dict"]["net.head.weight"].fill_(float("nan")),
    ),
    # Restored as they are by torch: NaN weights after the first step, or a broadcasting error naming no file.
    "a NaN moment of the optimizer": (
        "fit",
        "optimizer_states[0].state[0].exp_avg is not finite",
        lambda c: c["optimizer_states"][0]["state"][0]["exp_avg"].fill_(float("nan")),
    ),
    "a second moment below 0": (  # finite and of its shape: NaN at the first step, blamed on the learning rate
        "fit",
        "optimizer_states[0].state[0].exp_avg_sq is below 0",
        lambda c: c["optimizer_states"][0]["state"][0]["exp_avg_sq"].fill_(-1.0),
    ),
    # Weight averaging's (EMA's) states: Lightning loads the average from the counters over the state_dict.
    "weight averaging's counters holding weights": (
        "fit",
        "its averaging_state holds more than weight averaging's counters",
        lambda c: c.update(current_model_state=dict(c["state_dict"]), averaging_state=averaged(c, float("nan"))),
    ),
    "weight averaging's trained weights NaN": (
        "fit",
        "its current_model_state.net.stem.0.weight holds NaN",
        lambda c: c.update(current_model_state=averaged(c, float("nan"), "")),
    ),
    "an optimizer moment of another shape": (
        "fit",
        "optimizer_states[0].state[0].exp_avg is of shape (1,), not its parameter's (32, 1, 3, 3)",
        lambda c: c["optimizer_states"][0]["state"][0].update(exp_avg=torch.zeros(1)),
    ),
    "an optimizer's step count below 1": (
        "fit",
        "optimizer_states[0].state[0].step is tensor(-1.), not a count of the run's",
        lambda c: c["optimizer_states"][0]["state"][0].update(step=torch.tensor(-1.0)),
    ),
    "a state of no parameter": (
        "fit",
        "state holds 999",
        lambda c: c["optimizer_states"][0]["state"].update({999: {}}),
    ),
    # The schedule's counters were bounded by this number, which Lightning only writes: it counts steps by the loops.
    "a global step the loops do not count": (
        "fit",
        "its global_step is 2147483648, where its loops count",
        lambda c: [c.update(global_step=2**31), c["lr_schedulers"][0].update(last_epoch=2**31, _step_count=2**31)],
    ),
    "complex weights": ("validate", "head.weight", lambda c: weights_as(c, torch.complex64)),
    "whole-number weights": ("validate", "head.weight", lambda c: weights_as(c, torch.int64)),
}


@pytest.mark.slow
@pytest.mark.parametrize("attack", STATE_ATTACKS)
def test_damaged_state_is_refused_in_one_line_naming_the_file_and_key(trained, tmp_path, monkeypatch, capsys, attack):
    """What Lightning restores (loops, optimizer, schedule and random states, the data's, the weights) must be what this
    run keeps: values of its kinds, counts in range, finite weights; an error Lightning raises restoring it names the
    file. Never a traceback, a run that trains on silently, or NaN scores."""
    entry, named, change = STATE_ATTACKS[attack]
    checkpoint = torch.load(trained, weights_only=True)
    del checkpoint["integrity"]  # a digest detects damage, not intent
    change(checkpoint)
    path = tmp_path / "damaged.ckpt"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(50_000)  # pickling the deepest
    try:
        torch.save(checkpoint, path)
    finally:
        sys.setrecursionlimit(limit)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        enter(entry, path, tmp_path)
    said = capsys.readouterr().err
    refusals = [line for line in said.splitlines() if f"refusing {path}: " in line]
    assert exit_info.value.code != 0 and "Traceback" not in said
    assert len(refusals) == 1 and named in refusals[0], said


@pytest.mark.parametrize(
    "key, value",
    [
        ("seed_everything", -5),
        ("seed_everything", 10**26),
        ("trainer.check_val_every_n_epoch", 0),
        ("trainer.accumulate_grad_batches", 10**21),
        ("trainer.precision", 64),
        ("trainer.precision", "transformer-engine"),
    ],
)
def test_a_runs_settings_out_of_range_are_refused_naming_config_yaml(
    trained, tmp_path, monkeypatch, capsys, key, value
):
    monkeypatch.chdir(tmp_path)
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    plant(config, key, value)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit):
        enter("fit", run_dir / "checkpoints" / "last.ckpt", tmp_path)
    assert f"refusing {run_dir / 'config.yaml'}: its {key} is {value!r}" in capsys.readouterr().err


@pytest.mark.parametrize("entry", ["test", "fit"])
def test_another_network_named_beside_a_checkpoint_is_refused_naming_both(trained, tmp_path, capsys, entry):
    """Its tensors would not load into it: the error was 47 lines of size mismatches, naming neither network."""
    with pytest.raises(SystemExit):
        enter(entry, trained, tmp_path, "--model.net", "template.nets.ResNet18")
    error = capsys.readouterr().err
    assert "holds the weights of a template.nets.ResNetSmall, not of the template.nets.ResNet18" in error
    assert "size mismatch" not in error and not (tmp_path / "runs").exists()


def test_a_dangling_link_where_the_next_version_would_go_is_passed_over(trained, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    (run_dir.parent / "version_1").symlink_to(tmp_path / "nowhere")
    enter("validate", run_dir / "checkpoints" / "last.ckpt", tmp_path)
    assert (run_dir.parent / "version_2" / "config.yaml").is_file() and not (tmp_path / "nowhere").exists()
    for odd in ("version_²", f"version_{'9' * 200}", "version_3_old"):  # no number int() reads, one too long, a copy
        (run_dir.parent / odd).mkdir()
    enter("validate", run_dir / "checkpoints" / "last.ckpt", tmp_path)
    assert (run_dir.parent / "version_3" / "config.yaml").is_file()


def test_naming_your_own_classes_again_never_imports_a_name_a_mapping_holds(sentinel):
    """The summary's test command names your own classes again, read where each class stands (model, data,
    model.net...); a class_path inside a mapping of plain values (a resumed record's timm options) is not imported."""
    name, marker = sentinel
    options = {"class_path": f"{name}.Net"}
    net = {"class_path": "template.nets.timm_net", "init_args": {"options": options}}
    config = {"model": {"class_path": "my_module.F1Module", "init_args": {"net": net}}, "data": {"class_path": "x.D"}}
    assert restore.named_again(config) == ["--model", "my_module.F1Module", "--data", "x.D"]
    assert not marker.exists() and name not in sys.modules


class PetsData(torch.nn.Module):
    """A class of your own, registered under a name of its own."""


def test_a_class_you_registered_is_named_again_by_the_module_that_registers_it(monkeypatch):
    """Your registration happens where your module is imported: a later command of the checkpoint (the summary's
    test command) names that module's class, or the checkpoint's name would be unknown there."""
    monkeypatch.setattr(restore, "_registered", dict(restore._registered))
    restore.register(PetsData, name="pets_data")
    config = {"model": {"class_path": "template.module.ClassificationModule"}, "data": {"class_path": "pets_data"}}
    assert restore.named_again(config) == ["--data", f"{__name__}.PetsData"]


def test_a_resume_that_fails_leaves_the_runs_record_as_its_last_checkpoint_left_it(trained, tmp_path, monkeypatch):
    """config.yaml is what a plain ``--ckpt_path last`` resumes with: a resume that failed before its first checkpoint
    (with --trainer.max_epochs 3) must not leave its settings there for the next resume to train on, silently."""
    monkeypatch.chdir(tmp_path)
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    recorded = (run_dir / "config.yaml").read_bytes()
    more = ["--trainer.max_epochs", "3", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]

    def boom(*args, **kwargs):
        raise RuntimeError("the machine went away")

    with monkeypatch.context() as patch:
        patch.setattr(ClassificationModule, "training_step", boom)
        with pytest.raises(SystemExit):
            main(
                ["fit", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt"), *more]
            )
    assert (run_dir / "config.yaml").read_bytes() == recorded
    main(["fit", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt"), *more])
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]["max_epochs"] == 3  # it ran: recorded


@pytest.mark.parametrize(
    "change, named",
    [
        (["--model.optimizer.lr", "0.03"], "model.optimizer.init_args.lr 0.003 saved, 0.03 given"),
        (["--model.optimizer", "torch.optim.SGD", "--model.optimizer.lr", "0.5"], "model.optimizer.class_path"),
        (["--model.lr_scheduler", "null"], "model.lr_scheduler"),
    ],
)
def test_a_resume_with_other_optimizer_settings_is_refused_naming_them(
    trained, tmp_path, monkeypatch, capsys, change, named
):
    """The optimizer's state and the schedule a checkpoint saved are restored over what a resume builds: a new
    learning rate was silently never used (while config.yaml said it was), another optimizer failed mid-epoch."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        enter("fit", trained, tmp_path, *change)
    err = capsys.readouterr().err
    assert named in err and f"--weights_file {trained}" in err and not (tmp_path / "runs").exists()


def test_export_shows_a_checkpoint_s_text_in_its_error_as_escapes(trained, tmp_path, capsys):
    """export printed its own errors raw: a key with an escape sequence wrote a green "export ok" over the refusal."""
    checkpoint = torch.load(trained, weights_only=True)
    checkpoint["callbacks"]["\x1b]0;PWNED\x07\x1b[2K\r\x1b[32mexport ok\x1b[0m"] = -1
    torch.save(checkpoint, tmp_path / "escaped.ckpt")
    with pytest.raises(SystemExit):
        enter("export", tmp_path / "escaped.ckpt", tmp_path)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b]0;PWNED" in err and "refusing" in err


def test_a_record_without_optimizer_settings_resumes_without_a_word_about_them(trained, tmp_path, monkeypatch):
    """A module built in Python (its optimizer a class, not a record) saves none: nothing to hold a resume to."""
    monkeypatch.chdir(tmp_path)
    checkpoint = torch.load(trained, weights_only=True)
    for key in ("optimizer", "lr_scheduler", "layer_decay"):
        checkpoint["hyper_parameters"].pop(key, None)
    checkpoint.pop("integrity")
    torch.save(checkpoint, tmp_path / "bare.ckpt")
    enter("fit", tmp_path / "bare.ckpt", tmp_path)  # resumed: no SystemExit
    assert list((tmp_path / "runs").glob("*/version_0/checkpoints/last.ckpt"))  # and trained on


@pytest.mark.parametrize("entry", ["fit", "test", "a sweep's trial"])
def test_a_command_never_writes_into_another_runs_directory(trained, tmp_path, monkeypatch, capsys, entry):
    """A fit given a finished run's version wrote over its config.yaml, metrics.csv and last.ckpt beside its own best
    (with Lightning's warning alone), and `--ckpt_path best` then found the old run's best: refused, nothing written.
    An evaluation's, or a sweep's trial placed where a run already is, likewise."""
    monkeypatch.chdir(tmp_path)
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    if entry == "a sweep's trial":  # `template sweep` and `cv` place each fit with run_name
        with pytest.raises(ValueError, match="holds a run already.*move it away"):
            cli(["fit", *tiny_args(tmp_path / "runs")], run_name=("digits", "version_0"))
    else:
        version = ["--trainer.logger.init_args.version", "0"]
        with pytest.raises(SystemExit, match="1"):
            if entry == "test":
                enter("test", trained, tmp_path, *version)
            else:  # a new run, not a resume
                main(["fit", *tiny_args(tmp_path / "runs"), *version, "--trainer.max_epochs", "1"])
        error = capsys.readouterr().err
        assert f"{run_dir} holds a run already" in error and "leave --trainer.logger.init_args.version out" in error
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before
    assert [path.name for path in run_dir.parent.iterdir()] == ["version_0"]


def test_a_resumed_runs_config_yaml_reruns_the_run_from_scratch(trained, tmp_path, monkeypatch):
    """README: a run's config.yaml reruns it with --config. A resumed run's named its checkpoint as ckpt_path (and
    its run directory as the logger's version): the rerun restored the finished run, trained no epoch, exited 0."""
    monkeypatch.chdir(tmp_path)
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    last = run_dir / "checkpoints" / "last.ckpt"
    quick = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    main(["fit", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(last), *quick])
    text = (run_dir / "config.yaml").read_text()
    recorded = yaml.safe_load(text)
    assert recorded["ckpt_path"] is None and recorded["trainer"]["logger"]["init_args"]["version"] is None
    assert text.startswith(f"# resumed from {last} ")  # where it resumed from, said
    resumed = last.read_bytes()
    rerun = cli(["fit", "--config", str(run_dir / "config.yaml")])
    assert Path(rerun.trainer.log_dir) == run_dir.parent / "version_1" and rerun.trainer.global_step == 2 * 2
    assert last.read_bytes() == resumed


def test_a_run_folder_named_with_a_line_break_is_resumed_twice(trained, tmp_path, monkeypatch):
    """The comment naming the checkpoint carried the break into config.yaml: the rest of the name became YAML, which
    the next resume refused, and a --config of it failed."""
    monkeypatch.chdir(tmp_path)
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "x\n--- |" / "version_0")
    quick = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    main(["fit", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt"), *quick])
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["ckpt_path"] is None
    quick[1] = "3"
    main(["fit", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt"), *quick])
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 2


BIG_NET = {
    "class_path": "template.nets.ResNet",
    "init_args": {"in_channels": 0, "widths": [4096], "blocks_per_stage": [1]},
}


@pytest.mark.parametrize(
    "change, key",
    [
        ({"num_classes": 2**32 - 1, "class_names": None}, "num_classes"),  # a list of 4 billion names to make
        ({"class_names": [f"c{index}" for index in range(70_000)]}, "class_names"),
        ({"class_names": ["a" * 300] * 10}, "class_names"),  # repeated in every row of predictions.csv
        # An export carries them to a deployment that indexes and prints them: one per class, each a printable name.
        ({"class_names": ["0", "1", "2"]}, "class_names"),
        ({"class_names": [*"012345678", "cat\x1b]0;pwned\x07"]}, "class_names"),
        ({"class_names": [*"012345678", "0"]}, "class_names"),
        ({"class_names": [*"012345678", ""]}, "class_names"),
        ({"input_shape": [64, 4096, 4096]}, "input_shape"),  # an 8 GiB example batch
        ({"lr_scheduler": {"class_path": "torch.optim.lr_scheduler.LambdaLR", "init_args": {"lr_lambda": 0.5}}},
         "lr_scheduler.init_args.lr_lambda"),  # its annotation names Callable, imported for type checkers only
        ({"net": BIG_NET}, "net"),  # unbuildable as written (in_channels 0): was let through to be built as the data says
        ({"lr_scheduler": {"class_path": "torch.optim.lr_scheduler.MultiStepLR",
                           "init_args": {"milestones": list(range(300_000))}}}, "record"),  # parsed again as YAML
    ],
)  # fmt: skip
def test_sizes_and_values_no_run_has_are_refused_before_anything_is_built(trained, tmp_path, change, key):
    path = doctor(trained, tmp_path, change)
    key = key if key == "record" else f"hyper_parameters.{key}"
    with pytest.raises(UnsafeCheckpointError, match=re.escape(f"refusing {path}: its {key}")):
        restore.restore(path, ClassificationModule, None, fit=False)


def test_class_names_of_any_script_are_restored(trained, tmp_path):
    """str.isprintable refused a no-break space, an ideographic space and the joiners of Persian words and emoji:
    a folder's own names, so fit trained into a checkpoint that test, export and resume refused."""
    names = ["Golden Retriever", "café", "猫", "a\xa0b", "犬\u3000猫", "می\u200cخواهم", "👩\u200d🔬", *"789"]
    restored = restore.restore(doctor(trained, tmp_path, {"class_names": names}), ClassificationModule, None, fit=False)
    assert restored.trained["class_names"] == names


def test_how_to_run_is_the_commands_and_a_checkpoint_without_a_data_record_is_said_to_be_unchecked(
    trained, tmp_path, monkeypatch
):
    path = doctor(trained, tmp_path, {"compile": True})  # compiling writes and loads generated code
    assert "compile" not in restore.restore(path, ClassificationModule, None, fit=False).config["model"]["init_args"]
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["datamodule_hyper_parameters"]
    torch.save(checkpoint, path)
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match=re.escape(f"{path} records no DataModule")):
        cli(["validate", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(path), "--trainer.limit_val_batches", "1"])


def test_a_resume_says_which_trainer_settings_it_takes_from_its_runs_config_yaml(
    trained, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["trainer"]["max_epochs"] = 2**32 - 1  # a stranger's run: "the same run" would train for ever, unsaid
    config["trainer"]["min_steps"] = 3
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    ckpt_path = ["--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt")]
    main(["fit", *tiny_args(tmp_path / "runs"), *ckpt_path, "--trainer.max_steps", "1"])  # steps it has: at an end
    said = capsys.readouterr().out
    assert f"where no option is given: max_epochs={2**32 - 1}, " in said and "min_steps=3" in said
    enter("fit", run_dir / "checkpoints" / "last.ckpt", tmp_path)  # its options give max_epochs 2: they override it
    said = next(line for line in capsys.readouterr().out.splitlines() if "where no option is given" in line)
    assert "min_steps=3" in said and "max_epochs" not in said and "limit_train_batches" not in said


def test_a_runs_config_yaml_never_chooses_the_best_by_another_metric_than_its_checkpoint(trained, tmp_path):
    """config.yaml's checkpoint.monitor and mode are taken by a resume: edited to train/loss (a stranger's run), the
    resume kept its bests by training loss, the most overfit, with no word of it. The checkpoint's own are taken."""
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    last = run_dir / "checkpoints" / "last.ckpt"
    resumed = restore.restore(last, ClassificationModule, tmp_path / "runs", fit=True)
    assert resumed.config["checkpoint"] == {"monitor": "val/acc", "mode": "max"}
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["checkpoint"].update(monitor="train/loss", mode="min")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.warns(UserWarning, match="'train/loss', mode 'min'; the checkpoint resumed kept them by .'val/acc', "):
        resumed = restore.restore(last, ClassificationModule, tmp_path / "runs", fit=True)
    assert resumed.config["checkpoint"] == {"monitor": "val/acc", "mode": "max"}


def planted(trained: Path, tmp_path: Path, plant) -> Path:
    """A copy of the trained run, its last.ckpt changed by ``plant`` (its digest left out: damage, not intent)."""
    run_dir = shutil.copytree(trained.parents[1], tmp_path / "runs" / "digits" / "version_0")
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    del checkpoint["integrity"]
    plant(checkpoint)
    torch.save(checkpoint, run_dir / "checkpoints" / "last.ckpt")
    return run_dir / "checkpoints" / "last.ckpt"


def nan_scores(checkpoint: dict) -> None:
    state = next(v for k, v in checkpoint["callbacks"].items() if k.startswith("ModelCheckpoint{'monitor': 'val"))
    state.update(best_model_score=torch.tensor(float("nan")), kth_value=torch.tensor(float("nan")))


def huge_batches(checkpoint: dict) -> None:
    checkpoint["datamodule_hyper_parameters"]["batch_size"] = 4_000_000_000  # the whole folder in one batch


@pytest.mark.parametrize(
    "plant, refused",
    [
        (nan_scores, "state holds a score that is NaN or not one number"),
        (huge_batches, r"datamodule_hyper_parameters.batch_size is 4000000000, a batch of over 1,073,741,824 input"),
    ],
)
def test_a_resume_refuses_training_state_that_would_keep_no_new_best(trained, tmp_path, plant, refused):
    """A NaN best score: no later score beat it, and the resumed run saved no new best (`best` then took epoch 0's).
    A batch size of billions: every command of the checkpoint made the whole split one batch, memory unbounded."""
    last = planted(trained, tmp_path, plant)
    with pytest.raises(CheckpointError, match=refused):
        cli(["fit", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(last), "--trainer.max_epochs", "2"])


def test_early_stoppings_patience_is_the_commands_not_the_checkpoints(trained, tmp_path):
    """Lightning restored EarlyStopping's patience from the file: a stranger's 0 stopped the run at once."""
    key = "EarlyStopping{'monitor': 'val/loss', 'mode': 'min'}"
    state = {"wait_count": 0, "stopped_epoch": 0, "best_score": torch.tensor(0.0), "patience": 0}
    last = planted(trained, tmp_path, lambda checkpoint: checkpoint["callbacks"].update({key: state}))
    stopping = ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val/loss"]
    stopping += ["--trainer.callbacks.patience", "100", "--trainer.limit_train_batches", "2"]
    resumed = cli(
        ["fit", *tiny_args(tmp_path / "runs"), "--ckpt_path", str(last), "--trainer.max_epochs", "3", *stopping]
    )
    assert resumed.trainer.current_epoch == 3  # not stopped after its first epoch


def test_a_datamodules_classes_are_held_to_the_bounds_of_class_names(trained, tmp_path):
    checkpoint = torch.load(trained, weights_only=True)
    folder = {"_class_path": "template.data.ImageFolderDataModule", "image_size": 8, "channels": "grayscale"}
    for classes, refused in (
        (["cat", "N" * 300], "longer than 255"),
        ([f"c{i}" for i in range(70_000)], "over 65,536"),
    ):
        checkpoint["datamodule_hyper_parameters"] = {**folder, "classes": classes}
        torch.save(checkpoint, tmp_path / "doctored.ckpt")
        with pytest.raises(UnsafeCheckpointError, match=f"datamodule_hyper_parameters.classes is .*{refused}"):
            restore.restore(tmp_path / "doctored.ckpt", ClassificationModule, None, fit=False)
    checkpoint["datamodule_hyper_parameters"] = {**folder, "classes": [f"c{i}" for i in range(3000)]}
    torch.save(checkpoint, tmp_path / "doctored.ckpt")  # a parse of minutes: left to the data's own folders
    with pytest.warns(UserWarning, match="3,000 classes are not given as data.classes"):
        restored = restore.restore(tmp_path / "doctored.ckpt", ClassificationModule, None, fit=False)
    assert "classes" not in restored.config["data"]["init_args"]
