import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import FakeTrainer, on_device, write_image_folder
from PIL import Image

from template.data import ImageFolderDataModule
from template.data.folder import FileDataset


def module(root: Path, tmp_path: Path, **kwargs) -> ImageFolderDataModule:
    settings = {"image_size": 16, "batch_size": 8, "num_workers": 0, "cache_dir": str(tmp_path / "cache")}
    return ImageFolderDataModule(str(root), **{**settings, **kwargs})


def test_classes_come_from_sorted_folder_names(image_folder, tmp_path):
    (image_folder / "train" / "aardvark").mkdir()
    Image.new("RGB", (8, 8)).save(image_folder / "train" / "aardvark" / "a.png")
    data = module(image_folder, tmp_path)
    assert data.class_names == ["aardvark", "cat", "dog", "owl"] and data.num_classes == 4
    assert data.input_shape == (3, 16, 16)


def test_classes_other_than_the_folders_say_where_they_may_come_from_and_how_to_learn_new_ones(image_folder, tmp_path):
    """A checkpoint's classes reach data.classes: the error blamed an option the user never set, and said no way on."""
    with pytest.raises(ValueError) as error:
        module(image_folder, tmp_path, classes=["bird", "cat", "dog"])
    said = str(error.value)
    assert "data.classes ['bird', 'cat', 'dog'] (given, or those a --ckpt_path checkpoint was trained on)" in said
    assert "['cat', 'dog', 'owl']" in said and "--weights_file" in said


@pytest.mark.parametrize("cache", [True, False])
def test_both_paths_give_train_val_and_test_batches(image_folder, tmp_path, cache):
    data = module(image_folder, tmp_path, cache=cache, val_fraction=0.25)
    data.setup("fit")
    images, labels = next(iter(data.train_dataloader()))
    assert images.shape == (8, 3, 16, 16) and labels.dtype == torch.int64
    assert images.dtype == torch.uint8  # at the training size; augmented on the device
    assert isinstance(data.datasets["train"], FileDataset) != cache
    assert len(data.datasets["train"]) == 27 and len(data.datasets["val"]) == 9  # 36 train images, 1/4 held out
    assert "test" not in data.datasets
    data.setup("test")
    assert len(data.datasets["test"]) == 36
    assert len(data.mean) == 3 and torch.all(data.std > 0)


def test_cached_and_streamed_paths_train_on_the_same_augmented_batches(image_folder, tmp_path):
    # One config, one recipe: `cache` (or cache: null streaming what would not fit the disk) changes where
    # images are decoded, never what the model trains on.
    loaded, trained = {}, {}
    for cache in (True, False):
        data = module(image_folder, tmp_path, cache=cache, num_workers=2, crop_padding=3, hflip=True)
        data.setup("fit")
        loader = data.train_dataloader()
        assert loader.persistent_workers != cache  # streamed: decoded in workers; cached: indexed here
        loaded[cache] = next(iter(loader))
        trained[cache] = on_device(data, loaded[cache], training=True)
    (cached, cached_labels), (streamed, streamed_labels) = loaded[True], loaded[False]
    assert streamed.dtype == torch.uint8 and torch.equal(streamed, cached)
    assert torch.equal(streamed_labels, cached_labels)
    assert torch.equal(trained[False], trained[True])


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "streamed"])
def test_crop_padding_shifts_training_images_on_either_path(image_folder, tmp_path, cache):
    data = module(image_folder, tmp_path, cache=cache, crop_padding=2, hflip=False)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    plain, augmented = on_device(data, batch, training=False), on_device(data, batch, training=True)
    assert not torch.equal(augmented, plain)  # crop_padding took effect
    padded = F.pad(plain, (2, 2, 2, 2), mode="reflect")
    windows = [padded[:, :, top : top + 16, left : left + 16] for top in range(5) for left in range(5)]
    for index in range(len(plain)):  # each image shifted within the padding, and nothing else
        assert any(torch.equal(augmented[index], window[index]) for window in windows)


def test_val_split_is_stratified_by_class(image_folder, tmp_path):
    data = module(image_folder, tmp_path, val_fraction=0.25)
    data.setup("fit")
    assert torch.bincount(data.datasets["val"].labels).tolist() == [3, 3, 3]
    train_files = set(data.split_files["train"])
    assert not train_files & set(data.split_files["val"])


@pytest.mark.parametrize("folders", [("train",), ("train", "val")])
def test_without_a_test_folder_a_stratified_seeded_share_of_train_is_the_test_split(tmp_path, folders):
    root = write_image_folder(tmp_path / "images", per_class=20, splits=folders)
    data = module(root, tmp_path, val_fraction=0.15, test_fraction=0.15)
    assert data.has_test
    data.setup("fit")
    data.setup("test")
    split = {name: set(data.split_files[name]) for name in ("train", "val", "test")}
    assert not split["train"] & split["test"] and not split["val"] & split["test"]
    assert torch.bincount(data.datasets["test"].labels).tolist() == [3, 3, 3]  # 15% of 60, by class
    assert all(path.parent.parent.name == "train" for path in split["test"])
    if "val" in folders:  # the val folder as it is; only the test split comes out of train/
        assert all(path.parent.parent.name == "val" for path in split["val"]) and len(split["train"]) == 51
    else:
        assert len(split["train"]) + len(split["val"]) + len(split["test"]) == 60
    again = module(root, tmp_path, val_fraction=0.15, test_fraction=0.15)
    again.setup("test")  # test alone, in another process: the same images
    assert set(again.split_files["test"]) == split["test"]
    other_seed = module(root, tmp_path, val_fraction=0.15, test_fraction=0.15, split_seed=1)
    other_seed.load_split("test")
    assert set(other_seed.split_files["test"]) != split["test"]
    assert not module(root, tmp_path, test_fraction=0).has_test


def test_held_out_splits_drawn_with_other_options_are_refused_naming_them(tmp_path):
    """Splits drawn from train/ again (from Python, past the CLI's check of the options) are refused naming the
    options changed and both values; with the same options, the files changed since are to blame."""
    root = write_image_folder(tmp_path / "images", per_class=12)
    trained = module(root, tmp_path)
    trained.setup("fit")
    state = trained.state_dict()
    other = module(root, tmp_path, val_fraction=0.3)
    other.trainer = SimpleNamespace(state=SimpleNamespace(fn="validate"))
    other.setup("validate")
    with pytest.raises(ValueError, match=r"held out \(data.val_fraction 0.1 in its run, 0.3 now\), so they mix"):
        other.load_state_dict(state)
    trained.split_files["val"][0].unlink()  # a held-out image removed since
    again = module(root, tmp_path)
    again.trainer = other.trainer
    again.setup("validate")
    with pytest.raises(ValueError, match=r"held out \(images added, removed or renamed since\), so they mix"):
        again.load_state_dict(state)


def test_a_test_fraction_outside_0_to_1_is_refused(image_folder, tmp_path):
    with pytest.raises(ValueError, match="test_fraction=1.0 must be at least 0 and below 1"):
        module(image_folder, tmp_path, test_fraction=1.0)


def test_a_val_folder_is_used_as_it_is(image_folder, tmp_path):
    (image_folder / "val" / "cat").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(image_folder / "val" / "cat" / "only.png")
    with pytest.warns(
        UserWarning, match=r"2 class\(es\) without a folder in .*val, left out of val/acc:\n  dog\n  owl"
    ):
        data = module(image_folder, tmp_path)
    data.setup("fit")
    assert len(data.datasets["val"]) == 1 and len(data.datasets["train"]) == 36
    with pytest.warns(UserWarning, match=r"data.val_fraction=0.3 is not used: .*val is the split"):
        module(image_folder, tmp_path, val_fraction=0.3)  # a share of train/ asked for, where val/ decides


def cached_files(tmp_path: Path) -> set[str]:
    return {path.name for path in (tmp_path / "cache").glob("train-*.npy")}


def test_the_cache_is_reused_and_invalidated_by_a_touched_or_added_file(image_folder, tmp_path, capsys):
    module(image_folder, tmp_path).setup("fit")
    assert "cached 36 images of train" in capsys.readouterr().out
    first = cached_files(tmp_path)
    module(image_folder, tmp_path).setup("fit")
    assert "cached" not in capsys.readouterr().out and cached_files(tmp_path) == first  # opened, not rebuilt

    touched = image_folder / "train" / "cat" / "000.png"
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 1_000_000))
    module(image_folder, tmp_path).setup("fit")
    assert "cached 36 images" in capsys.readouterr().out and len(cached_files(tmp_path)) == 2

    Image.new("RGB", (8, 8), "white").save(image_folder / "train" / "cat" / "new.png")
    data = module(image_folder, tmp_path)
    data.setup("fit")
    assert "cached 37 images" in capsys.readouterr().out and len(cached_files(tmp_path)) == 3


def test_an_interrupted_cache_build_is_never_trusted(image_folder, tmp_path, monkeypatch):
    import template.data.cache as cache

    def interrupted(*args, **kwargs):
        yield 0, np.zeros((3, 16, 16), np.uint8), None
        raise KeyboardInterrupt  # the user gave up half way

    monkeypatch.setattr(cache, "decode_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        module(image_folder, tmp_path).setup("fit")
    assert list((tmp_path / "cache").iterdir()) == []  # no array, no record, no temporary file
    monkeypatch.undo()

    data = module(image_folder, tmp_path)  # an array without its record is not trusted either
    data.setup("fit")
    record = next((tmp_path / "cache").glob("train-*.json"))
    record.unlink()
    stale = next((tmp_path / "cache").glob("train-*.npy"))
    np.lib.format.open_memmap(stale, mode="r+")[:] = 0
    rebuilt = module(image_folder, tmp_path)
    rebuilt.setup("fit")
    assert rebuilt.datasets["train"].images.float().mean() > 10  # decoded again, not zeros


def test_grey_and_rgba_files_are_converted_not_rejected(image_folder, tmp_path):
    Image.new("L", (10, 10), 128).save(image_folder / "train" / "cat" / "grey.png")
    Image.new("RGBA", (10, 10), (1, 2, 3, 4)).save(image_folder / "train" / "cat" / "alpha.png")
    Image.new("P", (10, 10)).save(image_folder / "train" / "cat" / "palette.gif")
    data = module(image_folder, tmp_path, val_fraction=0.2)
    data.setup("fit")
    assert len(data.datasets["train"]) + len(data.datasets["val"]) == 39
    grey = module(image_folder, tmp_path, channels="grayscale")
    grey.setup("fit")
    assert grey.datasets["train"].images.shape[1] == 1 and grey.input_shape[0] == 1


def plant_bad_files(root: Path) -> list[Path]:
    truncated = root / "train" / "dog" / "truncated.jpg"
    data = (root / "train" / "dog" / "001.jpg").read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    corrupt = root / "train" / "cat" / "corrupt.png"
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(200)))
    text = root / "train" / "owl" / "notes.txt"
    text.write_text("not an image")
    return [truncated, corrupt, text]


@pytest.mark.parametrize("cache", [True, False])
def test_unreadable_files_stop_setup_naming_every_one(image_folder, tmp_path, cache, capsys):
    bad = plant_bad_files(image_folder)
    with pytest.raises(ValueError) as error:
        module(image_folder, tmp_path, cache=cache).setup("fit")
    if cache:  # the images it holds, not the files it was given: "cached 39" read as if all were fine
        assert "cached 36 images of train (3 unreadable files not in it)" in capsys.readouterr().out
    message = str(error.value)
    assert message.startswith("3 unreadable file(s)")
    assert all(str(path) in message for path in bad) and "skip_invalid" in message


def test_skip_invalid_leaves_them_out_and_says_which(image_folder, tmp_path):
    bad = plant_bad_files(image_folder)
    data = module(image_folder, tmp_path, skip_invalid=True, val_fraction=0.25)
    with pytest.warns(UserWarning, match="3 unreadable file") as warned:
        data.setup("fit")
    assert all(str(path) in str(warned[0].message) for path in bad)
    assert len(data.datasets["train"]) + len(data.datasets["val"]) == 36


def test_layout_problems_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no train/ folder in") as refused:
        ImageFolderDataModule(str(tmp_path))
    assert "no such folder" not in str(refused.value)  # the folder is there: its train/ is not
    with pytest.raises(FileNotFoundError, match=r"no train/ folder in \S*photo \(no such folder\)"):
        ImageFolderDataModule(str(tmp_path / "photo"))  # a mistyped --data.root says so
    (tmp_path / "photos.zip").write_bytes(b"PK")
    with pytest.raises(FileNotFoundError, match=r"photos.zip \(not a folder\)"):
        ImageFolderDataModule(str(tmp_path / "photos.zip"))
    (tmp_path / "train" / "cat").mkdir(parents=True)
    (tmp_path / "train" / "dog").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "train" / "cat" / "a.png")
    with pytest.raises(ValueError, match=r"(?s)1 empty class folder\(s\).*train/dog"):
        ImageFolderDataModule(str(tmp_path))
    Image.new("RGB", (4, 4)).save(tmp_path / "train" / "dog" / "a.png")
    (tmp_path / "test" / "emu").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(tmp_path / "test" / "emu" / "a.png")
    with pytest.raises(ValueError, match="test/ has class folder.*that train/ lacks: emu"):
        ImageFolderDataModule(str(tmp_path))
    shutil.rmtree(tmp_path / "test")
    # Loose images in val/ (or none): the fit trained on every image and validated on none, and exited 0.
    (tmp_path / "val").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "val" / "a.png")
    with pytest.raises(ValueError, match=r"val has no class folders: expected val/<class>/<image files> as in train/"):
        ImageFolderDataModule(str(tmp_path))
    shutil.rmtree(tmp_path / "val")
    # Another name for a split (Roboflow's valid/, a Test/): unread, the split drawn from train/ instead, unsaid.
    for name in ("valid", "Test"):
        (tmp_path / name / "cat").mkdir(parents=True)
        Image.new("RGB", (4, 4)).save(tmp_path / name / "cat" / "a.png")
    with pytest.raises(ValueError, match=r"split folder\(s\) Test, valid: only train/, val/ and test/ are read"):
        ImageFolderDataModule(str(tmp_path))
    shutil.rmtree(tmp_path / "valid")
    shutil.rmtree(tmp_path / "Test")
    (tmp_path / "tests" / "unit").mkdir(parents=True)  # a project's code beside its data: no split's name
    assert ImageFolderDataModule(str(tmp_path)).class_names == ["cat", "dog"]
    # A line break in a class's name: trained, then its checkpoint refused by every command.
    (tmp_path / "train" / "cat\nowl").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "train" / "cat\nowl" / "a.png")
    with pytest.raises(ValueError, match=r"class folder name\(s\) with a control character .*'cat\\nowl'"):
        ImageFolderDataModule(str(tmp_path))


def test_file_names_of_another_encoding_are_refused_naming_them(image_folder, tmp_path):
    """A Latin-1 name, which Python reads with an escape (``\\udce9``), stopped fit and predict with "'utf-8' codec
    can't encode character", naming no file: the cache's key, the record and predictions.csv write names as text."""
    latin = os.fsdecode(os.fsencode(image_folder / "train" / "cat") + b"/caf\xe9.png")
    Image.new("RGB", (4, 4)).save(latin)
    with pytest.raises(ValueError, match=r"1 name\(s\) in .*train/cat that are not UTF-8 text.*\n  .*caf\\udce9.png"):
        module(image_folder, tmp_path)
    os.replace(latin, predicted := os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9.png"))  # a file of its own
    with pytest.raises(ValueError, match=r"1 name\(s\) in data.predict_path that are not UTF-8 text"):
        module(image_folder, tmp_path, predict_path=predicted).setup("predict")


def test_broken_and_folder_symlinks_are_named_and_left_out(image_folder, tmp_path):
    cat = image_folder / "train" / "cat"
    (cat / "gone.png").symlink_to(tmp_path / "nowhere.png")  # dangling: its target was moved away
    (cat / "loop.png").symlink_to(cat / "loop.png")
    (cat / "more").symlink_to(image_folder / "test" / "cat", target_is_directory=True)
    (image_folder / "train" / "emu").symlink_to(tmp_path / "moved")  # a whole class folder moved away
    with pytest.warns(UserWarning, match=r"3 symlink\(s\) left out") as warned:
        data = module(image_folder, tmp_path)
    message = "\n".join(str(warning.message) for warning in warned)
    assert f"{cat / 'gone.png'} (dangling, or a loop)" in message and f"{cat / 'loop.png'} (dangling" in message
    assert f"{cat / 'more'} (a link to a folder" in message
    assert f"{image_folder / 'train' / 'emu'} (dangling, or a loop)" in message
    assert len(data.folders["train"]["cat"]) == 12 and data.class_names == ["cat", "dog", "owl"]


def test_links_to_files_outside_the_folder_are_followed_and_named(image_folder, tmp_path):
    """A dataset from elsewhere can link its images to your own files (a class folder, a photo): they are read,
    as a symlink farm's are, and named with where they lead, so that you see what is trained on and cached."""
    private = write_image_folder(tmp_path / "private", classes=("mine",), per_class=2)
    (image_folder / "train" / "emu").symlink_to(private / "train" / "mine", target_is_directory=True)
    (image_folder / "train" / "cat" / "photo.png").symlink_to(private / "train" / "mine" / "000.png")
    with pytest.warns(UserWarning, match=r"to files outside it, followed") as warned:
        data = module(image_folder, tmp_path)
    message = "\n".join(str(warning.message) for warning in warned)
    assert f"{image_folder / 'train' / 'emu'} -> {private / 'train' / 'mine'}" in message
    assert f"{image_folder / 'train' / 'cat' / 'photo.png'} -> {private / 'train' / 'mine' / '000.png'}" in message
    assert data.class_names == ["cat", "dog", "emu", "owl"]


def test_a_file_name_with_escape_sequences_is_listed_escaped(image_folder, tmp_path):
    (image_folder / "train" / "cat" / "x\x1b]0;PWNED\x07.png").write_bytes(b"not an image")
    with pytest.raises(ValueError) as raised:
        module(image_folder, tmp_path).setup("fit")
    assert "\x1b" not in str(raised.value) and "x\\x1b]0;PWNED\\x07.png" in str(raised.value)


def test_a_dataset_inside_a_hidden_folder_is_read(tmp_path):
    # Hidden names are skipped inside class folders only: ~/.cache/datasets is a fine home for one.
    root = write_image_folder(tmp_path / ".datasets" / "images", classes=("a", "b"), per_class=2)
    assert len(module(root, tmp_path).folders["train"]["a"]) == 2


@pytest.mark.parametrize("cache", [True, False])
def test_skip_invalid_refuses_a_class_left_without_readable_images(image_folder, tmp_path, cache):
    (image_folder / "train" / "emu").mkdir()
    (image_folder / "train" / "emu" / "photo.jpg").write_bytes(b"not an image")
    data = module(image_folder, tmp_path, cache=cache, skip_invalid=True)
    with pytest.warns(UserWarning, match="1 unreadable file"), pytest.raises(ValueError) as error:
        data.setup("fit")
    assert f"emu ({image_folder / 'train' / 'emu'})" in str(error.value) and "remove the folder" in str(error.value)


def test_a_single_class_is_refused_before_training(tmp_path):
    root = write_image_folder(tmp_path / "images", classes=("cat",), per_class=2)
    with pytest.raises(ValueError, match=r"only one class folder \(cat\).*at least two"):
        module(root, tmp_path)


def test_missing_test_images_and_predict_images_say_what_to_do(image_folder, tmp_path):
    shutil.rmtree(image_folder / "test")
    with pytest.raises(
        FileNotFoundError,
        match=r"no test/ folder in .*test/<class>/.* never trained on, or run validate \(a new fit with data.test_fraction above 0",
    ):
        module(image_folder, tmp_path, test_fraction=0).setup("test")
    with pytest.raises(ValueError, match="predict needs images: set data.*predict_path to a folder"):
        module(image_folder, tmp_path).setup("predict")
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError, match=f"predict_path: {missing} does not exist; set it to a folder"):
        module(image_folder, tmp_path, predict_path=str(missing)).setup("predict")
    missing.mkdir()
    with pytest.raises(ValueError, match=f"predict_path: {missing} holds no files"):
        module(image_folder, tmp_path, predict_path=str(missing)).setup("predict")


def test_a_predict_folder_nested_past_the_depth_bound_is_refused_naming_it(image_folder, tmp_path):
    """rglob recursed a stack frame a level: a folder 1,500 deep ended in "maximum recursion depth exceeded", with
    no folder named. Images as deep as the bound are still found."""
    from template.data.folder import MAX_DEPTH

    deep = tmp_path / "predict"
    os.makedirs(deep.joinpath(*["a"] * MAX_DEPTH))
    Image.new("RGB", (4, 4)).save(deep.joinpath(*["a"] * MAX_DEPTH, "deepest.png"))
    data = module(image_folder, tmp_path, predict_path=str(deep))
    data.setup("predict")
    assert [path.name for path in data.split_files["predict"]] == ["deepest.png"]
    (deep.joinpath(*["a"] * MAX_DEPTH) / "a").mkdir()
    with pytest.raises(ValueError, match=f"^{re.escape(str(deep))} nests folders over {MAX_DEPTH} deep"):
        module(image_folder, tmp_path, predict_path=str(deep)).setup("predict")


POLICIES = {  # each augmentation alone, crop and mirror off, so that any change is its own
    "trivialaugment": {"policy": "trivialaugment"},
    "randaugment": {"policy": "randaugment"},
    "random_erasing": {"random_erasing": 1.0},
    "mixup": {"mixup_alpha": 0.4},
    "cutmix": {"cutmix_alpha": 1.0},
}


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_trains_alike_on_either_path(image_folder, tmp_path, policy):
    outputs = {}
    for cache in (True, False):
        data = module(image_folder, tmp_path, cache=cache, crop_padding=0, hflip=False, **POLICIES[policy])
        data.setup("fit")
        batch = next(iter(data.train_dataloader()))
        data.trainer = FakeTrainer(training=False)
        plain = data.on_after_batch_transfer(batch, 0)
        data.trainer = FakeTrainer(training=True)
        torch.manual_seed(0)
        outputs[cache] = data.on_after_batch_transfer(batch, 0)
        assert not torch.equal(outputs[cache][0], plain[0])  # the policy took effect
        assert torch.equal(plain[1], batch[1])  # evaluation: labels untouched
    (cached, cached_labels), (streamed, streamed_labels) = outputs[True], outputs[False]
    assert torch.equal(cached, streamed) and torch.equal(cached_labels, streamed_labels)
    assert cached.dtype == torch.float32 and cached.shape == (8, 3, 16, 16)
    if policy in ("mixup", "cutmix"):  # class probabilities (B, K)
        assert cached_labels.shape == (8, 3) and torch.allclose(cached_labels.sum(dim=1), torch.ones(8))
    else:
        assert torch.equal(cached_labels, batch[1])


def test_an_unknown_policy_or_a_bad_probability_is_refused(image_folder, tmp_path):
    with pytest.raises(ValueError, match="policy='autoaugment' is not one of"):
        module(image_folder, tmp_path, policy="autoaugment")
    with pytest.raises(ValueError, match="random_erasing=1.5 must be a probability"):
        module(image_folder, tmp_path, random_erasing=1.5)


@pytest.mark.parametrize(
    "stats, refused",
    [
        ({"mean": [125.3, 123.0, 113.9], "std": [63.0, 62.1, 66.7]}, "preprocessing mean must be 3 numbers"),
        ({"mean": [0.5], "std": [0.25]}, "preprocessing mean must be 3 numbers"),  # a grey image's, for RGB
        ({"mean": [0.5, 0.5, 0.5]}, "give both"),  # std computed, mean silently too
    ],
)
def test_statistics_a_checkpoint_could_not_hold_are_refused_before_training(image_folder, tmp_path, stats, refused):
    """Statistics of 0-255 pixels (or of another channel count) would train, then every checkpoint of the run would
    be refused when read back: said at setup, naming the options."""
    with pytest.raises(ValueError, match=refused):
        module(image_folder, tmp_path, **stats).setup("fit")


def test_testing_a_trained_model_without_a_root_asks_for_the_folder_not_a_split(tmp_path):
    """`test --ckpt_path best` without --data.root said "train needs images", of a command that tests."""
    data = ImageFolderDataModule(None, classes=["cat", "dog"], image_size=16, cache_dir=str(tmp_path))
    with pytest.raises(
        FileNotFoundError, match=r"no images to read: give --data.root DIR, the folder that holds train/"
    ):
        data.setup("test")
