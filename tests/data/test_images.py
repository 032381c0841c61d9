import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_image_folder
from PIL import Image

from template.data import ImageFolderDataModule


def decoded(root: Path, tmp_path: Path, path: Path, cache: bool, **kwargs) -> torch.Tensor:
    """The test-split image of ``path`` as it reaches the device: uint8 (C, H, W), as float for comparing."""
    data = ImageFolderDataModule(str(root), batch_size=2, num_workers=0, cache=cache, cache_dir=str(tmp_path / "cache"),
                                 **kwargs)  # fmt: skip
    data.setup("test")  # the test split is resized and centre-cropped, never randomly augmented, on both paths
    image, _ = data.datasets["test"][data.split_files["test"].index(path)]
    assert image.dtype == torch.uint8  # on both paths
    return image.float()


def folder_with(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """Two small classes to train on, and test/a/``name`` for the image under test."""
    root = write_image_folder(tmp_path / "images", classes=("a", "b"), per_class=2, splits=("train", "val", "test"))
    return root, root / "test" / "a" / name


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "streamed"])
@pytest.mark.parametrize("channels", ["rgb", "grayscale"])
def test_a_16_bit_png_keeps_its_gradient_instead_of_saturating(tmp_path, cache, channels):
    root, path = folder_with(tmp_path, "depth16.png")
    gradient = np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (8, 1))  # (H, W) = (8, 64), dark to bright
    Image.fromarray(gradient).save(path)
    assert Image.open(path).mode.startswith("I")  # really stored with 16 bits

    image = decoded(root, tmp_path, path, cache, image_size=(8, 64), channels=channels)  # the file's own size
    expected = torch.from_numpy(gradient // 256).float()  # the top 8 of the 16 bits
    assert (image - expected).abs().max() <= 1  # not 255 from the second column on, as 16-bit values clip


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "streamed"])
@pytest.mark.parametrize("suffix", ["jpg", "png"])
def test_the_exif_orientation_is_applied(tmp_path, cache, suffix):
    root, path = folder_with(tmp_path, f"phone.{suffix}")
    stored = Image.new("RGB", (30, 10))  # W x H as the sensor stored it: landscape
    stored.paste((255, 255, 255), (0, 0, 10, 10))  # a white left third
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    stored.save(path, exif=exif)

    image = decoded(root, tmp_path, path, cache, image_size=(30, 10))  # (H, W): upright, portrait
    assert image[:, :8].mean() > 200 and image[:, 12:].mean() < 30  # the white third is now on top


def test_a_file_is_read_as_a_raster_image_or_refused_never_handed_to_another_program(tmp_path, monkeypatch):
    """Pillow tells a format by the bytes, whatever the name: an "image" that is PostScript would be rendered by
    Ghostscript (a program of its own, with escapes of its own). Pixels with no 8- or 16-bit range (float, 32-bit)
    are refused, not made black or saturated."""
    from template.data.images import open_image

    ran = tmp_path / "gs-ran"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "gs").write_text(f"#!/bin/sh\ntouch {ran}\n")
    (tmp_path / "bin" / "gs").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    postscript = tmp_path / "photo.png"
    postscript.write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nshowpage\n")
    with pytest.raises(ValueError, match="no image of a format read here .JPEG, PNG"):
        open_image(postscript, "RGB")
    assert not ran.exists()
    Image.fromarray(np.full((4, 4), 0.5, dtype=np.float32)).save(tmp_path / "float.tif")
    with pytest.raises(ValueError, match="F pixels of no 8- or 16-bit range"):
        open_image(tmp_path / "float.tif", "RGB")


def test_an_image_past_pillows_pixel_limit_is_refused_not_decoded(tmp_path, monkeypatch):
    """Pillow only warns between its limit and twice it: a 516 KB PNG decoded to 2.3 GB, per worker, every epoch."""
    from template.data.images import open_image

    Image.new("RGB", (40, 40)).save(tmp_path / "bomb.png")  # 1,600 pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000)  # a limit it passes by less than twice
    with pytest.raises(ValueError, match="over 1,000 pixels"):
        open_image(tmp_path / "bomb.png", "RGB")


def test_a_jpeg_of_more_scans_than_an_encoder_writes_is_refused_not_decoded(tmp_path):
    """libjpeg decodes every scan over the whole image: a 630 KB progressive JPEG of 8,000 x 8,000 pixels, its last
    scan repeated 4,000 times, took 2 minutes. A real progressive one is decoded, scan-like bytes of its metadata
    (a comment here, a thumbnail in EXIF) not counted."""
    from template.data.images import MAX_JPEG_SCANS, open_image

    root, path = folder_with(tmp_path, "scans.jpg")
    gradient = np.tile(np.arange(0, 256, 16, dtype=np.uint8), (16, 1))  # (H, W) = (16, 16)
    Image.fromarray(gradient).save(path, progressive=True, comment=b"\xff\xda" * (MAX_JPEG_SCANS + 1))
    assert np.abs(np.asarray(open_image(path, "L"), dtype=int) - gradient).max() <= 8

    data = path.read_bytes()
    last = data[data.rindex(b"\xff\xda") : -2]  # the last scan, up to EOI (0xFFD9)
    path.write_bytes(data[:-2] + last * MAX_JPEG_SCANS + b"\xff\xd9")
    scans = data.count(b"\xff\xda") - (MAX_JPEG_SCANS + 1) + MAX_JPEG_SCANS  # the comment's are no scans
    with pytest.raises(ValueError, match=f"a JPEG of {scans} scans, over the {MAX_JPEG_SCANS} an encoder writes"):
        open_image(path, "L")
    data = ImageFolderDataModule(str(root), image_size=16, batch_size=2, num_workers=0, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match=f"(?s)1 unreadable file.*{re.escape(str(path))} .*{scans} scans"):
        data.setup("test")
