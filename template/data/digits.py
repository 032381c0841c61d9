"""The embedded default: scikit-learn's handwritten digits, 1,797 8x8 grey images.

The data ships inside scikit-learn, so the default run needs no network and no files.
"""

import numpy as np
import torch
from sklearn.datasets import load_digits

from template.data.augment import Policy
from template.data.base import ImageDataModule, Split, stratified_split


class DigitsDataModule(ImageDataModule):
    """Handwritten digits 0-9, split into train / val / test by class, with a fixed seed.

    Args:
        batch_size: images per batch on each device.
        global_batch_size: images per step over all devices; overrides batch_size (see ImageDataModule).
        val_fraction: share of all images held out for validation (checkpoint choice).
        test_fraction: share of all images held out for the final test.
        split_seed: seed of the split alone, so that changing the training seed never
            moves images between train, val and test.
        num_workers: DataLoader workers; 0 is fastest for data already in memory.
        crop_padding: random translation by up to this many pixels.
        hflip: off, since a mirrored digit is a different (or no) digit.
        policy, random_erasing, mixup_alpha, cutmix_alpha: the stronger augmentations, off by
            default (see ImageDataModule).
        folds, fold: k-fold cross-validation of train and val pooled (see ImageDataModule).
    """

    def __init__(
        self,
        batch_size: int = 64,
        global_batch_size: int | None = None,
        val_fraction: float = 0.15,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        num_workers: int = 0,
        crop_padding: int = 1,
        hflip: bool = False,
        policy: Policy | None = None,
        random_erasing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        folds: int | None = None,
        fold: int = 0,
    ) -> None:
        super().__init__(
            batch_size,
            num_workers,
            crop_padding,
            hflip,
            global_batch_size,
            policy=policy,
            random_erasing=random_erasing,
            mixup_alpha=mixup_alpha,
            cutmix_alpha=cutmix_alpha,
            folds=folds,
            fold=fold,
        )
        self.save_hyperparameters()
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.split_seed = split_seed
        self.num_classes = 10
        self.in_channels = 1
        self.image_size = (8, 8)
        self.class_names = [str(digit) for digit in range(10)]
        self.split_indices: dict[str, np.ndarray] = {}

    def load_split(self, split: str) -> Split:
        if not self.split_indices:  # read and split once; every split is a view of the same arrays
            digits = load_digits()
            # Pixel values are 0..16; scale to the 0..255 uint8 range every source uses.
            self._images = torch.from_numpy(np.round(digits.images * (255 / 16)).astype(np.uint8)[:, None])
            self._labels = torch.from_numpy(digits.target).long()  # images above: (N, 1, 8, 8)
            train, val, test = stratified_split(digits.target, [self.val_fraction, self.test_fraction], self.split_seed)
            self.split_indices = {"train": train, "val": val, "test": test}
            # predict serves the test split; name each row by its index in load_digits().
            self.predict_ids = [f"digits[{index}]" for index in test]
        index = torch.from_numpy(self.split_indices["test" if split == "predict" else split])
        return self._images[index], self._labels[index]
