"""The preprocessing record read from a checkpoint or an exported file: a value that would give NaN for every image,
or cost memory and disk out of all proportion to the model, is refused, naming the file and the key."""

import pytest
import torch

from template.data.augment import channel_stats, normalize
from template.data.preprocessing import check_preprocessing

RGB = {
    "input_shape": [3, 16, 16],
    "resize": "cover_center_crop",
    "resize_size": [18, 18],
    "interpolation": "bilinear",
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
}
SOURCE = "runs/model.ckpt"


@pytest.mark.parametrize(
    "mean, std",
    [
        ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),  # ImageNet's, torchvision's and timm's default
        ([0.5] * 3, [0.5] * 3),  # Inception's
        ([0.0] * 3, [1.0] * 3),  # raw pixels (some timm weights)
        ([0.48235, 0.45882, 0.40784], [1 / 255] * 3),  # torchvision's VGG16 features: pixels in [0, 255]
    ],
)
def test_the_normalisations_of_pretrained_weights_are_taken(mean, std):
    assert check_preprocessing({**RGB, "mean": mean, "std": std}, SOURCE)["std"] == std


def test_the_stats_of_a_constant_channel_are_taken():
    mean, std = channel_stats(torch.zeros(4, 1, 8, 8, dtype=torch.uint8))  # std floored by channel_stats
    record = {**RGB, "input_shape": [1, 8, 8], "resize": "none", "resize_size": [8, 8]}
    check_preprocessing({**record, "mean": mean.tolist(), "std": std.tolist()}, SOURCE)


@pytest.mark.parametrize(
    "key, value",
    [
        ("std", [1e-300] * 3),  # positive and finite in Python, 0 in float32: NaN for every image
        ("std", [1e-9] * 3),
        ("std", [1e30] * 3),  # every image the same input
        ("mean", [1e300] * 3),  # inf in float32
        ("mean", [-5.0, 0.5, 0.5]),
        ("std", [float("nan")] * 3),
    ],
)
def test_a_normalisation_not_finite_in_float32_or_out_of_all_proportion_is_refused(key, value):
    with pytest.raises(ValueError, match=rf"^{SOURCE}: preprocessing {key} must be 3 numbers from .* to "):
        check_preprocessing({**RGB, key: value}, SOURCE)


def test_a_tiny_std_would_have_made_every_image_nan():
    image = torch.full((1, 3, 16, 16), 128, dtype=torch.uint8)
    assert normalize(image, torch.tensor(RGB["mean"]), torch.tensor([1e-300] * 3)).isnan().all()


@pytest.mark.parametrize(
    "key, value",
    [
        ("resize_size", [6000, 6000]),  # a 16x16 model's: 432 MB of cache for four photos
        ("resize_size", [65, 64]),  # past 4 times the input's side
        ("input_shape", [3, 8192, 8192]),  # past restore.py's 2**24 pixels
        ("input_shape", [65, 16, 16]),
    ],
)
def test_sizes_out_of_proportion_are_refused(key, value):
    with pytest.raises(ValueError, match=rf"^{SOURCE}: preprocessing {key} must be "):
        check_preprocessing({**RGB, key: value}, SOURCE)
    check_preprocessing({**RGB, "resize_size": [64, 64]}, SOURCE)  # 4 times: taken
