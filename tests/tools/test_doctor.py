"""`template doctor`: each classic bug, planted, fails the check named for it; the default passes."""

import csv
import re
import shutil
from functools import partial

import lightning as L
import pytest
import torch
from conftest import write_image_folder
from PIL import Image
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from template.commands import main
from template.data import DigitsDataModule, ImageFolderDataModule
from template.data.loaders import TensorImageDataset
from template.module import ClassificationModule
from template.nets import ResNetSmall
from template.tools import doctor


class PlainListNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = [nn.Linear(64, 32)]  # the bug: a plain list registers nothing
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden[0](x.flatten(1))))


class SoftmaxNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.flatten(1)).softmax(dim=1)  # the bug: cross_entropy gets probabilities


class UnusedBranchNet(SoftmaxNet):
    def __init__(self) -> None:
        super().__init__()
        self.auxiliary = nn.Linear(64, 10)  # never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.flatten(1))


class InPlaceNet(SoftmaxNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.sigmoid(self.head(x.flatten(1)))
        hidden += 1  # the bug: sigmoid's backward needs the output this overwrites
        return hidden


class FloatPixels(DigitsDataModule):
    def load_split(self, split):
        images, labels = super().load_split(split)
        return images.float() / 255, labels  # floats in [0, 1]: normalised as if 0-255, silently


class NaNPixels(DigitsDataModule):
    def make_dataset(self, split):  # a dataset of its own: past load_split's check
        images, labels = super().load_split(split)
        images = images.float()
        images[::50, :, 2, 3] = float("nan")  # a corrupt pixel in one image of every fifty
        return TensorImageDataset(images, labels)


class LabelEqualToNumClasses(DigitsDataModule):
    def make_dataset(self, split):  # a dataset of its own: past load_split's check
        images, labels = super().load_split(split)
        return TensorImageDataset(images, torch.where(torch.arange(len(labels)) == 7, self.num_classes, labels))


class DuplicatedTestImage(DigitsDataModule):
    def load_split(self, split):
        images, labels = super().load_split(split)
        if split == "train":
            test_images, test_labels = super().load_split("test")
            images, labels = torch.cat([images, test_images[:2]]), torch.cat([labels, test_labels[:2]])
        return images, labels


class MisalignedLabels(ClassificationModule):
    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return super()._loss(logits, labels.roll(1))  # the bug: each image is scored against another's label


class DetachedLoss(ClassificationModule):
    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return super()._loss(logits, labels).detach()  # the bug: no gradient flows back from the loss


def no_learning_rate(optimizer: torch.optim.Optimizer) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: 0.0)  # the bug: a schedule that multiplies the LR by 0


def checks(
    net: nn.Module | None = None,
    data: DigitsDataModule | None = None,
    lr: float = 3e-3,
    module: type[ClassificationModule] = ClassificationModule,
    **options,
) -> dict:
    L.seed_everything(0)
    data = data or DigitsDataModule()
    # num_classes as the CLI links it: the module's training_step measures accuracy over them.
    optimizer = partial(torch.optim.AdamW, lr=lr)
    model = module(net or ResNetSmall(10, 1), num_classes=data.num_classes, optimizer=optimizer, **options)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    found, _ = doctor.run_checks(model, data, trainer)
    return {check.name: check for check in found}


def failed(found: dict) -> list[str]:
    return [name for name, check in found.items() if check.status == "fail"]


def test_the_default_config_passes_every_check(capsys):
    main(["doctor", "--trainer.accelerator", "cpu"])  # no SystemExit: nothing failed
    out = capsys.readouterr().out
    assert "every check passed" in out and "fail" not in out
    for name in ("labels", "train/test overlap", "raw logits", "gradients", "overfit one batch", "throughput"):
        assert name in out
    assert "net.stages.0" in out and "[1, 10]" in out  # the summary: shapes down to the logits


@pytest.mark.parametrize(
    ("net", "data", "check", "says"),
    [
        (PlainListNet(), None, "registered parameters", "hidden"),
        (SoftmaxNet(), None, "raw logits", "softmax"),
        (UnusedBranchNet(), None, "gradients", "auxiliary.weight"),
        (InPlaceNet(), None, "backward", "inplace"),
        (None, NaNPixels(), "fit splits", "NaN or infinite pixels"),  # its statistics, before any batch
        (None, FloatPixels(), "fit splits", "gave images of torch.float32"),
        (None, LabelEqualToNumClasses(), "labels", "outside [0, 10), e.g. 10"),
        (None, DuplicatedTestImage(), "train/test overlap", "2 test image(s) also in train: test["),
    ],
    ids=[
        "plain-list",
        "softmax",
        "unused-branch",
        "in-place",
        "nan-pixels",
        "float-pixels",
        "label-range",
        "test-in-train",
    ],
)
def test_a_planted_bug_fails_its_check_and_names_it(net, data, check, says):
    found = checks(net, data)
    assert failed(found) == [check], {name: c.detail for name, c in found.items()}
    assert says in found[check].detail and found[check].fix


def test_a_model_that_cannot_learn_fails_the_overfit_check():
    found = checks(lr=0.0)
    assert failed(found) == ["overfit one batch"]
    assert "not memorised" in found["overfit one batch"].detail


@pytest.mark.parametrize(
    ("options", "check", "says"),
    [
        ({"module": MisalignedLabels}, "overfit one batch", "not memorised"),
        ({"module": DetachedLoss}, "training step", "does not require grad"),
        ({"lr_scheduler": no_learning_rate}, "overfit one batch", "not memorised"),
    ],
    ids=["misaligned-labels", "detached-loss", "zero-lr-schedule"],
)
def test_the_overfit_check_trains_with_the_modules_own_loss_and_optimizers(options, check, says):
    found = checks(**options)
    assert failed(found) == [check], {name: c.detail for name, c in found.items()}
    assert says in found[check].detail


def test_the_overfit_check_reports_the_modules_loss_and_leaves_the_model_unchanged():
    smoothing = 0.2
    L.seed_everything(0)
    model = ClassificationModule(ResNetSmall(10, 1), label_smoothing=smoothing)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    found, _ = doctor.run_checks(model, DigitsDataModule(), L.Trainer(accelerator="cpu", logger=False))
    overfit = {check.name: check for check in found}["overfit one batch"]
    # The smoothed loss never goes below the entropy of its target: 1 - smoothing + smoothing / 10
    # on the true class, smoothing / 10 on each other.
    target = torch.full((10,), smoothing / 10)
    target[0] += 1 - smoothing
    floor = -(target * target.log()).sum().item()
    final = float(re.search(r"-> (\S+) in", overfit.detail).group(1))
    assert overfit.status == "pass" and floor - 1e-3 <= final < 2 * floor, overfit.detail
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


def test_any_failed_check_exits_non_zero_and_names_it(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--trainer.accelerator", "cpu", "--model.optimizer.init_args.lr", "0"])
    assert exit_info.value.code == 1
    assert "failed: learnability/overfit one batch" in capsys.readouterr().out


def test_a_global_batch_that_does_not_divide_fails_before_loading_data():
    model = ClassificationModule(ResNetSmall(10, 1))
    trainer = L.Trainer(accelerator="cpu", devices=3, strategy="ddp_spawn", logger=False)  # 3 processes, never started
    for given, option in ((64, "global_batch_size"), ("batch_size", "batch_size")):  # the DDP configs' share batch_size
        found, _ = doctor.run_checks(model, DigitsDataModule(global_batch_size=given), trainer)
        assert found[-1].name == "batch size" and found[-1].status == "fail" and "66" in found[-1].detail
        assert found[-1].fix == f"change data.{option}"


@pytest.mark.parametrize(
    ("visible", "driver", "accelerator", "status", "says"),
    [
        (None, None, "auto", "pass", "has no NVIDIA GPU"),
        ("", None, "auto", "warn", "CUDA_VISIBLE_DEVICES hides every GPU"),
        (None, "/usr/bin/nvidia-smi", "auto", "warn", "older than this CUDA needs"),
        (None, "/usr/bin/nvidia-smi", "gpu", "fail", "older than this CUDA needs"),
    ],
)
def test_a_cuda_build_without_a_usable_gpu_is_explained(monkeypatch, visible, driver, accelerator, status, says):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(shutil, "which", lambda name: driver)
    monkeypatch.setattr(doctor.Path, "exists", lambda self: False)  # no /dev/nvidia0
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    cuda = doctor.check_environment(accelerator)[-1]
    assert (cuda.name, cuda.status) == ("cuda", status) and "CUDA 12.8" in cuda.detail and says in cuda.detail


def test_lr_find_saves_the_curve_in_the_run_directory_and_prints_a_suggestion(run_cli, capsys):
    main(["lr-find", "--num_training", "40", *run_cli.tiny_args])
    run_dir = run_cli.runs_dir / "digits" / "version_0"
    with Image.open(run_dir / "lr_find.png") as png:
        assert png.format == "PNG" and png.width > 100
    with open(run_dir / "lr_find.csv") as file:
        lrs = [float(row["lr"]) for row in csv.DictReader(file)]
    assert len(lrs) == 40 and lrs == sorted(lrs) and 1e-6 <= lrs[0] < lrs[-1] <= 1.0  # an exponential sweep
    suggested = float(re.search(r"suggested lr: (\S+)", capsys.readouterr().out).group(1))
    assert any(abs(suggested - lr) <= 1e-3 * lr for lr in lrs)  # one of the LRs tried


def test_lr_find_refuses_an_empty_range(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["lr-find", "--min_lr", "1", "--max_lr", "0.1"])
    assert exit_info.value.code == 2 and "need 0 < min_lr < max_lr" in capsys.readouterr().err


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "streamed"])
def test_folder_data_is_checked_on_either_path_and_a_copied_test_file_is_caught(image_folder, tmp_path, cache):
    def folder_data() -> ImageFolderDataModule:
        return ImageFolderDataModule(
            str(image_folder), image_size=16, batch_size=8, num_workers=0, cache=cache, cache_dir=str(tmp_path)
        )

    clean = checks(ResNetSmall(3, 3), folder_data())
    assert failed(clean) == [], {name: c.detail for name, c in clean.items() if c.status == "fail"}
    for copy in range(3):  # some land in train whatever the seeded train/val split does
        shutil.copy(image_folder / "test" / "dog" / "003.jpg", image_folder / "train" / "dog" / f"copy{copy}.jpg")
    found = checks(ResNetSmall(3, 3), folder_data())
    overlap = found["train/test overlap"]
    assert "train/test overlap" in failed(found) and "test image(s) also in train" in overlap.detail
    # Named by their files: the test image, and the copy of it in train.
    assert f"{image_folder / 'test' / 'dog' / '003.jpg'} = {image_folder / 'train' / 'dog' / 'copy'}" in overlap.detail


def test_a_folder_without_test_images_is_a_warning_and_unreadable_files_a_named_failure(image_folder, tmp_path):
    shutil.rmtree(image_folder / "test")
    settings = {"image_size": 16, "batch_size": 8, "num_workers": 0, "cache_dir": str(tmp_path)}
    data = ImageFolderDataModule(str(image_folder), test_fraction=0, **settings)
    found = checks(ResNetSmall(3, 3), data)
    assert found["test splits"].status == "warn" and "no test/ folder" in found["test splits"].detail
    assert failed(found) == [] and found["train/val overlap"].status == "pass"
    (image_folder / "train" / "dog" / "broken.jpg").write_bytes(b"not an image")
    data = ImageFolderDataModule(str(image_folder), test_fraction=0, **settings)
    found = checks(ResNetSmall(3, 3), data)
    assert failed(found) == ["fit splits"] and "broken.jpg" in found["fit splits"].detail


def test_classes_missing_from_a_split_are_named_as_the_data_names_them(tmp_path):
    """The class-balance check named classes by index ([2]), where the folders name them (owl)."""
    root = write_image_folder(tmp_path / "images", per_class=20, splits=("train",))
    write_image_folder(root, classes=("cat", "dog"), per_class=2, splits=("test",))
    settings = {"image_size": 16, "batch_size": 8, "num_workers": 0, "cache_dir": str(tmp_path)}
    found = checks(ResNetSmall(3, 3), ImageFolderDataModule(str(root), **settings))["class balance"]
    assert found.status == "warn" and "test ['owl']" in found.detail, found.detail


def test_what_a_check_saw_is_shown_as_text_never_as_markup_or_escapes(capsys, monkeypatch):
    """A check quotes the data's file names: one named with an escape sequence and rich markup ("no overlap" in green
    over the real line) is shown as its characters."""
    name = "val/\x1b]0;PWNED\x07\x1b[2K\r\x1b[32mno overlap [reverse]click\x1b[0m.png"
    planted = doctor.Check("data", "train/val overlap", "fail", f"{name} = train/a.png", "remove [bold]it[/bold]")
    monkeypatch.setattr(doctor, "run_checks", lambda *args: ([planted], None))
    monkeypatch.setenv("COLUMNS", "400")  # one line a row
    with pytest.raises(SystemExit):
        main(["doctor", "--trainer.accelerator", "cpu"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b]0;PWNED" in out
    assert "no overlap [reverse]click" in out and "remove [bold]it[/bold]" in out


def test_a_path_a_check_saw_is_shown_whole_in_a_narrow_terminal(capsys, monkeypatch):
    """In 80 columns (a pipe, CI) the paths of clashing files were cut to "/tmp/newuser3/data/i…"."""
    clash = "/data/my_images/test/cat/cat_0001.png = /data/my_images/train/bird/bird_0004.jpg"
    planted = doctor.Check("data", "train/test overlap", "fail", clash, "remove the test copies")
    monkeypatch.setattr(doctor, "run_checks", lambda *args: ([planted], None))
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["doctor", "--trainer.accelerator", "cpu"])
    cells = [line.split("│") for line in capsys.readouterr().out.splitlines() if line.count("│") == 5]
    assert "".join(cell[3].strip() for cell in cells).replace(" ", "") == clash.replace(" ", "")


def test_the_batch_check_counts_the_batches_it_saw(image_folder, tmp_path):
    """It said "3 batches of 8" (the count asked, the last batch's size) of a loader of 2 batches of 16 and 8."""
    data = ImageFolderDataModule(str(image_folder), image_size=8, batch_size=16, cache_dir=str(tmp_path / "cache"))
    data.setup("fit")
    sizes = [len(labels) for _, labels in data.train_dataloader()]
    assert len(sizes) < 3
    check, _ = doctor.check_batches(data)
    assert check.detail.startswith(f"{len(sizes)} batch(es) of {', '.join(map(str, sorted(set(sizes))))} images")
