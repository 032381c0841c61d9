"""Pretrained weights from the hub cache or a file, a new head, the weights' input size, and a frozen-then-unfrozen
backbone."""

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import torchvision
import yaml
from conftest import tiny_args, write_image_folder
from safetensors.torch import save_file
from torchvision.models import ResNet18_Weights

from template.checkpoints import DamagedCheckpointError, load_pretrained
from template.cli import cli
from template.commands import main
from template.nets import ResNetSmall

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> dict[str, torch.Tensor]:
    """resnet18's DEFAULT weights file, as torch hub keeps it, in a TORCH_HOME under tmp_path."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    torch.manual_seed(0)
    state = torchvision.models.resnet18().state_dict()  # 1000-class head, as the real file
    state["conv1.weight"].fill_(0.01)  # recognisable after loading
    cache_file(tmp_path, monkeypatch, lambda path: torch.save(state, path))
    return state


def cache_file(tmp_path, monkeypatch, write) -> Path:
    """resnet18's DEFAULT weights file in the torch hub cache, named with its own hash prefix as torchvision's
    files are (``resnet18-<sha256[:8]>.pth``), the weights' URL pointing at that name."""
    folder = tmp_path / "torch" / "hub" / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    write(folder / "written")
    digest = hashlib.sha256((folder / "written").read_bytes()).hexdigest()[:8]
    path = (folder / "written").rename(folder / f"resnet18-{digest}.pth")
    monkeypatch.setattr(ResNet18_Weights.DEFAULT.value, "url", f"https://download.pytorch.org/models/{path.name}")
    return path


def test_a_poisoned_or_damaged_hub_cache_file_is_refused_and_runs_nothing(tmp_path, monkeypatch, capsys):
    """torch hub's own loader unpickles a cached file whatever it holds; here it is tensors only, and its
    contents must match the hash prefix in its name."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    path = cache_file(tmp_path, monkeypatch, lambda path: torch.save({"x": Payload(str(marker))}, path))
    args = ["fit", *tiny_args(tmp_path / "runs"), "--model.net", "torchvision.models.resnet18"]
    args += ["--model.net.weights", "DEFAULT", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1"]
    with pytest.raises(SystemExit):
        main(args)
    assert f"refusing to load {path}: it needs arbitrary pickled objects" in capsys.readouterr().err
    assert not marker.exists()
    path.write_bytes(path.read_bytes() + b"\0")  # no longer what its name says
    with pytest.raises(SystemExit):
        main(args)
    assert f"refusing {path}: its contents do not match the hash" in capsys.readouterr().err
    assert not marker.exists()


class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.slow
def test_finetuning_loads_cached_weights_replaces_the_head_and_unfreezes_on_schedule(run_cli, tmp_path, hub_cache):
    shutil.copytree(REPO / "configs", tmp_path / "configs")  # the commands of the README, run in a clone
    images = write_image_folder(tmp_path / "images", classes=("cat", "dog"), per_class=8, splits=("train", "test"))
    args = ["--config", "configs/imagefolder.yaml", "--config", "configs/finetune.yaml", "--data.root", str(images),
            "--data.image_size", "16", "--data.batch_size", "4", "--data.num_workers", "0"]  # fmt: skip
    first = run_cli("fit", *args, "--trainer.max_epochs", "1")
    net = first.model.net
    assert net.fc.out_features == 2  # the weights' 1000-class head replaced
    assert first.datamodule.mean.tolist() == pytest.approx([0.485, 0.456, 0.406])  # the weights' statistics
    # Epoch 0 trained the head alone: the backbone is the cached weights, unchanged.
    assert torch.equal(net.conv1.weight, hub_cache["conv1.weight"]) and torch.equal(
        net.layer4[1].bn2.running_mean, hub_cache["layer4.1.bn2.running_mean"]
    )
    assert not torch.equal(net.fc.weight, torch.zeros_like(net.fc.weight))
    assert [group["name"] for group in first.trainer.optimizers[0].param_groups] == ["decay", "no_decay"]

    # Resumed into epoch 1: the backbone joins at a tenth of the head's learning rate, and changes.
    second = run_cli("fit", *args, "--trainer.max_epochs", "2", "--ckpt_path", "last")
    groups = {group["name"]: group for group in second.trainer.optimizers[0].param_groups}
    assert set(groups) == {"decay", "no_decay", "backbone_decay", "backbone_no_decay"}
    assert groups["backbone_decay"]["lr"] == pytest.approx(0.1 * groups["decay"]["lr"])
    assert groups["backbone_no_decay"]["weight_decay"] == 0.0
    assert not torch.equal(second.model.net.conv1.weight, hub_cache["conv1.weight"])

    # Resumed past it (epoch 2): the restart freezes the backbone at setup, and it is unfrozen again, not left out.
    before = second.model.net.conv1.weight.detach().clone()
    third = run_cli("fit", *args, "--trainer.max_epochs", "3", "--ckpt_path", "last")
    assert len(third.trainer.optimizers[0].param_groups) == 4
    assert all(parameter.requires_grad for parameter in third.model.net.parameters())
    assert not torch.equal(third.model.net.conv1.weight, before)

    # The checkpoint and the images to evaluate: the pretrained file is not needed any more.
    shutil.rmtree(tmp_path / "torch")
    assert "test/acc" in run_cli("test", "--ckpt_path", "last", "--data.root", str(images)).trainer.callback_metrics
    main(["export", "--ckpt_path", "last", "--format", "safetensors", "--output", str(tmp_path / "net.safetensors")])


def test_missing_pretrained_weights_are_named_with_where_to_put_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.chdir(tmp_path)
    images = write_image_folder(tmp_path / "images", classes=("cat", "dog"), per_class=4)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--data", "template.data.ImageFolderDataModule", "--data.root", str(images),
              "--model.net", "torchvision.models.resnet18", "--model.net.weights", "DEFAULT"])  # fmt: skip
    assert exit_info.value.code == 1
    error = capsys.readouterr().err
    assert "resnet18-f37072fd.pth" in error and str(tmp_path / "torch" / "hub" / "checkpoints") in error
    assert not (tmp_path / "runs").exists()


def test_weights_file_starts_the_network_and_its_checkpoint_evaluates_without_it(run_cli, tmp_path, capsys):
    torch.manual_seed(0)
    source = ResNetSmall(num_classes=4, in_channels=1)  # the project's own network, of another class count
    source.stem[0].weight.data.fill_(0.01)  # recognisable after loading
    torch.save({"state_dict": {f"net.{k}": v for k, v in source.state_dict().items()}}, tmp_path / "mine.ckpt")
    args = ["--weights_file", str(tmp_path / "mine.ckpt"), "--trainer.max_epochs", "1", "--trainer.limit_train_batches",
            "1", "--trainer.limit_val_batches", "1", "--model.optimizer.lr", "1e-9"]  # fmt: skip
    net = run_cli("fit", *args).model.net
    report = capsys.readouterr().out
    assert f"weights_file {tmp_path / 'mine.ckpt'}: " in report
    assert (
        "head.weight (4, 128) vs (10, 128)" in report
        and "new classifier (head): Linear(in_features=128, out_features=10" in report
    )
    assert torch.allclose(net.stem[0].weight, source.stem[0].weight, atol=1e-6)  # started from the file
    assert net.head.out_features == 10  # the digits' head, not the file's

    (tmp_path / "mine.ckpt").unlink()  # the checkpoint holds every weight: evaluation and export need no file
    assert "test/acc" in run_cli("test", "--ckpt_path", "last").trainer.callback_metrics
    main(["export", "--ckpt_path", "last", "--runs_dir", str(run_cli.runs_dir), "--format", "safetensors",
          "--output", str(tmp_path / "net.safetensors")])  # fmt: skip


@pytest.mark.parametrize("command", ["fit", "test"])
def test_a_weights_file_beside_a_checkpoint_is_said_to_be_unread_and_not_recorded(run_cli, tmp_path, command):
    """A resume (or an evaluation) given --weights_file too (a requeue script's same options) never reads the file:
    it says so, and its config.yaml does not name it."""
    quick = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1"]
    run_cli("fit", *quick)
    torch.save(ResNetSmall(num_classes=10, in_channels=1).state_dict(), tmp_path / "other.pt")
    more = ["--trainer.max_epochs", "2", *quick[2:]] if command == "fit" else ["--trainer.limit_test_batches", "1"]
    with pytest.warns(UserWarning, match=rf"--weights_file {re.escape(str(tmp_path / 'other.pt'))} not read: --ckpt"):
        ran = run_cli(command, "--ckpt_path", "last", "--weights_file", str(tmp_path / "other.pt"), *more)
    recorded = yaml.safe_load((Path(ran.trainer.log_dir) / "config.yaml").read_text())
    assert recorded["weights_file"] is None


def test_torchvision_weights_from_a_safetensors_file_take_their_statistics_and_size(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # an empty hub cache: the file is read instead
    monkeypatch.chdir(tmp_path)
    state = torchvision.models.resnet18().state_dict()  # 1000 classes, as ImageNet's
    state["conv1.weight"].fill_(0.01)
    save_file(state, tmp_path / "resnet18.safetensors")
    images = write_image_folder(tmp_path / "images", classes=("cat", "dog"), per_class=4)
    built = cli(["--config", str(REPO / "configs/imagefolder.yaml"), "--config", str(REPO / "configs/finetune.yaml"),
                 "--data.root", str(images), "--weights_file", str(tmp_path / "resnet18.safetensors"),
                 "--trainer.accelerator", "cpu"], run=False)  # fmt: skip
    assert torch.equal(built.model.net.conv1.weight, state["conv1.weight"])
    assert built.model.net.fc.out_features == 2
    assert "fc.weight (1000, 512) vs (2, 512)" in capsys.readouterr().out
    assert built.datamodule.image_size == (224, 224)  # resnet18's crop, and ImageNet's statistics
    assert built.config.data.init_args.mean == pytest.approx([0.485, 0.456, 0.406])


def test_weights_file_missing_or_of_another_network_is_refused_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--weights_file", "nowhere/net.pth"])
    assert exit_info.value.code == 1
    assert "weights_file nowhere/net.pth: no such file" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()

    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "resnet18.pth")
    with pytest.raises(ValueError, match=r"not of this network \(ResNetSmall\): \d+ not in the network \(bn1"):
        load_pretrained(ResNetSmall(num_classes=10, in_channels=1), tmp_path / "resnet18.pth", "head")
    torch.save(ResNetSmall(num_classes=10, in_channels=3).state_dict(), tmp_path / "rgb.pth")  # another stem
    shapes = r"1 other shapes \(stem.0.weight \(32, 3, 3, 3\) in the file, \(32, 1, 3, 3\) here\)"
    with pytest.raises(ValueError, match=shapes + r"; they take 3-channel images, this data has 1 .*--data.channels"):
        load_pretrained(ResNetSmall(num_classes=10, in_channels=1), tmp_path / "rgb.pth", "head")
    # A deeper network of the same family shares its first tensors: half a network loaded is refused too.
    torch.save(torchvision.models.resnet34().state_dict(), tmp_path / "resnet34.pth")
    with pytest.raises(ValueError, match=r"\(ResNet\): 96 not in the network \(layer1.2.bn1.bias"):
        load_pretrained(torchvision.models.resnet18(num_classes=2), tmp_path / "resnet34.pth", "fc")
    # Told by their bytes, not their names: safetensors weights called .bin load, a config called .pth is named.
    save_file(ResNetSmall(num_classes=10, in_channels=1).state_dict(), tmp_path / "weights.bin")
    load_pretrained(ResNetSmall(num_classes=10, in_channels=1), tmp_path / "weights.bin", "head")
    (tmp_path / "config.pth").write_text("model:\n  lr: 0.1\n")
    with pytest.raises(DamagedCheckpointError, match="config.pth is no file torch.save wrote, no weights file"):
        load_pretrained(ResNetSmall(num_classes=10, in_channels=1), tmp_path / "config.pth", "head")
    torch.save({"not": "a state_dict"}, tmp_path / "other.pth")
    with pytest.raises(DamagedCheckpointError, match="holds no state_dict of named tensors"):
        load_pretrained(ResNetSmall(num_classes=10, in_channels=1), tmp_path / "other.pth", "head")


def test_pretrained_weights_set_the_image_size_unless_it_is_given(tmp_path, monkeypatch, hub_cache):
    monkeypatch.chdir(tmp_path)
    images = write_image_folder(tmp_path / "images", classes=("cat", "dog"), per_class=4)
    configs = ["--config", str(REPO / "configs/imagefolder.yaml"), "--data.root", str(images),
               "--trainer.accelerator", "cpu"]  # fmt: skip
    finetune = ["--config", str(REPO / "configs/finetune.yaml")]
    for extra, size in (([], 32), (finetune, 224), ([*finetune, "--data.image_size", "16"], 16)):
        built = cli([*configs, *extra], run=False)
        assert built.datamodule.image_size == (size, size)
        assert built.config.data.init_args.image_size == size  # config.yaml records the size used


def test_the_backbone_is_everything_but_the_head_where_the_head_shares_a_sequential_with_it():
    """One ``layers`` Sequential, the head its last layer: the top-level children held the head, none froze."""
    from template.nets.pretrained import backbone_of

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.BatchNorm2d(1)
            layers = [torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 2)]
            self.layers = torch.nn.Sequential(*layers)

    net = Net()
    net.token = torch.nn.Parameter(torch.zeros(1))  # the net's own (a ViT's cls_token, pos_embed)
    frozen = {id(p) for part in backbone_of(net) for p in part.parameters()}
    assert frozen == {id(p) for p in [*net.scale.parameters(), *net.layers[0].parameters(), net.token]}


def test_unfreezing_leaves_the_networks_own_fixed_parameters_fixed():
    from types import SimpleNamespace

    from template.callbacks.finetune import FreezeBackbone
    from template.nets.layers import WhiteningConv

    net = torch.nn.Sequential(WhiteningConv(1), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    net(torch.zeros(1, 1, 4, 4))
    trainer = SimpleNamespace(lr_scheduler_configs=[])
    freezing, module = FreezeBackbone(unfreeze_at_epoch=1), SimpleNamespace(net=net, trainer=trainer)
    freezing.freeze_before_training(module)
    assert not any(parameter.requires_grad for parameter in net[0].parameters())
    optimizer = torch.optim.SGD(net[2].parameters(), lr=0.1)
    freezing.finetune_function(module, 1, optimizer)
    assert net[0].bias.requires_grad and not net[0].weight.requires_grad  # computed, never learned
    optimized = [id(parameter) for group in optimizer.param_groups for parameter in group["params"]]
    assert id(net[0].bias) in optimized and id(net[0].weight) not in optimized


@pytest.mark.parametrize(
    "schedule",
    [
        lambda optimizer: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10),
        lambda optimizer: torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10),
        lambda optimizer: torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0),
        lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step),
    ],
    ids=["cosine", "one-cycle", "plateau", "lambda"],
)
def test_the_unfrozen_backbone_follows_the_heads_schedule_at_its_ratio(schedule):
    """torch's schedules keep per-group values of the groups they began with: the backbone's would stay unscheduled
    (CosineAnnealingLR), or fail (OneCycleLR's max_lr, LambdaLR's lr_lambdas)."""
    from types import SimpleNamespace

    from template.callbacks.finetune import FreezeBackbone

    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(net[2].parameters(), lr=0.1, momentum=0.9)
    scheduler = schedule(optimizer)
    trainer = SimpleNamespace(lr_scheduler_configs=[SimpleNamespace(scheduler=scheduler)])
    freezing, module = FreezeBackbone(unfreeze_at_epoch=1), SimpleNamespace(net=net, trainer=trainer)
    freezing.freeze_before_training(module)
    freezing.finetune_function(module, 1, optimizer)
    for _ in range(4):
        optimizer.step()
        scheduler.step(1.0) if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) else scheduler.step()
    head, *backbone = (group["lr"] for group in optimizer.param_groups)
    assert head != 0.1 and backbone == pytest.approx([0.1 * head] * 2)
