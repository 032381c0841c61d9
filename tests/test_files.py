"""Files from elsewhere, read in full by every reader: one mostly of holes is refused before it is read."""

import io
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from template.checkpoints import CheckpointError, check_hub_file, load_checkpoint, read_weights
from template.data.cifar10 import read_batch
from template.data.images import open_image
from template.files import NotARegularFile


def sparse(path: Path, head: bytes, size: int = 256 << 20) -> Path:
    """``head``, then holes up to ``size`` bytes: kilobytes on disk (a tar, rsync -S or truncate makes them)."""
    path.write_bytes(head)
    os.truncate(path, size)
    return path


def png_with_a_long_chunk() -> bytes:
    """A PNG whose first chunk, an unknown ancillary one, claims 255 MiB: Pillow reads and joins it all."""
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, "PNG")
    signature, rest = buffer.getvalue()[:8], buffer.getvalue()[8:]
    return signature + rest[:25] + (255 << 20).to_bytes(4, "big") + b"abCd"  # after IHDR: length, type, then holes


@pytest.mark.parametrize(
    "read, head",
    [
        (lambda path: open_image(path, "RGB"), png_with_a_long_chunk()),
        (read_batch, pickle.dumps({"data": np.zeros((1, 3072), np.uint8)})[:-1]),
        (lambda path: check_hub_file(path, "https://download.pytorch.org/models/x.pth"), b"PK"),
        (lambda path: read_weights(path, 1 << 40), b"\x80\x02"),
        (load_checkpoint, b"PK\x03\x04"),
    ],
    ids=["image", "cifar10 batch", "hub cache file", "weights file", "checkpoint"],
)
def test_a_file_mostly_of_holes_is_refused_before_it_is_read(tmp_path, read, head):
    name = "resnet18-0123abcd.pth" if head == b"PK" else "file"
    path = sparse(tmp_path / name, head)
    assert path.stat().st_blocks * 512 < 1 << 20  # 256 MiB in under a MiB of disk
    with pytest.raises((NotARegularFile, CheckpointError), match=r"is a file of holes \(sparse\): 268,435,456 bytes"):
        read(path)


def test_a_large_file_written_in_full_is_read_as_it_is(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"weight": torch.ones(5 << 20)}, path)  # 20 MiB of values, written: no holes
    assert read_weights(path, 1 << 30)["weight"].sum() == 5 << 20
