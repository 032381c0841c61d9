"""Pretrained torchvision weights from the hub cache, a new head, and a frozen-then-unfrozen backbone."""

import shutil
from pathlib import Path

import pytest
import torch
import torchvision
from conftest import write_image_folder

from template.commands import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> dict[str, torch.Tensor]:
    """resnet18's DEFAULT weights file, as torch hub keeps it, in a TORCH_HOME under tmp_path."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    torch.manual_seed(0)
    state = torchvision.models.resnet18().state_dict()  # 1000-class head, as the real file
    state["conv1.weight"].fill_(0.01)  # recognisable after loading
    folder = tmp_path / "torch" / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    torch.save(state, folder / "resnet18-f37072fd.pth")
    return state


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

    # The checkpoint alone evaluates and exports: the pretrained file is not needed any more.
    shutil.rmtree(tmp_path / "torch")
    assert "test/acc" in run_cli("test", "--ckpt_path", "last").trainer.callback_metrics
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
