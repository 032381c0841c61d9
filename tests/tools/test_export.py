import csv
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from conftest import tiny_args, write_image_folder
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from template.checkpoints import load_checkpoint, load_weights
from template.commands import main
from template.data.preprocessing import recorded_preprocessing
from template.evaluation import multi_crop_logits
from template.module import ClassificationModule
from template.nets import ResNetSmall
from template.tools.export import FORMATS, check_memory, export

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
# The README's prediction from an exported ONNX file alone (it reads model.onnx and photo.jpg).
PREDICT_FROM_ONNX = next(
    block for block in re.findall(r"```python\n(.*?)```", README, re.S) if "onnxruntime.InferenceSession" in block
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from template.cli import cli

    runs = tmp_path_factory.mktemp("export") / "runs"
    cli([
        "fit", "--trainer.logger.init_args.save_dir", str(runs), "--trainer.callbacks", "[]",
        "--trainer.enable_progress_bar", "false", "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "2",
    ])  # fmt: skip
    return next(runs.glob("digits/version_0/checkpoints/last.ckpt"))


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_an_output_that_is_a_folder_or_named_as_another_format_is_named_so(checkpoint, tmp_path):
    with pytest.raises(ValueError, match=r"--output .* is a folder: give the file to write, e.g. .*net.safetensors"):
        export(checkpoint, "safetensors", tmp_path)
    with pytest.raises(ValueError, match=r"model.onnx is named as onnx, and this export writes torchscript: name it"):
        export(checkpoint, "torchscript", tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_export_passes_its_parity_check(checkpoint, tmp_path, fmt, capsys, umask_022):
    path = export(checkpoint, fmt, tmp_path / f"net{FORMATS[fmt]}")
    assert path.is_file()
    printed = capsys.readouterr().out
    assert "parity: max |exported - original| =" in printed and "on a batch of 3" in printed
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)  # the umask's, like every other output


@pytest.mark.parametrize("alias, name", [("best", "best-epoch000.ckpt"), ("last", "last.ckpt")])
def test_export_takes_best_and_last_of_the_latest_run(checkpoint, tmp_path, alias, name, capsys):
    runs = checkpoint.parents[3]
    output = tmp_path / "net.safetensors"
    main(["export", "--ckpt_path", alias, "--runs_dir", str(runs), "--format", "safetensors", "--output", str(output)])
    assert f"--ckpt_path {alias} -> {checkpoint.parent / name}" in capsys.readouterr().out
    assert output.is_file()


def test_safetensors_file_loads_into_a_fresh_network(checkpoint, tmp_path):
    path = export(checkpoint, "safetensors", tmp_path / "net.safetensors")
    original, fresh = ResNetSmall(10, 1).eval(), ResNetSmall(10, 1).eval()
    load_weights(original, checkpoint)
    fresh.load_state_dict(load_file(str(path)))  # no pickle involved
    images = torch.randn(3, 1, 8, 8)
    assert torch.equal(fresh(images), original(images))
    with safe_open(str(path), "pt") as file:
        metadata = file.metadata()
    assert json.loads(metadata["class_names"]) == [str(digit) for digit in range(10)]
    assert json.loads(metadata["net"])["class_path"] == "template.nets.ResNetSmall"
    assert json.loads(metadata["preprocessing"]) == recorded_preprocessing(load_checkpoint(checkpoint))


def test_an_export_evaluates_as_predict_does_with_the_checkpoints_test_time_augmentation(tmp_path):
    """flip_tta and tta_translate: test and predict average views of each image; the bare network's export
    disagreed with them on a third of the digits, while its parity check compared it with the bare network."""
    from template.cli import cli

    quick = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1"]
    cli(["fit", *tiny_args(tmp_path / "runs"), *quick, "--model.flip_tta", "true", "--model.tta_translate", "1"])
    checkpoint = next((tmp_path / "runs").glob("digits/version_0/checkpoints/last.ckpt"))
    module = ClassificationModule.load_from_checkpoint(checkpoint).eval()
    images = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, bare = multi_crop_logits(module, images, True, 1), module(images)
        for fmt in ("torchscript", "onnx"):
            path = export(checkpoint, fmt, tmp_path / f"net{FORMATS[fmt]}")
            if fmt == "torchscript":
                carried = {"tta.json": "", "preprocessing.json": ""}
                logits = torch.jit.load(str(path), _extra_files=carried)(images)
                keys = {name.removesuffix(".json") for name, value in carried.items() if value}
            else:
                session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                logits = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: images.numpy()})[0])
                keys = set(session.get_modelmeta().custom_metadata_map)
            assert torch.allclose(logits, expected, atol=1e-4) and not torch.allclose(logits, bare, atol=1e-4), fmt
            assert "preprocessing" in keys and "tta" not in keys  # in the graph: no reader applies it twice
    with safe_open(str(export(checkpoint, "safetensors", tmp_path / "net.safetensors")), "pt") as file:
        assert json.loads(file.metadata()["tta"]) == {"flip": True, "translate": 1}
    # --no_tta: the bare network, one forward pass an image, as a deployment that wants the speed asks.
    bare_onnx = ["--format", "onnx", "--output", str(tmp_path / "bare.onnx"), "--no_tta"]
    main(["export", "--ckpt_path", str(checkpoint), *bare_onnx])
    session = onnxruntime.InferenceSession(str(tmp_path / "bare.onnx"), providers=["CPUExecutionProvider"])
    logits = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: images.numpy()})[0])
    assert torch.allclose(logits, bare, atol=1e-4)


def test_an_input_shape_too_large_to_export_here_is_refused_before_any_batch(checkpoint, tmp_path, monkeypatch):
    """A file's input_shape of 4096x4096 made the parity batch's first activation take 10.7 GB."""
    edited = torch.load(checkpoint, weights_only=True)
    edited["hyper_parameters"]["input_shape"] = [1, 1024, 1024]
    edited["DigitsDataModule"]["preprocessing"].update(input_shape=[1, 1024, 1024], resize_size=[1024, 1024])
    torch.save(edited, tmp_path / "large.ckpt")
    monkeypatch.setattr(os, "sysconf", {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1 << 18}.get)  # a 1 GiB machine
    with pytest.raises(ValueError, match=r"input_shape \[1, 1024, 1024\] takes 1.1 GiB of activations to export"):
        export(tmp_path / "large.ckpt", "safetensors", tmp_path / "large.safetensors")
    assert not (tmp_path / "large.safetensors").exists()


class ReadsValues(torch.nn.Module):
    """A network that reads a tensor's value as it is built: no meta-device build of it."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.scale = float(torch.linspace(0, 1, 3)[1])
        self.head = torch.nn.Linear(in_channels, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(images.mean((2, 3))) * self.scale


def test_the_memory_check_passes_over_a_network_it_cannot_build_on_the_meta_device(tmp_path):
    """Built outside its try, it failed the export: "Cannot copy out of meta tensor; no data!"."""
    check_memory({"class_path": f"{__name__}.ReadsValues", "init_args": {}}, [1, 8, 8], tmp_path / "own.ckpt")


def test_a_parity_failure_fails_the_export_and_leaves_no_file(checkpoint, tmp_path):
    with pytest.raises(RuntimeError, match="differs from the original by"):
        export(checkpoint, "torchscript", tmp_path / "net.pt", tolerance=-1.0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_link_planted_at_the_output_is_replaced_not_written_through(checkpoint, tmp_path, fmt):
    # A stranger's run directory with a link where the export goes (its default place: beside the checkpoint).
    outside = tmp_path / "outside"
    outside.mkdir()
    victim, temporary_victim = outside / "victim", outside / "temporary-victim"
    victim.write_text("keep"), temporary_victim.write_text("keep")
    path = tmp_path / f"run{FORMATS[fmt]}"
    path.symlink_to(victim)
    path.with_name(f".{path.name}.{os.getpid()}.tmp").symlink_to(temporary_victim)  # and at its temporary's name
    export(checkpoint, fmt, path)
    assert victim.read_text() == "keep" and temporary_victim.read_text() == "keep"
    assert path.is_file() and not path.is_symlink()


def test_export_refuses_doctored_checkpoints_and_runs_none_of_their_code(checkpoint, tmp_path, capsys):
    marker = tmp_path / "code-ran"
    payload = type("Payload", (), {"__reduce__": lambda self: (__import__("os").system, (f"touch {marker}",))})
    pickled = tmp_path / "pickled.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"x": payload()}}, pickled)
    # Only tensors and plain values, but naming a class that is no network: it is never built.
    sneaky = tmp_path / "sneaky.ckpt"
    state = torch.load(checkpoint, weights_only=True)
    state["hyper_parameters"]["net"] = {
        "class_path": "subprocess.Popen",
        "init_args": {"args": f"touch {marker}", "shell": True},
    }
    torch.save(state, sneaky)
    for doctored, reason in ((pickled, "refusing to load"), (sneaky, "subprocess.Popen")):
        with pytest.raises(SystemExit) as exit_info:
            main(["export", "--ckpt_path", str(doctored), "--format", "safetensors"])
        assert exit_info.value.code == 1
        assert reason in capsys.readouterr().err
    assert not marker.exists()


def test_a_checkpoint_without_a_preprocessing_record_exports_with_a_warning(checkpoint, tmp_path):
    state = torch.load(checkpoint, weights_only=True)  # as written before checkpoints recorded it
    for value in state.values():
        if isinstance(value, dict):
            value.pop("preprocessing", None)
    older = tmp_path / "older.ckpt"
    torch.save(state, older)
    with pytest.warns(UserWarning, match="records no preprocessing .* so net.pt carries none"):
        path = export(older, "torchscript", tmp_path / "net.pt")
    carried = {"class_names.json": "", "preprocessing.json": ""}
    torch.jit.load(str(path), _extra_files=carried)  # fills in the files it holds, leaves the others
    assert json.loads(carried["class_names.json"]) == [str(digit) for digit in range(10)]
    assert not carried["preprocessing.json"]


def test_a_second_preprocessing_record_is_refused_by_export_and_evaluation_alike(checkpoint, tmp_path, capsys):
    """Export read the first record, evaluation its DataModule's: planted ahead, another normalisation was exported."""
    state = torch.load(checkpoint, weights_only=True)
    other = {**recorded_preprocessing(state), "mean": [0.0], "std": [1.0]}
    planted = tmp_path / "planted.ckpt"
    torch.save({"Evil": {"preprocessing": other}, **state}, planted)
    runs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "runs")]
    for command in (["export", "--format", "safetensors"], ["validate", *runs]):
        with pytest.raises(SystemExit, match="1"):
            main([*command, "--ckpt_path", str(planted)])
        assert f"{planted}: preprocessing records under keys 'Evil', 'DigitsDataModule'" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.safetensors")) and not (tmp_path / "runs").exists()


def write_new_images(folder: Path) -> Path:
    """Images unlike the training ones: other sizes and aspect ratios, grey, RGBA, a sideways EXIF photo."""
    rng = np.random.default_rng(1)
    folder.mkdir()
    for number, (size, mode) in enumerate([((40, 30), "RGB"), ((25, 50), "L"), ((64, 64), "RGBA"), ((36, 18), "RGB")]):
        pixels = rng.integers(0, 256, (size[1], size[0], len(mode)), dtype=np.uint8)
        image = Image.fromarray(pixels[..., 0] if mode == "L" else pixels)  # Pillow infers the mode
        if number == 3:  # stored sideways, with the EXIF Orientation tag (6: turn 90° clockwise) a phone writes
            exif = Image.Exif()
            exif[0x0112] = 6
            image.save(folder / f"{number}.jpg", exif=exif)
        else:
            image.save(folder / f"{number}.png")
    return folder


@pytest.mark.slow
def test_an_onnx_file_alone_predicts_like_the_checkpoint_with_the_readme_code(run_cli, tmp_path):
    images = write_image_folder(tmp_path / "images")
    trained = run_cli("fit", "--config", str(REPO / "configs" / "imagefolder.yaml"), "--data.root", str(images),
                      "--data.image_size", "16", "--data.batch_size", "8", "--data.num_workers", "0",
                      "--data.cache_dir", str(tmp_path / "cache"), "--trainer.max_epochs", "1")  # fmt: skip
    best = trained.trainer.checkpoint_callback.best_model_path
    shutil.rmtree(images)  # from here on, only the checkpoint, its exports and new images
    for fmt, name in (("onnx", "model.onnx"), ("torchscript", "model.pt"), ("safetensors", "model.safetensors")):
        export(best, fmt, tmp_path / name)

    new_images = write_new_images(tmp_path / "new")
    run_cli("predict", "--ckpt_path", best, "--data.predict_path", str(new_images))
    rows = list(csv.DictReader(next(run_cli.runs_dir.glob("*/version_*/predictions.csv")).open()))
    assert len(rows) == 4
    for row in rows:
        shutil.copy(row["sample"], tmp_path / "photo.jpg")  # the names the snippet reads, in the working directory
        namespace = {}
        exec(PREDICT_FROM_ONNX, namespace)
        assert namespace["class_names"][namespace["probabilities"].argmax()] == row["class_name"]
        assert float(namespace["probabilities"].max()) == pytest.approx(float(row["probability"]), abs=1e-4)
        assert float(np.sort(namespace["probabilities"])[-2]) == pytest.approx(float(row["top2_probability"]), abs=1e-4)

    # The other two files carry the same record and class names.
    record = recorded_preprocessing(load_checkpoint(best))
    assert record["resize"] == "cover_center_crop" and record["input_shape"] == [3, 16, 16]
    onnx_metadata = onnxruntime.InferenceSession(str(tmp_path / "model.onnx")).get_modelmeta().custom_metadata_map
    extra_files = {"class_names.json": "", "preprocessing.json": ""}
    torch.jit.load(str(tmp_path / "model.pt"), _extra_files=extra_files)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as file:
        safetensors_metadata = file.metadata()
    for carried in (onnx_metadata, {name.removesuffix(".json"): value for name, value in extra_files.items()},
                    safetensors_metadata):  # fmt: skip
        assert json.loads(carried["preprocessing"]) == record
        assert json.loads(carried["class_names"]) == ["cat", "dog", "owl"]
