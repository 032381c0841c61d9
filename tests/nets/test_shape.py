"""Any network from YAML: the data's classes and channels reach it where it takes them."""

import pytest
import torch
from conftest import write_image_folder
from torch import nn

from template.commands import main
from template.nets.shape import check_fits, network_arguments, takes


def test_the_data_reaches_only_the_arguments_a_network_takes():
    assert takes(torchvision_models().resnet18, "num_classes")  # through **kwargs, to ResNet
    assert not takes(torchvision_models().resnet18, "in_channels")
    assert not takes(torchvision_models().ResNet, "in_channels") and takes(torchvision_models().ResNet, "num_classes")
    assert network_arguments("torchvision.models.ResNet", {"layers": [1, 1, 1, 1], "num_classes": 1000}, 3, 1) == {
        "layers": [1, 1, 1, 1], "num_classes": 3}  # fmt: skip
    assert network_arguments("template.nets.ResNetSmall", {"in_channels": 3}, 10, 1) == {
        "in_channels": 1, "num_classes": 10}  # fmt: skip


def torchvision_models():
    import torchvision.models

    return torchvision.models


class TupleNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(x.flatten(1)), x.flatten(1)  # logits and features


def test_a_network_that_does_not_fit_the_data_is_named_before_training():
    with pytest.raises(ValueError, match=r"does not take the data's inputs .* \[1, 8, 8\]: .*3 channels"):
        check_fits(torchvision_models().resnet18(num_classes=10), (1, 8, 8), 10)
    with pytest.raises(ValueError, match=r"\[1, 8, 8\]: .*too small. .*8x8 pixels are pooled away.*data.image_size"):
        check_fits(nn.Sequential(nn.MaxPool2d(4), nn.MaxPool2d(4), nn.Flatten(), nn.LazyLinear(10)), (1, 8, 8), 10)
    with pytest.raises(ValueError, match=r"outputs of shape \[2, 64\] for 2 images, not \[2, 10\]"):
        check_fits(nn.Flatten(), (1, 8, 8), 10)
    with pytest.raises(ValueError, match=r"gives a tuple, not a tensor .*: its forward returns the logits alone"):
        check_fits(TupleNet(), (1, 8, 8), 10)  # told to give it num_classes, which it had
    with pytest.raises(ValueError, match=r"gives probabilities \(each image's outputs sum to 1\), not logits"):
        check_fits(nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.Softmax(dim=1)), (1, 8, 8), 10)
    check_fits(nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.LogSoftmax(dim=1)), (1, 8, 8), 10)  # log: as good
    net = nn.Sequential(nn.Flatten(), nn.BatchNorm1d(64), nn.Linear(64, 10))
    before = net[1].running_mean.clone()
    check_fits(net, (1, 8, 8), 10)
    assert torch.equal(net[1].running_mean, before) and net.training  # nothing changed by the check


class TrainReturnsNothing(nn.Sequential):
    def train(self, mode: bool = True) -> None:  # as many detection backbones write it: no `return self`
        super().train(mode)


def test_a_network_whose_train_returns_nothing_is_checked_as_any_other():
    net = TrainReturnsNothing(nn.Flatten(), nn.BatchNorm1d(64), nn.Linear(64, 10))
    check_fits(net, (1, 8, 8), 10)
    assert net.training


def test_torchvision_networks_on_grey_digits_fail_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--model.net", "torchvision.models.resnet18", "--trainer.max_epochs", "1"])
    assert exit_info.value.code == 1
    assert "does not take the data's inputs (channels, height, width) [1, 8, 8]" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "net",
    [
        ["--model.net", "torchvision.models.resnet18"],
        [
            "--model.net",
            "torchvision.models.ResNet",
            "--model.net.block",
            "torchvision.models.resnet.BasicBlock",
            "--model.net.layers",
            "[1, 1, 1, 1]",
        ],  # fmt: skip
    ],
    ids=["resnet18 (a function)", "ResNet (a class without in_channels)"],
)
def test_torchvision_networks_fit_test_and_export(run_cli, tmp_path, net):
    images = write_image_folder(tmp_path / "images", classes=("cat", "dog"), per_class=8, splits=("train", "test"))
    data = ["--config", "configs/imagefolder.yaml", "--data.root", str(images), "--data.image_size", "16",
            "--data.batch_size", "4", "--data.num_workers", "0", "--data.cache_dir", str(tmp_path / "cache")]  # fmt: skip
    monkey_repo_configs(tmp_path)
    trained = run_cli("fit", *data, *net, "--trainer.max_epochs", "1")
    assert trained.model.net.eval()(torch.zeros(2, 3, 16, 16)).shape == (2, 2)
    best = trained.trainer.checkpoint_callback.best_model_path
    tested = run_cli("test", "--ckpt_path", best, "--data.root", str(images))  # the same network, no in_channels
    assert "test/acc" in tested.trainer.callback_metrics
    main(["export", "--ckpt_path", best, "--format", "safetensors", "--output", str(tmp_path / "net.safetensors")])
    assert (tmp_path / "net.safetensors").is_file()


def monkey_repo_configs(tmp_path):
    """configs/ where the CLI runs (tmp_path), as in a clone."""
    import shutil
    from pathlib import Path

    shutil.copytree(Path(__file__).resolve().parents[2] / "configs", tmp_path / "configs")
