"""Photos larger than the training size: stored once at resize_size, cropped on the device."""

import csv
import json
import os
import re
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import on_device
from PIL import Image, ImageDraw, ImageOps

import template.data.cache as cache_module
from template.data import ImageFolderDataModule
from template.data.augment import normalize, random_hflip, random_resized_crop
from template.data.cache import CacheTooLarge
from template.data.images import open_image
from template.data.loaders import FileDataset, TensorImageDataset

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "imagefolder.yaml"
PHOTOS = {"image_size": 20, "crop_scale": (0.25, 1.0), "crop_padding": 0, "hflip": True}  # resize_size: 23


def write_photos(root: Path, per_class: int = 20, classes=("beach", "forest", "snow")) -> Path:
    """JPEG photos of 60x45 (and some of 45x60): a gradient of the class's colour, shapes and noise."""
    rng = np.random.default_rng(0)
    colours = [(220, 190, 120), (40, 140, 60), (230, 235, 245)]
    for index, name in enumerate(classes):
        folder = root / "train" / name
        folder.mkdir(parents=True, exist_ok=True)
        for number in range(per_class):
            width, height = (45, 60) if number % 5 == 0 else (60, 45)
            ramp = np.linspace(0.6, 1.2, width)[None, :, None]
            pixels = np.array(colours[index])[None, None] * ramp + rng.normal(0, 12, (height, width, 3))
            image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
            x, y = rng.integers(0, width - 15), rng.integers(0, height - 15)
            ImageDraw.Draw(image).ellipse([x, y, x + 14, y + 14], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
            image.save(folder / f"{number:03d}.jpg", quality=90)
    return root


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    return write_photos(tmp_path / "photos")


def module(root: Path, tmp_path: Path, **kwargs) -> ImageFolderDataModule:
    settings = {**PHOTOS, "batch_size": 8, "num_workers": 0, "cache_dir": str(tmp_path / "cache")}
    return ImageFolderDataModule(str(root), **{**settings, **kwargs})


def test_cached_and_streamed_training_draw_the_same_crops_from_one_config(photos, tmp_path):
    loaded, trained, evaluated = {}, {}, {}
    for cache in (True, False):
        data = module(photos, tmp_path, cache=cache)
        data.setup("fit")
        assert isinstance(data.datasets["train"], TensorImageDataset) == cache
        loaded[cache] = next(iter(data.train_dataloader()))
        trained[cache] = on_device(data, loaded[cache], training=True)
        evaluated[cache] = on_device(data, loaded[cache], training=False)
    batch, labels = loaded[True]
    assert batch.dtype == torch.uint8 and batch.shape == (8, 3, 23, 23)  # stored at 8/7 of the training size
    assert torch.equal(loaded[False][0], batch) and torch.equal(loaded[False][1], labels)
    assert torch.equal(trained[False], trained[True]) and trained[True].shape == (8, 3, 20, 20)

    # Training: a random-resized crop of the stored image, then the mirror; evaluation: its centre.
    mean, std = data.mean, data.std
    torch.manual_seed(0)
    expected = normalize(random_hflip(random_resized_crop(batch, (20, 20), (0.25, 1.0))), mean, std)
    assert torch.equal(trained[True], expected)
    assert torch.equal(evaluated[True], normalize(batch[:, :, 2:22, 2:22], mean, std))  # round(1.5) = 2, as torchvision
    assert not torch.allclose(trained[True], evaluated[True])


def test_a_photo_folder_keeps_any_aspect_ratio_in_one_shape(tmp_path):
    root = write_photos(tmp_path / "photos", per_class=5)  # portrait and landscape files
    data = module(root, tmp_path, val_fraction=0.2, test_fraction=0.0)
    data.setup("fit")
    assert data.datasets["train"].images.shape[1:] == (3, 23, 23)
    non_square = module(root, tmp_path, image_size=(16, 24), resize_size=20, val_fraction=0.2, test_fraction=0.0)
    assert non_square.resize_size == (20, 30)  # an int is the shorter side, in image_size's proportions
    non_square.setup("fit")
    assert non_square.datasets["train"].images.shape[1:] == (3, 20, 30)


def test_resize_size_defaults_and_bounds(photos, tmp_path):
    assert module(photos, tmp_path).resize_size == (23, 23)  # 20 x 8/7
    assert module(photos, tmp_path, crop_scale=None).resize_size == (20, 20)  # crop_padding's shifts: as trained
    assert module(photos, tmp_path, resize_size=(30, 26)).resize_size == (30, 26)
    with pytest.raises(ValueError, match=r"data.resize_size=16 gives 16x16 .* smaller than image_size 20x20"):
        module(photos, tmp_path, resize_size=16)
    assert module(photos, tmp_path, resize_size=80).resize_size == (80, 80)  # 4 times: a checkpoint's record may be
    with pytest.raises(ValueError, match=r"data.resize_size=81 gives 81x81: at most 4 times image_size 20x20"):
        module(photos, tmp_path, resize_size=81)  # a record past it is refused: predict could not use the run
    with pytest.raises(ValueError, match=r"crop_scale=\[0.25, 1.0\] and crop_padding=4 both crop"):
        module(photos, tmp_path, crop_padding=4)
    with pytest.raises(ValueError, match=r"crop_scale=\[0.0, 1.0\] must be a range within \(0, 1\]"):
        module(photos, tmp_path, crop_scale=(0.0, 1.0))


def cached_files(tmp_path: Path) -> set[str]:
    return {path.name for path in (tmp_path / "cache").glob("train-*.npy")}


def test_the_cache_is_rebuilt_when_resize_size_or_a_file_changes(photos, tmp_path, capsys):
    module(photos, tmp_path).setup("fit")
    assert "cached 60 images of train" in capsys.readouterr().out
    first = cached_files(tmp_path)
    module(photos, tmp_path).setup("fit")
    assert "cached" not in capsys.readouterr().out and cached_files(tmp_path) == first

    data = module(photos, tmp_path, resize_size=26)
    data.setup("fit")
    assert "cached 60 images of train" in capsys.readouterr().out and len(cached_files(tmp_path)) == 2
    assert data.datasets["train"].images.shape[-2:] == (26, 26)

    touched = photos / "train" / "snow" / "003.jpg"
    Image.new("RGB", (60, 45), "white").save(touched)  # the same name, another picture
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 1_000_000))
    module(photos, tmp_path).setup("fit")
    assert "cached 60 images" in capsys.readouterr().out and len(cached_files(tmp_path)) == 3


DiskUsage = namedtuple("DiskUsage", "total used free")


def test_a_cache_larger_than_the_free_disk_streams_with_both_sizes_named(photos, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cache_module.shutil, "disk_usage", lambda path: DiskUsage(10**9, 10**9 - 50_000, 50_000))
    data = module(photos, tmp_path)  # cache: null (the default)
    needed = 60 * 3 * 23 * 23  # images x channels x stored size, uint8
    with pytest.warns(UserWarning, match=re.escape(f"would take {needed / 1000:.1f} kB, but")) as warned:
        data.setup("fit")
    assert "has 50.0 kB free" in str(warned[0].message) and "so train streams from the files" in str(warned[0].message)
    assert isinstance(data.datasets["train"], FileDataset) and isinstance(data.datasets["val"], FileDataset)
    assert not list((tmp_path / "cache").glob("*.npy")) and "cached" not in capsys.readouterr().out
    images, _ = next(iter(data.train_dataloader()))
    assert images.shape == (8, 3, 23, 23)  # the same stored size, the same device-side crops

    with pytest.raises(CacheTooLarge, match="data.cache is true: free some space, set data.cache_dir"):
        module(photos, tmp_path, cache=True).setup("fit")
    forced = module(photos, tmp_path, cache=False)  # streams without a word
    forced.setup("fit")
    assert isinstance(forced.datasets["train"], FileDataset)


def test_a_damaged_photo_cache_is_found_and_rebuilt(photos, tmp_path, capsys):
    data = module(photos, tmp_path)
    data.setup("fit")
    expected = data.datasets["train"].images.clone()
    array = next((tmp_path / "cache").glob("train-*.npy"))
    np.lib.format.open_memmap(array, mode="r+")[:] = 0
    with pytest.warns(UserWarning, match=re.escape(f"{array} does not match the checksum")):
        rebuilt = module(photos, tmp_path)
        rebuilt.setup("fit")
    assert torch.equal(rebuilt.datasets["train"].images, expected)


def test_jpeg_draft_decoding_stays_close_to_a_full_decode(tmp_path):
    rng = np.random.default_rng(1)
    pixels = np.linspace(0, 255, 400)[None, :, None] * np.ones((300, 1, 3)) + rng.normal(0, 10, (300, 400, 3))
    path = tmp_path / "large.jpg"
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, quality=90)
    with Image.open(path) as image:
        image.draft("RGB", (40, 40))
        assert image.size == (100, 75)  # decoded at a quarter: an eighth would not cover 40x40
    full = np.asarray(ImageOps.fit(open_image(path, "RGB"), (40, 40), Image.Resampling.BILINEAR), np.float32)
    draft = cache_module.decode(path, (40, 40), "RGB").transpose(1, 2, 0).astype(np.float32)
    assert np.abs(full - draft).mean() < 3


def test_evaluating_with_another_resize_size_is_refused(photos, tmp_path):
    data = module(photos, tmp_path)
    data.setup("fit")
    record = data.preprocessing()
    assert record["resize"] == "cover_center_crop" and record["resize_size"] == [23, 23]
    assert record["input_shape"] == [3, 20, 20]
    other = module(photos, tmp_path, resize_size=26)
    with pytest.raises(ValueError, match=r"resized to cover \[23, 23\] .* this data resizes them to \[26, 26\]"):
        other.use_preprocessing(record)
    older = {key: value for key, value in record.items() if key != "resize_size"}  # before the key existed
    plain = module(photos, tmp_path, crop_scale=None)
    plain.use_preprocessing({**older, "input_shape": [3, 20, 20]})  # read as resize_size == the input size
    with pytest.raises(ValueError, match="resize_size must be two integers"):
        plain.use_preprocessing({**record, "resize_size": [10, 10]})


def test_evaluating_with_other_given_mean_and_std_is_refused(photos, tmp_path):
    """A checkpoint's statistics replace the data's: given others (data.mean, data.std), config.yaml would record
    statistics that were never used; the trained ones given again (as float32 kept them) are no change."""
    trained = module(photos, tmp_path, mean=[0.9, 0.8, 0.7], std=[0.2, 0.2, 0.2])
    trained.setup("fit")
    record = trained.preprocessing()
    module(photos, tmp_path, mean=[0.9, 0.8, 0.7], std=[0.2, 0.2, 0.2]).use_preprocessing(record)
    module(photos, tmp_path).use_preprocessing(record)
    with pytest.raises(ValueError, match=r"normalised with mean \[0.9.*\], but data.mean is \[0.5, 0.8, 0.7\]"):
        module(photos, tmp_path, mean=[0.5, 0.8, 0.7], std=[0.2, 0.2, 0.2]).use_preprocessing(record)
    with pytest.raises(ValueError, match=r"normalised with std \[0.2.*\], but data.std is \[0.01, 0.01, 0.01\]"):
        module(photos, tmp_path, mean=[0.9, 0.8, 0.7], std=[0.01, 0.01, 0.01]).use_preprocessing(record)


@pytest.mark.slow
def test_a_photo_folder_trains_validates_predicts_and_exports_at_a_size_other_than_the_caches(run_cli, tmp_path):
    from template.tools.export import export

    root = write_photos(tmp_path / "photos")
    data = ["--config", str(CONFIG), "--data.root", str(root), "--data.image_size", "20", "--data.resize_size", "24",
            "--data.crop_scale", "[0.35, 1.0]", "--data.crop_padding", "0", "--data.batch_size", "8",
            "--data.num_workers", "0", "--data.cache_dir", str(tmp_path / "cache")]  # fmt: skip
    trained = run_cli("fit", *data, "--trainer.max_epochs", "1")
    assert np.load(next((tmp_path / "cache").glob("train-*.npy")), mmap_mode="r").shape[1:] == (3, 24, 24)
    best = trained.trainer.checkpoint_callback.best_model_path
    assert "val/acc" in run_cli("validate", "--ckpt_path", best, "--data.root", str(root)).trainer.callback_metrics

    run_cli("predict", "--ckpt_path", best, "--data.predict_path", str(root / "train" / "snow"))
    rows = list(csv.DictReader(next(run_cli.runs_dir.glob("*/version_*/predictions.csv")).open()))
    assert len(rows) == 20

    # The exported file alone: its record says how to make the input, and gives the same answers.
    export(best, "torchscript", tmp_path / "model.pt")
    extra = {"preprocessing.json": "", "class_names.json": ""}
    net = torch.jit.load(str(tmp_path / "model.pt"), _extra_files=extra)
    record, class_names = json.loads(extra["preprocessing.json"]), json.loads(extra["class_names.json"])
    assert record["input_shape"] == [3, 20, 20] and record["resize_size"] == [24, 24]
    for row in rows[:4]:
        image = Image.open(row["sample"])
        image.draft(image.mode, (max(record["resize_size"]),) * 2)
        image = ImageOps.fit(ImageOps.exif_transpose(image).convert("RGB"), (24, 24), Image.Resampling.BILINEAR)
        image = image.crop((2, 2, 22, 22))  # the centre 20x20
        pixels = torch.from_numpy(np.asarray(image, np.float32).transpose(2, 0, 1).copy()) / 255
        mean, std = (torch.tensor(record[key]).view(-1, 1, 1) for key in ("mean", "std"))
        with torch.no_grad():
            probabilities = net(((pixels - mean) / std)[None]).softmax(dim=1)[0]
        assert class_names[int(probabilities.argmax())] == row["class_name"]
        assert float(probabilities.max()) == pytest.approx(float(row["probability"]), abs=1e-4)
