"""The embedded default: scikit-learn's 1,797 8x8 grey handwritten digits, so it needs no network or files."""

import numpy as np
import torch
from sklearn.datasets import load_digits

from template.data.base import ImageDataModule, Split, split_named


class DigitsDataModule(ImageDataModule):
    """Handwritten digits 0-9, split into train / val / test by class, with a fixed seed.

    Args:
        val_fraction: share of all images held out for validation (checkpoint choice).
        test_fraction: share of all images held out for the final test.
        split_seed: seed of the split alone: the training seed never moves images between splits.
        crop_padding: random translation by up to this many pixels (no flip: a mirrored digit is none).
        **kwargs: every option of ImageDataModule (batch_size, the augmentation, folds...).
    """

    def __init__(
        self,
        val_fraction: float = 0.15,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        crop_padding: int = 1,
        **kwargs,
    ) -> None:
        super().__init__(crop_padding=crop_padding, **kwargs)
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
        if not self.split_indices:  # read and split once
            digits = load_digits()  # pixel values 0..16, scaled to the uint8 every source gives: (N, 1, 8, 8)
            self._images = torch.from_numpy(np.round(digits.images * (255 / 16)).astype(np.uint8)[:, None])
            self._labels = torch.from_numpy(digits.target).long()
            fractions = {"val": self.val_fraction, "test": self.test_fraction}
            self.split_indices = split_named(digits.target, fractions, self.split_seed)
            # predict serves the test split; name each row by its index in load_digits().
            self.predict_ids = [f"digits[{index}]" for index in self.split_indices["test"]]
        index = torch.from_numpy(self.split_indices["test" if split == "predict" else split])
        return self._images[index], self._labels[index]
