"""How an image file becomes the model's input: a record in every checkpoint (the DataModule's state) and
exported file, so ``predict`` and a deployment need nothing else. All plain values::

    {"input_shape": [C, H, W],      # channels: 1 grey ("L"), 3 RGB
     "resize": "cover_center_crop", # or "none": see RESIZE
     "resize_size": [H', W'],       # what "cover_center_crop" scales to before the centre (H, W)
     "interpolation": "bilinear",   # of that scaling: PIL's BILINEAR or BICUBIC
     "mean": [...], "std": [...]}   # per channel, of pixel values scaled to [0, 1]

and the model's input is ``(pixels / 255 - mean) / std``, (B, C, H, W) float32. Records older than
``resize_size`` mean ``[H, W]``.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

RESIZE = {  # how an image reaches (H, W)
    # PIL's ImageOps.fit(image, (W', H'), interpolation) after a JPEG draft decode (images.open_image)
    "cover_center_crop": "scaled to cover resize_size, aspect ratio kept, then centre-cropped to (H, W)",
    "none": "images of the source are already (H, W)",  # the digits, CIFAR-10's arrays
}
KEYS = ("input_shape", "resize", "resize_size", "interpolation", "mean", "std")
OPTIONAL = {"resize_size", "interpolation"}  # absent from records written before they existed
INTERPOLATIONS = ("bilinear", "bicubic")
# Bounds on a record from a file, each well past what a trained run writes: a damaged or doctored record is refused
# before it costs memory and disk (every image is cached at resize_size) or turns every prediction into NaN.
MAX_CHANNELS, MAX_PIXELS = 64, 1 << 24  # of input_shape, and of resize_size: restore.py's caps on input_shape
MAX_RESIZE_RATIO = 4  # of resize_size over the input's side: torchvision's weights 256 / 224, timm's 1 / 0.875 at most
MEAN_RANGE = (-1.0, 2.0)  # a [0, 1] channel's mean is in [0, 1] (pretrained: 0 to 0.5); a range's margin each side
# Such a channel's std is at most 0.5; records use 1/255 (torchvision's VGG16 features) to 1 (timm's raw pixels). The
# floor is channel_stats' for a constant channel, in float32: pixels stay finite, where 1e-300 (0 in float32) is NaN.
STD_RANGE = (float(np.float32(1e-6)), 10.0)


def _ints_within(values: Any, least: Sequence[int], most: Sequence[int]) -> bool:
    """Whether ``values`` is a list or tuple of ints within the bounds, the last two at most MAX_PIXELS together."""
    return (
        isinstance(values, list | tuple)
        and len(values) == len(least)
        and all(type(n) is int and low <= n <= high for n, low, high in zip(values, least, most))  # then multiplied
        and values[-2] * values[-1] <= MAX_PIXELS
    )


def check_preprocessing(record: Any, source: str) -> dict:
    """``record`` (from a file: untrusted) if it is a well-formed preprocessing record, else a ValueError."""
    if not isinstance(record, dict) or not set(KEYS) - OPTIONAL <= set(record) <= set(KEYS):
        raise ValueError(
            f"{source}: the preprocessing record must have the keys {', '.join(KEYS)} ({', '.join(OPTIONAL)} "
            "may be left out), and no other"
        )
    shape = record["input_shape"]
    if not _ints_within(shape, (1, 1, 1), (MAX_CHANNELS, MAX_PIXELS, MAX_PIXELS)):
        raise ValueError(
            f"{source}: preprocessing input_shape must be three positive integers (C, H, W), at most "
            f"{MAX_CHANNELS} channels and {MAX_PIXELS:,} pixels, not {shape!r}"
        )
    if record["resize"] not in RESIZE:
        raise ValueError(f"{source}: preprocessing resize {record['resize']!r} is none of {', '.join(RESIZE)}")
    resize_size = record.get("resize_size", shape[1:])
    if not _ints_within(resize_size, shape[1:], [MAX_RESIZE_RATIO * side for side in shape[1:]]):
        raise ValueError(
            f"{source}: preprocessing resize_size must be two integers (H, W) at least the input's {shape[1:]}, "
            f"at most {MAX_RESIZE_RATIO} times it and {MAX_PIXELS:,} pixels, not {resize_size!r}"
        )
    interpolation = record.get("interpolation", "bilinear")
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"{source}: preprocessing interpolation {interpolation!r} is none of {INTERPOLATIONS}")
    if record["resize"] == "none" and list(resize_size) != list(shape[1:]):
        raise ValueError(f"{source}: preprocessing resize 'none' needs resize_size {shape[1:]}, not {resize_size!r}")
    for key, (least, most) in (("mean", MEAN_RANGE), ("std", STD_RANGE)):
        values = record[key]
        if not (
            isinstance(values, list | tuple)
            and len(values) == shape[0]
            and all(type(v) in (int, float) and least <= v <= most for v in values)  # NaN is in no range
        ):
            raise ValueError(
                f"{source}: preprocessing {key} must be {shape[0]} numbers from {least:g} to {most:g} (of pixels "
                f"in [0, 1]), not {values!r}"
            )
    return {
        "input_shape": list(shape),
        "resize": record["resize"],
        "resize_size": list(resize_size),
        "interpolation": interpolation,
        "mean": [float(v) for v in record["mean"]],
        "std": [float(v) for v in record["std"]],
    }


def recorded_preprocessing(checkpoint: dict) -> dict | None:
    """The preprocessing record in a Lightning checkpoint (its DataModule's state), checked; None if it has none."""
    keys = [key for key, state in checkpoint.items() if isinstance(state, dict) and "preprocessing" in state]
    keys = [key for key in keys if key not in ("hyper_parameters", "datamodule_hyper_parameters")]
    if len(keys) > 1:  # export would read one, evaluation the one under its DataModule's name
        raise ValueError(f"preprocessing records under keys {', '.join(map(repr, keys))[:200]}: fit writes one, edited")
    return check_preprocessing(checkpoint[keys[0]]["preprocessing"], f"checkpoint key {keys[0]!r}") if keys else None
