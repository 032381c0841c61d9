"""What the DataLoaders read: datasets that hand out whole uint8 batches (B, C, H', W'), and the training order."""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler, TensorDataset

from template.data.cache import decode

Split = tuple[torch.Tensor, torch.Tensor]  # uint8 images (N, C, H, W), int64 labels (N,)


class TensorImageDataset(TensorDataset):
    """In-memory images and labels; ``__getitems__`` fetches a whole batch in one indexing op."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if len(images) != len(labels):  # TensorDataset's own check is an assert, without the counts
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        super().__init__(images, labels)
        self.images, self.labels = images, labels

    def __getitems__(self, indices: list[int]) -> Split:
        index = torch.as_tensor(indices)
        # index_select: one copy a row; images[index] gathers element by element, several times slower.
        return self.images.index_select(0, index), self.labels[index]

    def subset(self, index: np.ndarray) -> "TensorImageDataset":
        index = torch.as_tensor(index)
        return TensorImageDataset(self.images[index], self.labels[index])


class FileDataset(Dataset):
    """Image files decoded in DataLoader workers, each as the cache would hold it (``cache.decode``)."""

    def __init__(
        self, files: list[Path], labels: torch.Tensor, size: tuple[int, int], mode: str, interpolation="bilinear"
    ) -> None:
        if len(files) != len(labels):
            raise ValueError(f"{len(files)} files but {len(labels)} labels")
        self.files, self.labels, self.size, self.mode, self.interpolation = files, labels, size, mode, interpolation

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> Split:
        return torch.from_numpy(decode(self.files[index], self.size, self.mode, self.interpolation)), self.labels[index]

    def __getitems__(self, indices: list[int]) -> Split:
        images = torch.stack([self[index][0] for index in indices])  # (B, C, H, W) uint8
        return images, self.labels[torch.as_tensor(indices)]

    def subset(self, index: np.ndarray) -> "FileDataset":
        labels = self.labels[torch.as_tensor(index)]
        return FileDataset([self.files[i] for i in index], labels, self.size, self.mode, self.interpolation)


def join(first: Dataset, second: Dataset) -> TensorImageDataset | FileDataset:
    """The images of two datasets of the same kind as one (k-fold cross-validation pools train and val)."""
    if type(first) is not type(second) or not isinstance(first, TensorImageDataset | FileDataset):
        raise TypeError(
            f"k-fold cross-validation pools TensorImageDataset or FileDataset splits, not {type(first).__name__} "
            f"and {type(second).__name__}: return one of those from make_dataset, or leave data.folds unset"
        )
    labels = torch.cat([first.labels, second.labels])
    if isinstance(first, TensorImageDataset):
        return TensorImageDataset(torch.cat([first.images, second.images]), labels)
    return FileDataset(first.files + second.files, labels, first.size, first.mode, first.interpolation)


def keep_batch(batch: Split) -> Split:
    """collate_fn for datasets whose ``__getitems__`` already returns a stacked batch."""
    return batch


class EvaluationSampler(DistributedSampler):
    """A rank's share of an evaluation split, each image once: ranks take every ``num_replicas``-th from their own.
    The DistributedSampler Lightning gives evaluation repeats images to even the shares, scoring them twice."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        self.num_samples = len(range(rank, len(dataset), num_replicas))  # its __len__

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(self.dataset), self.num_replicas))


class ResumableSampler(DistributedSampler):
    """The training order: DistributedSampler's permutation of (seed, epoch). On a mid-epoch resume the first
    ``skip`` samples of this rank's share, already trained on, are left out until the next epoch."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.skip = 0
        self.consumed = 0  # samples of this epoch handed to training, counted by the DataModule
        self.order: list[int] = []  # this rank's dataset indices of the epoch, in training order
        self.coins: torch.Tensor | None = None  # each image's mirroring in even epochs (alternating_flips)
        # The workers' base seed: loading then never moves the global stream that augmentation draws from.
        self.loader_generator = torch.Generator().manual_seed(seed)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.skip = self.consumed = 0
        super().set_epoch(epoch)
        self.loader_generator.manual_seed(self.seed + epoch)

    def __iter__(self) -> Iterator[int]:
        # The skip holds for the whole resumed epoch: Lightning may create its iterator twice.
        self.order = list(super().__iter__())
        return iter(self.order[self.skip :])

    def alternating_flips(self, count: int) -> torch.Tensor:
        """Whether to mirror each of the next ``count`` training images: a coin per image drawn once from the
        seed, its opposite in odd epochs, so each is seen both ways (airbench's derandomised flip)."""
        if self.coins is None or len(self.coins) != len(self.dataset):
            generator = torch.Generator().manual_seed(self.seed)
            self.coins = torch.randint(0, 2, (len(self.dataset),), generator=generator).bool()
        index = torch.as_tensor(self.order[self.consumed : self.consumed + count], dtype=torch.long)
        return self.coins[index] ^ bool(self.epoch % 2)
