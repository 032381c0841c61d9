"""How an image file becomes the model's input, as a record that travels with the model.

Every checkpoint holds it (the DataModule's state), and exported files carry it as metadata,
so ``predict`` and a deployment need the checkpoint (or the exported file) and the images,
nothing else. The record, all plain values::

    {"input_shape": [C, H, W],      # channels: 1 grey ("L"), 3 RGB
     "resize": "cover_center_crop", # or "none": see RESIZE
     "resize_size": [H', W'],       # what "cover_center_crop" scales to before the centre (H, W)
     "interpolation": "bilinear",   # of that scaling: PIL's BILINEAR or BICUBIC
     "mean": [...], "std": [...]}   # per channel, of pixel values scaled to [0, 1]

and the model's input is ``(pixels / 255 - mean) / std``, (B, C, H, W) float32. Records
written before ``resize_size`` existed read as ``resize_size == [H, W]``, what they meant.
"""

import math
from typing import Any

# How an image reaches (H, W):
RESIZE = {
    # Scaled (bilinear) so that it covers resize_size (H', W'), keeping its aspect ratio, its centre
    # (H', W') cut out, then the centre (H, W) of that: PIL's ImageOps.fit(image, (W', H'),
    # Image.Resampling.BILINEAR, or BICUBIC as "interpolation" says), after decoding a JPEG at 1/2, 1/4 or 1/8 of its size when both
    # sides stay at least max(H', W') (images.open_image). Training's random crops come from the
    # (H', W') image; resize_size == (H, W) is the plain resize-to-cover and centre crop.
    "cover_center_crop": "scaled to cover resize_size, aspect ratio kept, then centre-cropped to (H, W)",
    # The source's images are already (H, W) (the embedded digits, CIFAR-10 arrays).
    "none": "images of the source are already (H, W)",
}
KEYS = ("input_shape", "resize", "resize_size", "interpolation", "mean", "std")
OPTIONAL = {"resize_size", "interpolation"}  # absent from records written before they existed
INTERPOLATIONS = ("bilinear", "bicubic")


def check_preprocessing(record: Any, source: str) -> dict:
    """``record`` if it is a well-formed preprocessing record; else a ValueError naming what is wrong.

    It comes from a file (a checkpoint, an exported model's metadata): untrusted input.
    """
    if not isinstance(record, dict) or not set(KEYS) - OPTIONAL <= set(record) <= set(KEYS):
        raise ValueError(
            f"{source}: the preprocessing record must have the keys {', '.join(KEYS)} ({', '.join(OPTIONAL)} "
            "may be left out), and no other"
        )
    shape = record["input_shape"]
    if not (isinstance(shape, list | tuple) and len(shape) == 3 and all(type(n) is int and n > 0 for n in shape)):
        raise ValueError(
            f"{source}: preprocessing input_shape must be three positive integers (C, H, W), not {shape!r}"
        )
    if record["resize"] not in RESIZE:
        raise ValueError(f"{source}: preprocessing resize {record['resize']!r} is none of {', '.join(RESIZE)}")
    resize_size = record.get("resize_size", shape[1:])
    if not (isinstance(resize_size, list | tuple) and len(resize_size) == 2
            and all(type(n) is int and n >= side for n, side in zip(resize_size, shape[1:], strict=True))):  # fmt: skip
        raise ValueError(
            f"{source}: preprocessing resize_size must be two integers (H, W) at least the input's {shape[1:]}, "
            f"not {resize_size!r}"
        )
    if record.get("interpolation", "bilinear") not in INTERPOLATIONS:
        raise ValueError(
            f"{source}: preprocessing interpolation {record['interpolation']!r} is none of {INTERPOLATIONS}"
        )
    if record["resize"] == "none" and list(resize_size) != list(shape[1:]):
        raise ValueError(f"{source}: preprocessing resize 'none' needs resize_size {shape[1:]}, not {resize_size!r}")
    for key in ("mean", "std"):
        values = record[key]
        if not (isinstance(values, list | tuple) and len(values) == shape[0]
                and all(type(v) in (int, float) and math.isfinite(v) for v in values)):  # fmt: skip
            raise ValueError(f"{source}: preprocessing {key} must be {shape[0]} finite numbers, not {values!r}")
    if min(record["std"]) <= 0:
        raise ValueError(f"{source}: preprocessing std must be positive, not {record['std']!r}")
    return {"input_shape": list(shape), "resize": record["resize"], "resize_size": list(resize_size),
            "interpolation": record.get("interpolation", "bilinear"), "mean": [float(v) for v in record["mean"]],
            "std": [float(v) for v in record["std"]]}  # fmt: skip


def recorded_preprocessing(checkpoint: dict) -> dict | None:
    """The preprocessing record in a Lightning checkpoint (its DataModule's state), checked; None if it has none."""
    for key, state in checkpoint.items():
        if key not in ("hyper_parameters", "datamodule_hyper_parameters") and isinstance(state, dict):
            if "preprocessing" in state:
                return check_preprocessing(state["preprocessing"], f"checkpoint key {key!r}")
    return None
