import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from template.data import ImageFolderDataModule


def build(root: Path, tmp_path: Path, **kwargs) -> ImageFolderDataModule:
    data = ImageFolderDataModule(str(root), image_size=16, batch_size=8, num_workers=0,
                                 cache_dir=str(tmp_path / "cache"), **kwargs)  # fmt: skip
    data.setup("fit")
    return data


# Each damages one file of a built cache, the way a full disk, a crash or a stray tool might, and returns it.
def truncated_array(array: Path, record: Path) -> Path:
    array.write_bytes(array.read_bytes()[:1000])
    return array


def record_not_json(array: Path, record: Path) -> Path:
    record.write_text(record.read_text()[:20])  # cut off mid-write
    return record


def record_without_keys(array: Path, record: Path) -> Path:
    record.write_text(json.dumps({"shape": json.loads(record.read_text())["shape"]}))
    return record


def record_nested_deep(array: Path, record: Path) -> Path:
    record.write_text("[" * 200_000 + "]" * 200_000)  # JSON that Python's parser cannot follow to its end
    return record


def record_past_its_cap(array: Path, record: Path) -> Path:
    # Whole and right, but far larger than a record of 36 files takes: it would be read whole, however large.
    record.write_text(record.read_text()[:-1] + ', "padding": "' + "x" * (4 << 20) + '"}')
    return record


def array_of_another_shape(array: Path, record: Path) -> Path:
    np.save(array, np.load(array)[:-1])  # one image short of the record
    return array


def payload_zeroed(array: Path, record: Path) -> Path:
    np.lib.format.open_memmap(array, mode="r+")[:] = 0  # the right size, the wrong pixels
    return array


@pytest.mark.parametrize(
    "damage",
    [
        truncated_array,
        record_not_json,
        record_nested_deep,
        record_without_keys,
        record_past_its_cap,
        array_of_another_shape,
        payload_zeroed,
    ],
)
def test_a_damaged_cache_is_rebuilt_with_a_warning_naming_the_file(image_folder, tmp_path, damage, capsys):
    expected = build(image_folder, tmp_path).datasets["train"].images.clone()
    cache = tmp_path / "cache"
    damaged = damage(next(cache.glob("train-*.npy")), next(cache.glob("train-*.json")))
    capsys.readouterr()

    with pytest.warns(UserWarning, match=re.escape(str(damaged))):
        rebuilt = build(image_folder, tmp_path)
    assert "cached 36 images of train" in capsys.readouterr().out
    assert torch.equal(rebuilt.datasets["train"].images, expected)
    build(image_folder, tmp_path)
    assert "cached" not in capsys.readouterr().out  # the rebuilt cache is trusted again


@pytest.mark.parametrize(
    "content",
    ['{"0": "OSError: cut o', "[3]", '{"999": "beyond the 37 files"}', "{}" + " " * (4 << 20)],
    ids=["cut", "list", "range", "past-its-cap"],
)
def test_a_damaged_check_record_is_rebuilt_with_a_warning_naming_it(image_folder, tmp_path, content):
    bad = image_folder / "train" / "cat" / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.warns(UserWarning, match="1 unreadable file"):
        build(image_folder, tmp_path, cache=False, skip_invalid=True)
    record = next((tmp_path / "cache").glob("train-*.check.json"))
    record.write_text(content)

    with pytest.warns(UserWarning, match=re.escape(str(record))):
        data = build(image_folder, tmp_path, cache=False, skip_invalid=True)
    used = data.split_files["train"] + data.split_files["val"]
    assert len(used) == 36 and bad not in used  # checked again: the unreadable file is still left out


def test_every_cache_file_arrives_whole_by_a_rename(image_folder, tmp_path, monkeypatch):
    # A reader (a later run, another rank) sees the old file or the new one, never half of one.
    renamed = []
    replace = os.replace

    def recorded_replace(source, target):
        renamed.append((Path(source), Path(target)))
        replace(source, target)

    monkeypatch.setattr(os, "replace", recorded_replace)
    build(image_folder, tmp_path, cache=True)
    build(image_folder, tmp_path, cache=False)
    written = sorted((tmp_path / "cache").iterdir())
    assert sorted(path.name.split(".", 1)[1] for path in written) == ["check.json", "json", "npy"]
    assert written == sorted(target for _, target in renamed)
    assert all(source.parent == target.parent for source, target in renamed)  # one file system: an atomic rename


def test_a_fifo_where_a_cache_record_would_be_is_damage_not_a_wait(tmp_path):
    from template.data.cache import read_record

    os.mkfifo(tmp_path / "record.json")  # opened, it would wait for a writer forever
    with pytest.raises(ValueError, match="is no regular file"):
        read_record(tmp_path / "record.json", 10)


def test_a_cache_made_elsewhere_is_never_used_even_with_a_checksum_that_matches_its_pixels(
    image_folder, tmp_path, monkeypatch
):
    """A stranger's cache (unpacked with a project, the same images' paths, sizes and times) with their pixels and a
    checksum written for them, or with good files listed unreadable: trusted, it trained on what they chose. Each
    user's caches are their own (a shared cache folder holds one of each)."""
    from template.data.cache import cache_key, checksum

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "stranger"))
    cache_key.cache_clear()
    build(image_folder, tmp_path)
    build(image_folder, tmp_path, cache=False, skip_invalid=True)
    array = next((tmp_path / "cache").glob("train-*.npy"))
    record = array.with_suffix(".json")
    np.lib.format.open_memmap(array, mode="r+")[:] = 0
    values = json.loads(record.read_text())
    values["checksum"] = checksum(np.load(array), {"shape": values["shape"], "invalid": values["invalid"]})
    record.write_text(json.dumps(values))
    check = next((tmp_path / "cache").glob("train-*.check.json"))
    check.write_text(
        json.dumps({"invalid": {"0": "planted"}, "checksum": checksum(None, {"invalid": {"0": "planted"}})})
    )
    assert build(image_folder, tmp_path).datasets["train"].images.abs().sum() == 0  # the stranger's, for the stranger

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "me"))
    cache_key.cache_clear()
    assert build(image_folder, tmp_path).datasets["train"].images.abs().sum() > 0
    data = build(image_folder, tmp_path, cache=False, skip_invalid=True)
    assert len(data.split_files["train"] + data.split_files["val"]) == 36  # no good file left out
    assert oct((tmp_path / "me" / "template" / "cache.key").stat().st_mode)[-3:] == "600"
    # Their files, under my cache's names (whoever may write the folder): refused by my key, and rebuilt.
    mine = sorted(path for path in (tmp_path / "cache").glob("train-*.npy") if path != array)
    assert len(mine) == 1
    mine[0].with_suffix(".json").write_text(json.dumps(values))
    with pytest.warns(UserWarning, match="changed, or made elsewhere"):
        assert build(image_folder, tmp_path).datasets["train"].images.abs().sum() > 0


def test_without_a_folder_for_the_cache_key_images_stream_and_the_warning_names_the_variable(
    image_folder, tmp_path, monkeypatch
):
    from template.data.cache import cache_key

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))  # no folder can be made under a file
    cache_key.cache_clear()
    with pytest.warns(UserWarning, match="cache.key cannot be made or read .*set XDG_CACHE_HOME to a folder"):
        data = build(image_folder, tmp_path)
    assert type(data.datasets["train"]).__name__ == "FileDataset"  # streamed: decoded every epoch
    assert not list((tmp_path / "cache").glob("*.npy")) and not list((tmp_path / "cache").glob("*.check.json"))
    cache_key.cache_clear()


def test_new_pixels_of_the_same_size_under_the_old_mtime_are_read_anew(image_folder, tmp_path):
    """Size and mtime alone matched a file rewritten with both kept (cp -p, tar, a fixed-size format such as BMP)."""
    bmp = image_folder / "train" / "cat" / "same.bmp"
    Image.new("RGB", (20, 24), (0, 0, 0)).save(bmp)
    before = build(image_folder, tmp_path)
    kept = bmp.stat()
    Image.new("RGB", (20, 24), (255, 255, 255)).save(bmp)
    os.utime(bmp, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    assert bmp.stat().st_size == kept.st_size and bmp.stat().st_mtime_ns == kept.st_mtime_ns
    after = build(image_folder, tmp_path)
    images = [torch.cat([data.datasets[split].images for split in ("train", "val")]) for data in (before, after)]
    assert not torch.equal(*images)  # the white image, not the cached black one


def test_a_decoded_image_is_writable_so_streaming_it_to_torch_warns_of_nothing(image_folder):
    from template.data.cache import decode

    # torch.from_numpy of a read-only array ("The given NumPy array is not writable") warned in every worker.
    assert decode(next((image_folder / "train" / "cat").glob("*.png")), (8, 8), "RGB").flags.writeable
