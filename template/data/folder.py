"""Your own images: ``root/train/<class>/*`` (and optionally ``root/val``, ``root/test``)."""

import hashlib
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import Dataset

from template.data.augment import Flip, channel_stats
from template.data.base import ImageDataModule, Split, image_size_pair, split_named
from template.data.cache import CacheTooLarge, CacheUnavailable, load_or_build, load_or_check
from template.data.loaders import FileDataset, TensorImageDataset
from template.data.preprocessing import MAX_PIXELS, MAX_RESIZE_RATIO
from template.files import walk
from template.text import has_controls, is_text, shown

MAX_LISTED = 20  # offending files named in an error; the count covers them all
SPLIT_ALIASES = {"val", "valid", "validation", "validate", "dev", "eval", "evaluation", "test", "testing", "train"}
DEFAULT_IMAGE_SIZE = 32  # image_size when none is given and no pretrained weights set one
RESIZE_MARGIN = 8 / 7  # the default resize_size over image_size with random-resized crops: torchvision's 256 for 224
DRAWN_BY = ("split_seed", "val_fraction", "test_fraction")  # the options that draw val and test from train/
FRACTION = 0.1  # of train/ held out for val and for test, where no folder holds them
MAX_DEPTH = 32  # folder levels below a listed folder: image folders nest a few (photos/2024/06/), never dozens


def visible(folder: Path, recursive: bool = True) -> list[Path]:
    """Sorted paths in (or below) ``folder``, hidden ones left out; dangling links, and links to folders below
    it (not followed), named in a warning: a moved target would vanish without a word."""
    try:  # hidden folders not entered: all they hold is left out
        found = list(walk(folder, MAX_DEPTH, hidden=False)) if recursive else folder.iterdir()
    except ValueError as error:
        raise ValueError(f"{error}: point at the images' own folder") from None
    paths = sorted(p for p in found if not any(part.startswith(".") for part in p.relative_to(folder).parts))
    check_text_names(paths, folder)
    skipped = [f"{p} (dangling, or a loop)" for p in paths if p.is_symlink() and not p.exists()]
    if recursive:
        skipped += [f"{p} (a link to a folder: not followed)" for p in paths if p.is_symlink() and p.is_dir()]
    if skipped:
        rank_zero_warn(describe(skipped, f"symlink(s) left out of {folder}; fix or remove them to silence this"))
    inside, links = folder.resolve(), [p for p in paths if p.is_symlink() and p.exists()]
    if outside := [f"{p} -> {p.resolve()}" for p in links if not p.resolve().is_relative_to(inside)]:
        rank_zero_warn(
            describe(outside, f"symlink(s) in {folder} to files outside it, followed: are they yours to use?")
        )
    return paths


def check_text_names(paths: list[Path], where: object) -> None:
    """Refuse names that are no UTF-8 text (another system's encoding, read as escapes): the cache's key, the run's
    record and predictions.csv write them as text."""
    if odd := [str(path) for path in paths if not is_text(str(path))]:
        reason = f"name(s) in {where} that are not UTF-8 text (another system's encoding): rename them in UTF-8"
        raise ValueError(describe(odd, reason))


def list_files(folder: Path) -> list[Path]:
    return [path for path in visible(folder) if path.is_file()]


def describe(paths: list[str], what: str) -> str:
    """``what``, counted, and the first MAX_LISTED of ``paths``, one a line."""
    listed = "\n  ".join(shown(path, markup=False) for path in paths[:MAX_LISTED])  # names: no line or escape of theirs
    more = f"\n  ... and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else ""
    return f"{len(paths)} {what}:\n  {listed}{more}"


def named(files: list[Path], invalid: dict[int, str]) -> list[str]:  # {index: reason} of describe's unreadable files
    return [f"{files[index]} ({reason})" for index, reason in sorted(invalid.items())]


def resize_pair(
    resize_size: int | tuple[int, int] | None, image_size: tuple[int, int], margin: float
) -> tuple[int, int]:
    """``resize_size`` as (H, W), at least ``image_size``: an int is the shorter side; ``None``, ``margin`` times."""
    if resize_size is None or isinstance(resize_size, int):
        scale = margin if resize_size is None else resize_size / min(image_size)
        pair = (round(image_size[0] * scale), round(image_size[1] * scale))
    else:
        pair = image_size_pair(resize_size)
    if pair[0] < image_size[0] or pair[1] < image_size[1]:
        raise ValueError(
            f"data.resize_size={resize_size} gives {pair[0]}x{pair[1]} (height x width), smaller than image_size "
            f"{image_size[0]}x{image_size[1]}, which is cut out of it: set it to at least {min(image_size)}"
        )
    if max(p / side for p, side in zip(pair, image_size)) > MAX_RESIZE_RATIO or pair[0] * pair[1] > MAX_PIXELS:
        raise ValueError(  # a checkpoint's record is refused past these too: predict could not use the run
            f"data.resize_size={resize_size} gives {pair[0]}x{pair[1]}: at most {MAX_RESIZE_RATIO} times image_size "
            f"{image_size[0]}x{image_size[1]} and {MAX_PIXELS:,} pixels"
        )
    return pair


def described(root: Path) -> str:
    """``root`` as an error names it, saying so where it is no folder (a mistyped --data.root)."""
    return f"{root.resolve()}{'' if root.is_dir() else ' (not a folder)' if root.exists() else ' (no such folder)'}"


class ImageFolderDataModule(ImageDataModule):
    """Images in class folders ``root/<split>/<class>/*``, decoded once into a cache or streamed from the files,
    each resized to cover ``resize_size`` and centre-cropped. The class names and normalisation travel in the
    checkpoint, so ``predict`` of a trained model needs no training folder.

    Args:
        root: the dataset folder, holding ``train/`` and optionally ``val/`` and ``test/``.
        image_size: the size the model gets (side, or (H, W)); ``None``: the pretrained weights'
            input size when the CLI has torchvision weights, else 32.
        resize_size: the size images are stored at (the shorter side, or (H, W)), at least image_size.
            ``None``: image_size, or 8/7 of it with crop_scale (torchvision's 256 for 224).
        interpolation: of that resize, ``bilinear`` (``None``) or ``bicubic`` (most timm weights').
        channels: ``rgb`` (grey and RGBA files are converted) or ``grayscale``.
        val_fraction: share of ``train`` held out for validation when there is no ``val/``.
        test_fraction: share of ``train`` held out for ``test`` when there is no ``test/``; 0: ``test``
            needs a ``test/`` folder.
        split_seed: seed of these splits alone.
        num_workers: processes that decode images (the cache build, or streaming).
        cache: decode every image once into a uint8 memmap; ``False``: DataLoader workers decode each file
            every epoch; ``None`` caches unless it would take more than 90% of the free disk space.
        cache_dir: where cache files live; each is keyed by the files and settings.
        mean: per-channel mean in [0, 1]; computed from the training split when not given.
        std: per-channel standard deviation, likewise.
        skip_invalid: leave out unreadable files (named in a warning) instead of stopping with an error
            that names them; a class left with none is an error.
        predict_path: a folder (searched recursively) or a list of image files for ``predict``.
        classes: the class names, in label order; by default the sorted folder names of ``root/train``,
            which must then be the same set (the CLI sets a checkpoint's).
        batch_size, crop_padding, hflip: for photos (32; random crops padded by 4 pixels, mirrored).
        **kwargs: every other option of ImageDataModule (crop_scale, the augmentation, folds...).
    """

    resize = "cover_center_crop"  # template.data.cache.decode

    def __init__(
        self,
        root: str | None = None,
        image_size: int | tuple[int, int] | None = None,
        resize_size: int | tuple[int, int] | None = None,
        interpolation: Literal["bilinear", "bicubic"] | None = None,
        channels: Literal["rgb", "grayscale"] = "rgb",
        val_fraction: float = FRACTION,
        test_fraction: float = FRACTION,
        split_seed: int = 0,
        num_workers: int = 2,
        cache: bool | None = None,
        cache_dir: str = ".cache/images",
        mean: list[float] | None = None,
        std: list[float] | None = None,
        skip_invalid: bool = False,
        predict_path: str | list[str] | None = None,
        classes: list[str] | None = None,
        batch_size: int = 32,
        crop_padding: int = 4,
        hflip: Flip = True,
        **kwargs,
    ) -> None:
        super().__init__(
            batch_size=batch_size, num_workers=num_workers, crop_padding=crop_padding, hflip=hflip, **kwargs
        )
        self.save_hyperparameters()
        if not 0 <= test_fraction < 1:
            raise ValueError(f"data.test_fraction={test_fraction} must be at least 0 and below 1")
        self.root = Path(root) if root else None
        self.image_size = DEFAULT_IMAGE_SIZE if image_size is None else image_size
        self.mode = "RGB" if channels == "rgb" else "L"
        self.interpolation = interpolation or "bilinear"
        self.in_channels = 3 if channels == "rgb" else 1
        self._resize_size = resize_pair(resize_size, self.image_size, 1.0 if self.crop_scale is None else RESIZE_MARGIN)
        self.cache = cache
        self.cache_dir = Path(cache_dir)
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.split_seed, self.skip_invalid = split_seed, skip_invalid
        if (mean is None) != (std is None):  # one alone would be dropped for both computed
            raise ValueError(f"data.mean={mean} and data.std={std}: give both (of pixels in [0, 1]), or neither")
        self.given_stats = (mean, std) if mean is not None else None
        self.predict_path = predict_path
        self.folders = self._scan(classes)
        self._sources: dict[str, tuple[list[Path], np.ndarray, np.ndarray, np.ndarray | None]] = {}
        self.split_files: dict[str, list[Path]] = {}
        self.drawn: dict[str, str] = {}  # split -> digest of its files, where splits are drawn from train/
        self.class_names = list(classes) if classes else sorted(self.folders["train"])
        self.num_classes = len(self.class_names)

    @property
    def resize_size(self) -> tuple[int, int]:
        return self._resize_size

    @property
    def has_test(self) -> bool:
        return "test" in self.folders or self.test_fraction > 0

    def _scan(self, classes: list[str] | None) -> dict[str, dict[str, list[Path]]]:
        """Check the layout before anything is decoded, naming every problem; no train/ needs given classes."""
        if classes is not None and (len(set(classes)) != len(classes) or len(classes) < 2):
            raise ValueError(f"data classes must be at least two different names, not {classes}")
        if self.root is None:  # a trained model's classes alone: predict_path's images, or nothing
            if classes is None:
                raise ValueError("data.root is not set: give --data.root DIR, the folder that holds train/<class>/")
            return {}
        train = self.root / "train"
        if not train.is_dir() and classes is None:
            raise FileNotFoundError(f"no train/ folder in {described(self.root)}: expected train/<class>/<image files>")
        folders = {
            split: {path.name: list_files(path) for path in visible(self.root / split, False) if path.is_dir()}
            for split in ("train", "val", "test")
            if (self.root / split).is_dir()
        }
        if "train" in folders:
            if not folders["train"]:
                raise ValueError(f"{train} has no class folders: expected {train}/<class>/<image files>")
            if len(folders["train"]) == 1:  # else it fails later, deep in the metrics
                name = next(iter(folders["train"]))
                raise ValueError(f"{train} has only one class folder ({name}): a classifier needs at least two")
            if classes is not None and set(classes) != set(folders["train"]):
                raise ValueError(
                    f"data.classes {sorted(classes)} (given, or those a --ckpt_path checkpoint was trained on) are not "
                    f"the class folders of {train}: {sorted(folders['train'])}; to learn other classes, train a new "
                    "run (from its weights: --weights_file, which replaces the head)"
                )
        problems = []  # every problem of the layout, then of the files, said in one message: one round of fixes
        empty = [str(self.root / split / name) for split, found in folders.items() for name in found if not found[name]]
        if empty:
            problems.append(describe(empty, "empty class folder(s); remove them or add images"))
        known, lacking = (set(folders["train"]), "train/") if "train" in folders else (set(classes), "data.classes")
        if odd := sorted(repr(name) for found in folders.values() for name in found if has_controls(name)):
            problems.append(
                f"class folder name(s) with a control character or line break: {', '.join(odd)}; rename them"
            )
        # valid/, Test/ (Roboflow's, Kaggle's): unread, the split drawn from train/ in their place, unsaid.
        listed = self.root.iterdir() if self.root.is_dir() else []
        others = [path.name for path in listed if path.is_dir() and path.name not in ("val", "test")]
        if odd := sorted(name for name in others if name != "train" and name.lower() in SPLIT_ALIASES):
            problems.append(f"split folder(s) {', '.join(odd)}: only train/, val/ and test/ are read; rename them")
        for split in [split for split in ("val", "test") if folders.get(split) == {}]:  # else: no val/acc, no test
            problems.append(
                f"{self.root / split} has no class folders: expected {split}/<class>/<image files> as in train/, or "
                f"remove it to draw the {split} split from train/ (data.{split}_fraction)"
            )
        for split in ("val", "test"):
            if unknown := sorted(set(folders.get(split, {})) - known):
                problems.append(
                    f"{split}/ has class folder(s) that {lacking} lacks: {', '.join(unknown)}; add or remove them"
                )
        if problems:
            raise ValueError(self._with_unreadable(problems, folders))
        for split in [split for split in ("val", "test") if split in folders]:  # a folder: not drawn, nor stratified
            fraction = getattr(self, f"{split}_fraction")
            if absent := sorted(known - set(folders[split])):
                rank_zero_warn(
                    describe(
                        absent,
                        f"class(es) without a folder in {shown(self.root / split, False)}, left out of {split}/acc",
                    )
                )
            if fraction not in (0, FRACTION):
                rank_zero_warn(
                    f"data.{split}_fraction={fraction} is not used: {shown(self.root / split, False)} is the split"
                )
        return folders

    def _with_unreadable(self, problems: list[str], folders: dict, checked: str | None = None) -> str:
        """``problems`` and every split's unreadable files (but ``checked``'s) as one message: one round of fixes."""
        for split in [split for split in folders if split != checked and not self.skip_invalid]:
            files = [path for paths in folders[split].values() for path in paths]
            if invalid := load_or_check(files, self.mode, self.cache_dir, self.num_workers, split):
                problems.append(describe(named(files, invalid), f"unreadable file(s) in {self.root / split}"))
        return (
            problems[0] if len(problems) == 1 else f"{len(problems)} problems in {self.root}:\n" + "\n".join(problems)
        )

    def _decode(self, split: str, files: list[Path]) -> tuple[np.ndarray | None, dict[int, str]]:
        """The cached images of one source folder (None: streamed) and its unreadable files."""
        if self.cache is not False:
            try:
                return load_or_build(
                    files, self.resize_size, self.mode, self.cache_dir, self.num_workers, split, self.interpolation
                )
            except CacheUnavailable as unavailable:
                if self.cache:
                    where = "free some space, set data.cache_dir to a disk with room"
                    where = where if isinstance(unavailable, CacheTooLarge) else "set XDG_CACHE_HOME (its key)"
                    message = f"{unavailable}; data.cache is true: {where}, or data.cache to null or false"
                    raise type(unavailable)(message) from None
                rank_zero_warn(f"{unavailable}, so {split} streams from the files instead (decoded every epoch)")
        return None, load_or_check(files, self.mode, self.cache_dir, self.num_workers, split)

    def _source(self, split: str) -> tuple[list[Path], np.ndarray, np.ndarray, np.ndarray | None]:
        """Files, labels, the indices of the readable ones and the cached images (or None), of a source folder."""
        if split in self._sources:
            return self._sources[split]
        files, labels = self._files(split)
        images, invalid = self._decode(split, files)
        keep = np.array([index for index in range(len(files)) if index not in invalid], dtype=np.int64)
        if invalid and not self.skip_invalid:
            where = self.root / split if split != "predict" else "data.predict_path"
            problems = [describe(named(files, invalid), f"unreadable file(s) in {where}")]
            raise ValueError(
                self._with_unreadable(problems, self.folders if split != "predict" else {}, checked=split)
                + "\nRemove or replace them, or set data.skip_invalid: true to leave them out."
            )
        if invalid:
            rank_zero_warn(describe(named(files, invalid), f"unreadable file(s) left out of {split} (skip_invalid)"))
            kept = set(labels[keep].tolist())
            if lost := [name for name in self.folders.get(split, {}) if self.class_names.index(name) not in kept]:
                where = [f"{name} ({self.root / split / name})" for name in lost]
                what = f"class(es) in {split}/ with no readable image left (skip_invalid)"
                raise ValueError(
                    describe(where, f"{what}; replace their files, or remove the folder to drop the class")
                )
        self._sources[split] = (files, labels, keep, images)
        return self._sources[split]

    def _files(self, split: str) -> tuple[list[Path], np.ndarray]:
        if split == "predict":
            if self.predict_path is None:
                raise ValueError("predict needs images: set data.init_args.predict_path to a folder or a list of files")
            files = []
            for path in map(Path, [self.predict_path] if isinstance(self.predict_path, str) else self.predict_path):
                if not path.is_dir() and not path.is_file():
                    raise FileNotFoundError(
                        f"data.predict_path: {path} does not exist; set it to a folder or image files"
                    )
                if not (found := list_files(path) if path.is_dir() else [path]):
                    raise ValueError(f"data.predict_path: {path} holds no files; point it at a folder of images")
                files += found
            check_text_names(files, "data.predict_path")
            return files, np.full(len(files), -1, dtype=np.int64)  # no labels: -1
        if self.root is None:
            raise FileNotFoundError(  # a split drawn from train/ asks for train's: the folder is the answer
                "no images to read: give --data.root DIR, the folder that holds train/<class>/ (val/, test/ if any)"
            )
        if split not in self.folders:
            # A trained run's share of train/ is its training's: a test share of it is held out only by a new fit.
            fit = ", or run validate (a new fit with data.test_fraction above 0 holds out a share of train/)"
            raise FileNotFoundError(
                f"no {split}/ folder in {described(self.root)}: add {split}/<class>/<image files>"
                + f" of images the model never trained on{fit}" * (split == "test")
            )
        classes = self.folders[split]
        files = [path for name in sorted(classes) for path in classes[name]]
        labels = [self.class_names.index(name) for name in sorted(classes) for _ in classes[name]]
        return files, np.array(labels, dtype=np.int64)

    def load_split(self, split: str) -> Split:
        """uint8 images (cached path) or None (streaming), and labels; records the files used."""
        held_out = {"val": self.val_fraction} if "val" not in self.folders else {}
        if "test" not in self.folders and self.test_fraction > 0:
            held_out["test"] = self.test_fraction
        source = "train" if split in held_out else split
        files, labels, keep, cached = self._source(source)
        if source == "train" and held_out:  # one stratified split of train/, whichever part is asked for
            parts = split_named(labels[keep], held_out, self.split_seed, self.class_names)
            names = [str(files[index].relative_to(self.root)) for index in keep]
            for name, part in parts.items():
                self.drawn[name] = hashlib.sha256("\n".join(sorted(names[i] for i in part)).encode()).hexdigest()
            keep = keep[parts[split]]
        self.split_files[split] = [files[index] for index in keep]
        if split == "predict":
            self.predict_ids = [str(path) for path in self.split_files[split]]
        images = torch.from_numpy(np.asarray(cached[keep])) if cached is not None else None
        return images, torch.from_numpy(labels[keep])

    def state_dict(self) -> dict:
        """The base's, and which files the splits drawn from train/ held (digests) and the options that drew them:
        evaluated later, they must hold the same, and a refusal names the options changed."""
        drawn_by = {name: getattr(self, name) for name in DRAWN_BY}
        return super().state_dict() | ({"drawn_splits": dict(self.drawn), "drawn_by": drawn_by} if self.drawn else {})

    def load_state_dict(self, state: dict) -> None:
        """Refuse to score held-out images the checkpoint's run may have trained on (splits drawn again from a train/
        changed since, or with another split_seed or fraction); resumed, warn."""
        super().load_state_dict(state)
        recorded = state.get("drawn_splits") if isinstance(state.get("drawn_splits"), dict) else {}
        moved = [
            split for split, digest in self.drawn.items() if split != "train" and recorded.get(split, digest) != digest
        ]
        if moved:
            drawn_by = state.get("drawn_by") if isinstance(state.get("drawn_by"), dict) else {}  # none: older runs
            cause = "; ".join(
                f"data.{name} {drawn_by[name]!r} in its run, {getattr(self, name)!r} now"
                for name in DRAWN_BY
                if name in drawn_by and drawn_by[name] != getattr(self, name)
            )
            unknown = "" if drawn_by else ", or another split_seed, val_fraction or test_fraction"
            cause = cause or f"images added, removed or renamed since{unknown}"
            why = (
                f"the {' and '.join(moved)} images drawn from {self.root}/train are not the ones the checkpoint's run "
                f"held out ({cause}), so they mix with images it trained on; use the files and options it was trained "
                "with, or keep held-out images in val/ and test/ folders"
            )
            stage = self.trainer.state.fn if self.trainer is not None else None
            if {"validate": "val", "test": "test"}.get(stage) in moved:  # the split it scores
                raise ValueError(f"{why}: its scores would count images it has seen")
            rank_zero_warn(why)

    def make_dataset(self, split: str) -> Dataset:
        images, labels = self.load_split(split)
        if images is not None:
            return TensorImageDataset(images, labels)
        return FileDataset(self.split_files[split], labels, self.resize_size, self.mode, self.interpolation)

    def loader_workers(self, dataset: Dataset) -> int:
        # Indexing a memmap is a copy; worker processes would only add another (and IPC).
        return 0 if isinstance(dataset, TensorImageDataset) else self.num_workers

    def normalization(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.given_stats is not None:
            return self.given_stats
        if isinstance(self.datasets["train"], TensorImageDataset):
            return super().normalization()
        # Streaming: from an even sample of up to 2,000 training images (this fold's, with folds), as stored.
        dataset = self.datasets["train"]
        return channel_stats(dataset.__getitems__(list(range(0, len(dataset), max(1, len(dataset) // 2000))))[0])
