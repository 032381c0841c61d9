"""A timm network from YAML: weights from a test-made Hugging Face cache or a file, the data following the
weights' preprocessing, layer-wise LR decay, and every command on it."""

import copy
import functools
import json
import os
import shutil
import sys
from hashlib import sha256
from pathlib import Path

import onnx
import pytest
import torch
from conftest import write_image_folder
from safetensors.torch import save_file

from template.checkpoints import CheckpointError, read_weights
from template.cli import cli
from template.commands import main
from template.data import ImageFolderDataModule
from template.data.cache import decode
from template.module import ClassificationModule
from template.nets import ResNetSmall, timm_net
from template.plugins import SyncBatchNorm

timm = pytest.importorskip("timm")  # in the dev extra: always here in CI
REPO = Path(__file__).resolve().parents[1]
NAME = "mobilenetv3_small_050.lamb_in1k"  # a small timm network with pretrained weights
CONFIGS = ["--config", "configs/imagefolder.yaml", "--config", "configs/finetune_timm.yaml", "--model.net.name", NAME]


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> dict[str, torch.Tensor]:
    """``NAME``'s weights (randomly initialised) where the Hugging Face hub keeps them, offline."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    state = timm.create_model(NAME).state_dict()
    repo = tmp_path / "hf" / f"models--{timm.get_pretrained_cfg(NAME).hf_hub_id.replace('/', '--')}"
    (repo / "snapshots" / "0123abcd").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    (repo / "blobs").mkdir()
    save_file(state, repo / "blobs" / "written")  # as the hub keeps a large file: a blob named by its SHA-256
    blob = (repo / "blobs" / "written").rename(
        repo / "blobs" / sha256((repo / "blobs" / "written").read_bytes()).hexdigest()
    )
    (repo / "snapshots" / "0123abcd" / "model.safetensors").symlink_to(f"../../blobs/{blob.name}")
    return state


@pytest.fixture
def clone(tmp_path, monkeypatch) -> Path:
    """The README's commands run in a clone: its configs, and a folder of images."""
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    return write_image_folder(tmp_path / "images", classes=("cat", "dog"), per_class=8, splits=("train", "test"))


def built(images: Path, *args: str):
    return cli([*CONFIGS, "--data.root", str(images), "--data.num_workers", "0", *args], run=False)


def test_pretrained_weights_load_from_the_hf_cache_and_a_file_and_equal_them(hf_cache, clone, tmp_path, capsys):
    net = built(clone, "--data.image_size", "32").model.net
    loaded = net.state_dict()
    assert net.classifier.out_features == 2  # the data's two classes: timm's new head
    kept = [key for key in hf_cache if not key.startswith("classifier.")]
    assert len(kept) == len(hf_cache) - 2 and all(torch.equal(loaded[key], hf_cache[key]) for key in kept)
    assert "pretrained weights from " + str(tmp_path / "hf") in capsys.readouterr().out

    other = {key: value + 1 if value.is_floating_point() else value for key, value in hf_cache.items()}
    save_file(other, tmp_path / "mine.safetensors")
    net = built(clone, "--data.image_size", "32", "--weights_file", str(tmp_path / "mine.safetensors")).model.net
    assert all(torch.equal(net.state_dict()[key], other[key]) for key in kept)


def test_weights_with_a_classifier_for_the_data_keep_it_and_an_evaluation_scores_no_new_one(
    hf_cache, clone, tmp_path, capsys
):
    """timm dropped the classifier of any file whose class count was not its weights' (1000): a fine-tuned state_dict
    file was tested with a new, random classifier, exit 0. Nor is a new one (ImageNet weights, two classes) scored."""
    tuned = timm.create_model(NAME, num_classes=2).state_dict()
    save_file(tuned, tmp_path / "tuned.safetensors")
    small = ["--data.root", str(clone), "--data.image_size", "32", "--data.num_workers", "0"]
    net = built(clone, "--data.image_size", "32", "--weights_file", str(tmp_path / "tuned.safetensors")).model.net
    assert torch.equal(net.classifier.weight, tuned["classifier.weight"])
    main(["test", *CONFIGS, *small, "--weights_file", str(tmp_path / "tuned.safetensors")])
    assert "test/acc" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["test", *CONFIGS, *small])  # the cache's weights, for 1000 classes
    assert "test would score a new, untrained classifier (timm's weights hold a classifier for 1000 classes)" in (
        capsys.readouterr().err
    )


def test_missing_weights_are_one_line_naming_the_model_tag_and_where_it_looked(clone, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(SystemExit):
        main(["fit", *CONFIGS, "--data.root", str(clone)])
    error = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(error) == 1
    for part in ("mobilenetv3_small_050 (tag lamb_in1k)", str(tmp_path / "empty"), "--weights_file", "downloaded"):
        assert part in error[0]


def test_the_data_follows_the_weights_preprocessing_unless_given_with_a_note(hf_cache, clone, caplog):
    config = timm.get_pretrained_cfg(NAME)
    data = built(clone).datamodule
    assert data.image_size == (224, 224) and data.resize_size == (256, 256)  # 224 / crop_pct 0.875
    assert data.given_stats == (list(config.mean), list(config.std)) and data.interpolation == "bicubic"
    assert "note:" not in caplog.text

    data = built(clone, "--data.image_size", "32", "--data.mean", "[0.5,0.5,0.5]", "--data.std", "[0.2,0.2,0.2]")
    assert data.datamodule.image_size == (32, 32) and data.datamodule.resize_size == (36, 36)  # 32 / 0.875
    assert data.datamodule.given_stats == ([0.5] * 3, [0.2] * 3)
    assert "data.image_size=32 (trained: 224)" in caplog.text and "data.mean=[0.5, 0.5, 0.5]" in caplog.text


@pytest.mark.slow
def test_a_timm_network_fits_tests_predicts_and_exports_from_yaml(hf_cache, clone, tmp_path):
    args = [*CONFIGS, "--data.root", str(clone), "--data.image_size", "32", "--data.batch_size", "4",
            "--data.num_workers", "0", "--trainer.max_epochs", "2"]  # fmt: skip
    main(["fit", *args])
    checkpoint = torch.load(next(Path("runs").glob("**/last.ckpt")), weights_only=True, map_location="cpu")
    record = next(state["preprocessing"] for state in checkpoint.values() if isinstance(state, dict)
                  and "preprocessing" in state)  # fmt: skip
    config = timm.get_pretrained_cfg(NAME)
    assert record["mean"] == pytest.approx(config.mean) and record["resize_size"] == [36, 36]
    assert record["interpolation"] == config.interpolation == "bicubic"

    # The checkpoint and the images alone: no weights file, no config.
    shutil.rmtree(tmp_path / "hf")
    main(["test", "--ckpt_path", "last", "--data.root", str(clone)])
    main(["predict", "--ckpt_path", "last", "--data.predict_path", str(clone / "test")])
    assert list(Path("runs").glob("**/predictions.csv"))
    main(["export", "--ckpt_path", "last", "--format", "onnx", "--output", "net.onnx"])
    carried = {prop.key: prop.value for prop in onnx.load("net.onnx").metadata_props}
    assert json.loads(carried["preprocessing"]) == record


def test_layer_decay_gives_each_layer_the_learning_rate_it_promises():
    net = timm_net("mobilenetv3_small_050", num_classes=3)
    optimizer = functools.partial(torch.optim.AdamW, lr=0.1, weight_decay=0.05)
    module = ClassificationModule(net, num_classes=3, layer_decay=0.5, lr_scheduler=None, optimizer=optimizer)
    groups = module.configure_optimizers()["optimizer"].param_groups
    for group in groups:  # depth<k>: k layers from the head
        assert group["lr"] == pytest.approx(0.1 * 0.5 ** int(group["name"][5:].split("_")[0]))
        assert group["weight_decay"] == (0.0 if group["name"].endswith("no_decay") else 0.05)
    head = {id(parameter) for parameter in net.classifier.parameters()}
    assert all(group["lr"] == pytest.approx(0.1) for group in groups if head & {id(p) for p in group["params"]})
    assert len({group["lr"] for group in groups}) > 2  # the stem, the blocks and the head apart
    module.temperature = torch.nn.Parameter(torch.ones(1))  # a subclass's own, outside the network: full rate
    own = [g for g in module.configure_optimizers()["optimizer"].param_groups if module.temperature is g["params"][-1]]
    assert [(group["lr"], group["weight_decay"]) for group in own] == [(pytest.approx(0.1), 0.0)]
    with pytest.raises(ValueError, match="set model.layer_decay to null"):  # no depths to decay over
        ClassificationModule(ResNetSmall(num_classes=3), num_classes=3, layer_decay=0.5).configure_optimizers()


def test_timm_names_options_and_a_missing_install_are_refused_with_what_to_do(monkeypatch):
    with pytest.raises(ValueError, match="not a timm model"):
        timm_net("hf-hub:someone/anything")  # an address timm would fetch, not a name of its registry
    with pytest.raises(ValueError, match="only from pretrained and pretrained_file"):
        timm_net("resnet18", options={"checkpoint_path": "/elsewhere/file.pth"})
    monkeypatch.setitem(sys.modules, "timm", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[timm\]'"):
        timm_net("resnet18")


def test_the_resize_interpolation_is_an_option_recorded_and_held_to(tmp_path):
    images = write_image_folder(tmp_path / "images", classes=("cat", "dog"), per_class=12, size=(40, 52))
    file = next((images / "train" / "cat").glob("*.png"))
    bilinear, bicubic = (decode(file, (16, 16), "RGB", interpolation) for interpolation in ("bilinear", "bicubic"))
    assert bilinear.shape == bicubic.shape == (3, 16, 16) and (bilinear != bicubic).any()

    data = ImageFolderDataModule(root=str(images), image_size=16, interpolation="bicubic", num_workers=0)
    data.setup("fit")
    record = data.preprocessing()
    assert record["interpolation"] == "bicubic"
    plain = ImageFolderDataModule(root=str(images), image_size=16, num_workers=0)
    with pytest.raises(ValueError, match="set data.interpolation to bicubic"):
        plain.use_preprocessing(record)


def test_weights_of_another_network_holes_or_nan_are_refused_before_training(hf_cache, clone, tmp_path, capsys):
    """timm loads leniently when the head is new: the template checks that everything else is there first."""

    def refused(state, name):
        save_file(state, tmp_path / name)
        with pytest.raises(SystemExit):
            main(["fit", *CONFIGS, "--data.root", str(clone), "--weights_file", str(tmp_path / name)])
        return capsys.readouterr().err

    prefixed = {f"model.{key}": value for key, value in hf_cache.items()}  # every key another network's
    assert "is not the weights of timm mobilenetv3_small_050" in refused(prefixed, "prefixed.safetensors")
    nan = {**hf_cache, "conv_stem.weight": torch.full_like(hf_cache["conv_stem.weight"], float("nan"))}
    assert "NaN or infinite values" in refused(nan, "nan.safetensors")

    header = json.dumps({"huge": {"dtype": "F32", "shape": [1 << 30], "data_offsets": [0, 4 << 30]}}).encode()
    with open(tmp_path / "holes.safetensors", "wb") as file:  # 4 GiB declared, a few bytes on disk
        file.write(len(header).to_bytes(8, "little") + header)
        file.truncate(8 + len(header) + (4 << 30))
    with pytest.raises(SystemExit):
        main(["fit", *CONFIGS, "--data.root", str(clone), "--weights_file", str(tmp_path / "holes.safetensors")])
    assert "is a file of holes (sparse)" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="more than the network could take"):  # its tensors, over 1 MiB allowed
        read_weights(tmp_path / "nan.safetensors", 1 << 20)


def test_a_hub_cache_blob_that_is_not_what_its_name_says_is_refused(hf_cache, clone, tmp_path, capsys):
    (blob,) = (tmp_path / "hf").glob("*/blobs/*")
    save_file({key: torch.zeros_like(value) for key, value in hf_cache.items()}, blob)  # other weights, same name
    with pytest.raises(SystemExit):
        main(["fit", *CONFIGS, "--data.root", str(clone)])
    assert f"its contents do not match the SHA-256 its blob is named by ({blob.name[:12]}" in capsys.readouterr().err


def test_a_hub_cache_ref_that_is_no_commit_name_is_refused_unread(hf_cache, clone, tmp_path, capsys):
    """huggingface_hub reads refs/main whole: a file of holes there (0 bytes on disk) took gigabytes of memory."""
    (ref,) = (tmp_path / "hf").glob("*/refs/main")
    os.truncate(ref, 1 << 30)
    with pytest.raises(SystemExit):
        main(["fit", *CONFIGS, "--data.root", str(clone)])
    assert f"refusing {ref}: a Hugging Face ref names a commit in 40 characters" in capsys.readouterr().err


def test_grey_images_take_the_weights_statistics_averaged_over_the_colours(hf_cache, clone):
    config = timm.get_pretrained_cfg(NAME)
    built_ = built(clone, "--data.channels", "grayscale", "--data.image_size", "32")
    assert built_.datamodule.given_stats == ([sum(config.mean) / 3], [sum(config.std) / 3])
    assert built_.model.net.conv_stem.in_channels == 1  # timm summed the pretrained filters over the colours


def test_sync_batchnorm_keeps_timms_norm_and_activation_layers_whole():
    """torch's conversion keeps a BatchNormAct2d's statistics and silently drops its activation."""
    torch.manual_seed(0)
    net = timm_net("mobilenetv3_small_050", num_classes=3).eval()
    images = torch.randn(2, 3, 32, 32)
    converted = SyncBatchNorm().apply(copy.deepcopy(net)).eval()
    assert any(type(module).__name__ == "SyncBatchNormAct" for module in converted.modules())
    torch.testing.assert_close(converted(images), net(images))
