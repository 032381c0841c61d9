import re

import pytest
import torch

from template.data import ImageDataModule


class Squares(ImageDataModule):
    """``images`` random images in every split; ``image_size`` set as a subclass sets it."""

    def __init__(self, images: int = 100, image_size=8, batch_size: int = 32) -> None:
        super().__init__(batch_size)
        self.images, self.num_classes, self.in_channels, self.class_names = images, 2, 3, ["a", "b"]
        self.image_size = image_size

    def load_split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        side = self.image_size
        return torch.randint(0, 256, (self.images, 3, *side), dtype=torch.uint8), torch.arange(self.images) % 2


@pytest.mark.parametrize(("size", "pair"), [(32, (32, 32)), ((16, 24), (16, 24)), ([16, 24], (16, 24))])
def test_image_size_takes_a_side_or_height_and_width(size, pair):
    data = Squares(image_size=size)
    assert data.image_size == pair and data.input_shape == (3, *pair)
    assert data.preprocessing()["input_shape"] == [3, *pair]


@pytest.mark.parametrize("size", [0, -4, (8,), (8, 8, 3), "32", True, 8.0, (8, 0)])
def test_an_image_size_that_is_no_side_or_pair_is_refused_naming_it(size):
    with pytest.raises(ValueError, match=rf"image_size must be a positive int .* not {re.escape(repr(size))}$"):
        Squares(image_size=size)


def test_a_source_that_sets_no_image_size_says_so():
    class NoSize(Squares):
        def __init__(self) -> None:
            ImageDataModule.__init__(self)

    with pytest.raises(AttributeError, match="NoSize sets no image_size"):
        _ = NoSize().image_size
