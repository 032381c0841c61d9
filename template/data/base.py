"""What every image source shares: stratified splits, loaders of whole uint8 batches, the device-side batch hook."""

import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from numbers import Integral
from typing import Literal

import lightning as L
import numpy as np
import torch
from jsonargparse import ArgumentParser, Namespace
from lightning.pytorch.utilities import rank_zero_warn
from sklearn.model_selection import StratifiedKFold, train_test_split
from torch.utils.data import DataLoader, Dataset

from template.compat import at_last_batch
from template.data.augment import (  # one name a line: a renamed project's longer package name fits
    POLICIES,
    RATIO,
    Flip,
    Policy,
    augment,
    center_crop,
    channel_stats,
    mix,
    normalize,
    random_erasing,
)
from template.data.loaders import EvaluationSampler, ResumableSampler, Split, TensorImageDataset, join, keep_batch
from template.data.preprocessing import check_preprocessing


def stratified_split(
    labels: np.ndarray, fractions: Sequence[float], seed: int, names: Sequence[str] = (), classes: Sequence[str] = ()
) -> list[np.ndarray]:
    """Indices of len(fractions) + 1 disjoint parts keeping the class proportions (a random split may leave a class out
    of val): the remainder, then one per fraction. ``names`` (the options) and ``classes`` (the labels') name errors."""
    if sum(fractions) >= 1.0 or min(fractions, default=0.0) <= 0.0:
        given = ", ".join(f"data.{name}={fraction}" for name, fraction in zip(names, fractions))
        raise ValueError(f"{given or f'split fractions {list(fractions)}'}: each must be above 0, all below 1 together")
    found, counts = np.unique(labels, return_counts=True)
    named = [repr(classes[label]) if 0 <= label < len(classes) else str(label) for label in found]
    if (least := round(min(fractions) * len(labels))) < len(found):
        raise ValueError(
            f"a split of {min(fractions)} of {len(labels)} images holds {least}, fewer than the {len(found)} "
            "classes it must each contain; raise the fraction or add images"
        )
    if counts.min() < 2:  # what a stratified split needs at the least
        raise ValueError(
            f"class {named[counts.argmin()]} has {counts.min()} image: a split that keeps every class needs at "
            "least 2 of each; add images of it, or leave it out"
        )
    remaining = np.arange(len(labels))
    parts = []
    share = 1.0
    for fraction in fractions:
        remaining, part = train_test_split(
            remaining, test_size=fraction / share, stratify=labels[remaining], random_state=seed
        )
        parts.append(np.sort(part))
        share -= fraction
    said = [f"data.{name}" for name in names] or [f"{fraction} of the images" for fraction in fractions]
    for name, part in zip(said, parts):
        if missing := [each for label, each in zip(found, named) if label not in labels[part]]:
            rank_zero_warn(
                f"the split of {name} holds no image of class {', '.join(missing)} (too few images): its accuracy "
                "leaves the class out; add images of it, or raise the fraction"
            )
    return [np.sort(remaining), *parts]


def split_named(labels: np.ndarray, fractions: dict[str, float], seed: int, classes=()) -> dict[str, np.ndarray]:
    """``stratified_split`` by name: {"train": the remainder, and each split of ``fractions`` ({split: share})}."""
    names = [f"{split}_fraction" for split in fractions]
    return dict(zip(["train", *fractions], stratified_split(labels, list(fractions.values()), seed, names, classes)))


def image_size_pair(size: int | Sequence[int]) -> tuple[int, int]:
    """``size`` as (height, width): one int is a square's side."""
    pair = (size, size) if isinstance(size, Integral) else size
    if (
        isinstance(pair, str | bytes)
        or not isinstance(pair, Sequence)
        or len(pair) != 2
        or not all(isinstance(side, Integral) and not isinstance(side, bool) and side > 0 for side in pair)
    ):
        raise ValueError(f"image_size must be a positive int (a square's side) or (height, width), not {size!r}")
    return int(pair[0]), int(pair[1])


def checked_split(data: "ImageDataModule", split: str, loaded: object) -> Split:
    """``load_split``'s images and labels as the recipe takes them (int32 labels made int64), or an error naming
    what they are and the fix: each mistake trained silently wrong or failed steps later, naming no load_split."""
    where = f"{type(data).__name__}.load_split({split!r})"
    if not isinstance(loaded, tuple | list) or len(loaded) != 2:
        count = f" of {len(loaded)}" if isinstance(loaded, tuple | list) else ""
        raise ValueError(f"{where} returned a {type(loaded).__name__}{count}: it returns two, (images, labels)")
    for name, value in zip(("images", "labels"), loaded):
        if not isinstance(value, torch.Tensor):
            fix = f"torch.from_numpy({name})" if isinstance(value, np.ndarray) else "torch.as_tensor"
            raise ValueError(f"{where} gave {name} as {type(value).__name__}, not a torch.Tensor ({fix})")
    images, labels = loaded
    if images.dtype != torch.uint8 or images.ndim != 4:  # floats would be normalised as if 0-255: silently wrong
        raise ValueError(
            f"{where} gave images of {images.dtype}, shape {tuple(images.shape)}: it returns uint8 images (N, C, H, W) "
            "of 0-255 (floats in [0, 1]: (images * 255).round().to(torch.uint8))"
        )
    if images.shape[1] != data.in_channels:
        last = " (channels last: images.permute(0, 3, 1, 2))" if images.shape[3] == data.in_channels else ""
        shape, channels = tuple(images.shape), data.in_channels
        raise ValueError(f"{where} gave images of shape {shape}: (N, C, H, W) of C = in_channels = {channels}{last}")
    if split == "predict":  # its labels are not used (-1 will do)
        return images, labels
    if labels.ndim != 1 or labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(
            f"{where} gave labels of {labels.dtype}, shape {tuple(labels.shape)}: it returns class indices (N,) of "
            "int64 (one-hot or class probabilities (N, K): labels.argmax(1))"
        )
    if len(labels) and not 0 <= labels.min() <= labels.max() < data.num_classes:
        raise ValueError(
            f"{where} gave labels {int(labels.min())} to {int(labels.max())}: class indices run from 0 to "
            f"num_classes - 1 = {data.num_classes - 1} (from 1: labels - 1)"
        )
    return images, labels.long()


class ImageDataModule(L.LightningDataModule, ABC):
    """Base of the image sources: splits, loaders, and device-side augmentation.

    Subclasses set ``num_classes``, ``in_channels``, ``image_size`` (a side, or (H, W)) and ``class_names`` in
    ``__init__`` (the CLI links them into the model) and implement ``load_split``. Batches reach the device as uint8
    at ``resize_size``, augmented there (``template.data.augment``, all off by default) or centre-cropped to evaluate.
    The normalisation and resize (``preprocessing``) travel in every checkpoint: a model is evaluated as trained.

    Args:
        batch_size: images per batch on each device.
        global_batch_size: images per optimizer step across all devices, each batch of a device getting
            ``global_batch_size / (world_size x accumulate_grad_batches)`` (batch_size is ignored): the same recipe on
            any number of GPUs. ``batch_size``: the run's batch_size is that global batch
            (``configs/trainer/ddp.yaml``); None: batch_size on each device, each step taking accumulated batches.
        num_workers: DataLoader worker processes; 0 loads in the main process.
        crop_padding: pixels of reflect padding for the random crop; 0: off.
        crop_scale: a random-resized crop instead (torchvision's RandomResizedCrop): the range of its share
            of the stored image's area, e.g. [0.08, 1]; ``None``: off. Needs crop_padding 0.
        crop_ratio: the range of its aspect ratio (width / height), drawn log-uniformly.
        hflip: mirror training images at random (not for digits or text); ``alternate``: each image on
            alternate epochs, its first at random (airbench's derandomised flip).
        policy: a random operation per image after crop and mirror: ``trivialaugment`` (TrivialAugmentWide)
            or ``randaugment`` (RandAugment, 2 operations of magnitude 9); ``None``: none.
        random_erasing: probability of erasing a random rectangle of each normalised image; 0: off.
        mixup_alpha: MixUp's Beta(alpha, alpha); 0: off. Labels become probabilities (B, K) in training.
        cutmix_alpha: CutMix's, likewise; with both on, each batch takes one of the two.
        folds: k-fold cross-validation (``template cv``): train and val pooled and cut into this many
            stratified folds, seeded by ``split_seed``; ``None``: the source's own split. Test is never pooled.
        fold: which of the folds validates (0 to folds - 1); the others train.
    """

    num_classes: int
    in_channels: int
    class_names: list[str]
    resize: str = "none"  # how an image file reaches image_size: a key of preprocessing.RESIZE
    interpolation: str = "bilinear"  # of that resize (preprocessing.INTERPOLATIONS)
    has_test: bool = True  # whether `test` has a split; a source with none sets it False (in __init__ too)

    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int = 0,
        crop_padding: int = 0,
        hflip: Flip = False,
        global_batch_size: int | Literal["batch_size"] | None = None,
        crop_scale: tuple[float, float] | None = None,
        crop_ratio: tuple[float, float] = RATIO,
        policy: Policy | None = None,
        random_erasing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        folds: int | None = None,
        fold: int = 0,
    ) -> None:
        super().__init__()
        counted = global_batch_size in (None, "batch_size") or isinstance(global_batch_size, int)
        if batch_size < 1 or not counted or isinstance(global_batch_size, int) and global_batch_size < 1:
            raise ValueError(f"batch sizes must be at least 1, got {batch_size} and {global_batch_size}")
        if crop_scale is not None and not 0 < crop_scale[0] <= crop_scale[1] <= 1:
            raise ValueError(f"crop_scale={list(crop_scale)} must be a range within (0, 1], e.g. [0.08, 1]")
        if not 0 < crop_ratio[0] <= crop_ratio[1]:
            raise ValueError(f"crop_ratio={list(crop_ratio)} must be a positive range, e.g. [0.75, 1.333]")
        if crop_scale is not None and crop_padding:
            raise ValueError(
                f"crop_scale={list(crop_scale)} and crop_padding={crop_padding} both crop: set crop_padding to 0"
            )
        if hflip not in (True, False, "alternate"):
            raise ValueError(f"hflip={hflip!r} must be true, false or 'alternate' (each image on alternate epochs)")
        if policy is not None and policy not in POLICIES:
            raise ValueError(f"policy={policy!r} is not one of {sorted(POLICIES)} (or null for none)")
        if not 0 <= random_erasing <= 1 or mixup_alpha < 0 or cutmix_alpha < 0:
            raise ValueError(
                f"random_erasing={random_erasing} must be a probability in [0, 1], and mixup_alpha={mixup_alpha} "
                f"and cutmix_alpha={cutmix_alpha} at least 0 (0: off; 0.2 to 1 are usual)"
            )
        if folds is not None and not (folds >= 2 and 0 <= fold < folds):
            raise ValueError(f"data folds={folds}, fold={fold}: folds must be at least 2 and fold from 0 to folds - 1")
        self.folds, self.fold = folds, fold
        self.fold_indices: dict[str, np.ndarray] = {}  # with folds: positions in train + val pooled
        self.batch_size = batch_size
        self.global_batch_size = global_batch_size
        self.num_workers = num_workers
        self.crop_padding = crop_padding
        self.crop_scale = None if crop_scale is None else tuple(crop_scale)
        self.crop_ratio = tuple(crop_ratio)
        self.hflip = hflip
        self.policy = policy
        self.random_erasing = random_erasing
        self.mixup_alpha = mixup_alpha
        self.cutmix_alpha = cutmix_alpha
        self.datasets: dict[str, Dataset] = {}  # TensorImageDataset, or FileDataset when streaming
        self.train_sampler: ResumableSampler | None = None
        self._resume_state: dict | None = None
        self.mean = torch.zeros(0)
        self.std = torch.ones(0)

    @property
    def image_size(self) -> tuple[int, int]:
        """(height, width) of the images the model gets; set it to a side or to (height, width)."""
        if not hasattr(self, "_image_size"):
            raise AttributeError(f"{type(self).__name__} sets no image_size: set it in __init__, to a side or (H, W)")
        return self._image_size

    @image_size.setter
    def image_size(self, size: int | Sequence[int]) -> None:
        self._image_size = image_size_pair(size)

    @property
    def resize_size(self) -> tuple[int, int]:
        """(height, width) of the images a source stores: ``image_size``, or more for random-resized crops."""
        return self.image_size

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.in_channels, *self.image_size)

    @abstractmethod
    def load_split(self, split: str) -> Split:
        """Return uint8 images (N, C, H, W) and int64 labels of ``split`` (train, val, test or predict)."""

    def make_dataset(self, split: str) -> Dataset:
        """The dataset of one split; by default the in-memory uint8 images of ``load_split``, checked."""
        return TensorImageDataset(*checked_split(self, split, self.load_split(split)))

    def loader_workers(self, dataset: Dataset) -> int:
        return self.num_workers

    def normalization(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean and std in [0, 1], from the training split only."""
        return channel_stats(self.datasets["train"].images)

    def setup(self, stage: str) -> None:
        if not 0 <= self.crop_padding < min(self.image_size):  # reflect padding mirrors pixels inside the image
            raise ValueError(
                f"crop_padding={self.crop_padding} must be at least 0 and below the image side {min(self.image_size)}"
            )
        # Only what the stage needs: the test split is loaded by `test` alone, so fit never looks at it.
        needed = {"fit": ["train", "val"], "validate": ["val"], "test": ["test"], "predict": ["predict"]}[stage]
        if self.folds is not None and stage in ("fit", "validate") and not self.fold_indices:
            self._cut_folds()
        for split in needed:
            if split not in self.datasets:
                self.datasets[split] = self.make_dataset(split)
                if split in ("val", "test"):
                    self._in_turns(split)
        if stage == "fit" and len(self.mean) == 0:  # evaluating, the checkpoint's (load_state_dict, after setup)
            self._compute_normalization()

    def _cut_folds(self) -> None:
        """Train and val of this fold: one stratified, seeded k-fold cut of the two splits pooled."""
        pooled = join(self.make_dataset("train"), self.make_dataset("val"))
        labels = pooled.labels.numpy()
        counts = np.bincount(labels, minlength=self.num_classes)
        if counts.min() < self.folds:  # a fold without some class would validate nothing of it
            raise ValueError(
                f"data folds={self.folds}: class {self.class_names[counts.argmin()]!r} has {counts.min()} training and "
                f"validation images, fewer than the folds, each of which needs one; use at most {counts.min()} folds"
            )
        seed = getattr(self, "split_seed", 0)  # the sources' seed of their splits, when they have one
        cuts = StratifiedKFold(self.folds, shuffle=True, random_state=seed).split(np.zeros(len(labels)), labels)
        train, val = list(cuts)[self.fold]
        self.fold_indices = {"train": train, "val": val}
        self.datasets["train"], self.datasets["val"] = pooled.subset(train), pooled.subset(val)
        self._in_turns("val")

    def _in_turns(self, split: str) -> None:
        """The split's classes taking turns (one image of each, then a second...): any prefix of it is balanced."""
        labels = np.asarray(self.datasets[split].labels)
        turn = np.zeros(len(labels), dtype=np.int64)
        for label in np.unique(labels):
            turn[labels == label] = np.arange((labels == label).sum())
        order = np.lexsort((labels, turn))
        self.datasets[split] = self.datasets[split].subset(order)
        if self.folds is None and split in getattr(self, "split_files", {}):  # a fold's val is a pooled cut, unnamed
            self.split_files[split] = [self.split_files[split][index] for index in order]

    def _compute_normalization(self) -> None:
        if "train" not in self.datasets:
            self.datasets["train"] = self.make_dataset("train")
        self.mean, self.std = (torch.as_tensor(stat, dtype=torch.float32) for stat in self.normalization())
        if not (self.mean.isfinite().all() and self.std.isfinite().all()):
            raise ValueError(f"the training images hold NaN or infinite pixels: their mean is {self.mean.tolist()}")
        # As a checkpoint's record is checked when read: statistics of 0-255 pixels refused now, not after training.
        check_preprocessing(self.preprocessing(), f"{type(self).__name__}'s normalization (data.mean, data.std)")

    def preprocessing(self) -> dict:
        """How an image becomes the model's input (``template.data.preprocessing``)."""
        if len(self.mean) == 0:
            self._compute_normalization()
        return {
            "input_shape": list(self.input_shape),
            "resize": self.resize,
            "resize_size": list(self.resize_size),
            "interpolation": self.interpolation,
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
        }

    def use_preprocessing(self, record: dict, source: str = "the checkpoint") -> None:
        """Normalise as a trained model expects; another input shape, resize or given mean and std is an error."""
        record = check_preprocessing(record, source)
        if record["input_shape"] != list(self.input_shape):
            raise ValueError(
                f"{source} was trained on inputs (channels, height, width) {record['input_shape']}, but this data "
                f"gives {list(self.input_shape)}: set the data's image size and channels to the trained ones"
            )
        if record["resize_size"] != list(self.resize_size):  # the centre crop would frame images otherwise
            raise ValueError(
                f"{source} was trained on images resized to cover {record['resize_size']} (height, width) before "
                f"the centre crop, but this data resizes them to {list(self.resize_size)}: set data.resize_size to "
                f"{record['resize_size']} (or leave it out, to take the trained run's)"
            )
        if record["interpolation"] != self.interpolation:
            raise ValueError(
                f"{source} was trained on images resized {record['interpolation']}, but this data resizes them "
                f"{self.interpolation}: set data.interpolation to {record['interpolation']} (or leave it out)"
            )
        for key in ("mean", "std"):  # given ones (data.mean, data.std) are in config.yaml: they must be the ones used
            given, trained = self.hparams.get(key), torch.tensor(record[key])
            if given is not None and not torch.equal(torch.tensor(given, dtype=torch.float32), trained):
                raise ValueError(
                    f"{source} was trained on images normalised with {key} {[float(f'{v:.7g}') for v in trained]}, "
                    f"but data.{key} is {given}: leave data.mean and data.std out (or set them to the trained ones)"
                )
        self.mean, self.std = torch.tensor(record["mean"]), torch.tensor(record["std"])

    def device_batch_size(self, world_size: int, accumulate: int = 1) -> int:
        """Images per batch on each device: batch_size, or the global batch of an optimizer step shared out over the
        processes and the ``accumulate`` batches a step gathers (accumulate_grad_batches)."""
        if self.global_batch_size is None:
            return self.batch_size
        name, total = self.global_option()
        if total % (shares := world_size * accumulate):
            accumulated = f" x {accumulate} accumulated batches" if accumulate > 1 else ""
            raise ValueError(
                f"{name}={total} does not divide by the {world_size} processes (devices x nodes){accumulated}; use a "
                f"multiple of {shares}, e.g. {(total // shares + 1) * shares}"
            )
        return total // shares

    def global_option(self) -> tuple[str, int]:
        """The option that gives the global batch, and its size."""
        shared = self.global_batch_size == "batch_size"
        return ("batch_size", self.batch_size) if shared else ("global_batch_size", self.global_batch_size)

    def _loader(self, split: str, train: bool) -> DataLoader:
        dataset = self.datasets[split]
        world_size = self.trainer.world_size if self.trainer is not None else 1
        batch_size = self.device_batch_size(world_size, getattr(self.trainer, "accumulate_grad_batches", 1))
        # Train only: drop a last batch under half a batch (a noisy step, poor BatchNorm statistics; reshuffled each
        # epoch), keep a longer one (on a small set, a large share). Ranks have equal shares: equal step counts.
        full_batches, rest = divmod(len(dataset) // world_size, batch_size)
        drop_last = rest < batch_size / 2
        if train and full_batches == 0 and drop_last:
            option, size = self.global_option() if self.global_batch_size is not None else ("batch_size", batch_size)
            shared = f" over {world_size} device(s), {batch_size} each" if self.global_batch_size is not None else ""
            raise ValueError(
                f"the {split} split has {len(dataset)} images for {world_size} device(s), under half a batch each "
                f"(data.{option}={size}{shared}): there would be no training batch; lower data.{option}"
            )
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        rank = self.trainer.global_rank if self.trainer is not None else 0
        if not train and 0 < len(dataset) < world_size:  # a rank without a batch skips the metrics' collectives: a hang
            raise ValueError(
                f"the {split} split has {len(dataset)} images for {world_size} processes, which each score one at least: "
                f"add images, or {split} on fewer devices (--trainer.devices {len(dataset)})"
            )
        sampler = EvaluationSampler(dataset, world_size, rank) if world_size > 1 and not train else None
        if train:
            sampler = self.train_sampler = ResumableSampler(dataset, num_replicas=world_size, rank=rank, seed=seed)
            if self._resume_state:  # restored from a checkpoint before this loader existed
                if self._resume_state["samples_consumed"] > len(sampler):
                    raise ValueError(
                        f"the checkpoint's train_sampler state is past the epoch's {len(sampler)} samples "
                        f"({self._resume_state}): it was saved with other data or is damaged"
                    )
                sampler.set_epoch(self._resume_state["epoch"])
                sampler.skip = sampler.consumed = self._resume_state["samples_consumed"]
                self._resume_state = None
        workers = self.loader_workers(dataset)
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=train and drop_last,
            # Its own generator (the sampler's in training) keeps the global random stream untouched.
            generator=sampler.loader_generator if train else torch.Generator().manual_seed(seed),
            num_workers=workers,
            collate_fn=keep_batch,  # the datasets hand out whole batches (__getitems__)
            pin_memory=self.trainer is not None and self.trainer.strategy.root_device.type == "cuda",
            persistent_workers=workers > 0,
        )

    def state_dict(self) -> dict:
        """Saved in every checkpoint: the preprocessing, and where the training order stands (mid-epoch resume)."""
        state = {"preprocessing": self.preprocessing()} if len(self.mean) else {}
        if (sampler := self.train_sampler) is not None:
            # At an epoch's end, the next's start: a resumed run's loader draws its order before Lightning sets it.
            ended = sampler.consumed > 0 and self.trainer is not None and at_last_batch(self.trainer, validating=False)
            state["train_sampler"] = {
                "epoch": sampler.epoch + ended,
                "samples_consumed": 0 if ended else sampler.consumed,
            }
        return state

    def load_state_dict(self, state: dict) -> None:
        resume = state.get("train_sampler")
        if resume is not None and not (
            isinstance(resume, dict)
            and all(type(resume.get(key)) is int and resume[key] >= 0 for key in ("epoch", "samples_consumed"))
        ):
            raise ValueError(
                f"the checkpoint's train_sampler state {str(resume)[:200]} is damaged: it needs "
                "epoch and samples_consumed, whole numbers from 0"
            )
        self._resume_state = resume
        if resume and type(self).train_dataloader is ImageDataModule.train_dataloader:  # its order: ResumableSampler's
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
        if "preprocessing" in state:
            self.use_preprocessing(state["preprocessing"])

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict", train=False)

    def on_after_batch_transfer(self, batch: Split | torch.Tensor, dataloader_idx: int) -> Split | torch.Tensor:
        # Made float32 here, after Lightning cast the (uint8) batch: a -true precision's dtype then.
        plugin = getattr(self.trainer, "precision_plugin", None)  # none: a trainer of your own making, or none
        as_trained = plugin.convert_input if plugin is not None else lambda x: x
        if isinstance(batch, torch.Tensor):
            return as_trained(batch)  # the model summary's example input, not a data batch
        images, labels = batch  # uint8 (B, C, H', W') at resize_size, on the training device
        if len(self.mean) == 0:  # evaluating without a checkpoint's statistics
            self._compute_normalization()
        training = self.trainer is not None and self.trainer.training
        if training:
            hflip = self.hflip  # "alternate" without the sampler (training order unknown): at random
            if self.train_sampler is not None:
                if hflip == "alternate":  # which images these are: their place in the epoch's order
                    hflip = self.train_sampler.alternating_flips(len(labels)).to(images.device)
                self.train_sampler.consumed += len(labels)  # a mid-epoch checkpoint resumes after it
            images = augment(
                images, self.crop_padding, hflip, self.policy, self.image_size, self.crop_scale, self.crop_ratio
            )
        else:
            images = center_crop(images, self.image_size)  # as torchvision's Resize + CenterCrop evaluate
        images = normalize(images, self.mean.to(images.device), self.std.to(images.device))
        if training:
            images = random_erasing(images, self.random_erasing)
            images, labels = mix(images, labels, self.num_classes, self.mixup_alpha, self.cutmix_alpha)
        return as_trained((images, labels))  # soft (mixed) labels too


def instantiate_data(config: Namespace) -> ImageDataModule:
    """The DataModule of a configuration's ``data`` section, as LightningCLI builds it, its class path in its
    hyper-parameters (checkpoints name it); a size the DataModule chose is written back into config.yaml."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(ImageDataModule, "data")
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # jsonargparse >= 4.49
    data = instantiate(parser.parse_object({"data": config.as_dict()})).data
    data.hparams["_class_path"] = config.class_path
    init_args = config.get("init_args") or Namespace()
    if "image_size" in init_args and init_args.image_size is None:
        height, width = data.image_size
        init_args.image_size = height if height == width else [height, width]
    return data
