"""How an image file becomes a PIL image: the one opener of the cached and the streamed paths."""

from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

# Pillow's modes for 16-bit grey PNGs and TIFFs ("I" in older Pillow, and for some TIFFs).
SIXTEEN_BIT_MODES = {"I", "I;16", "I;16B", "I;16L", "I;16N"}


def open_image(path: Path, mode: str, draft: int | None = None) -> Image.Image:
    """The image of ``path`` decoded in full, upright, in ``mode`` ("RGB" or "L").

    Two things ``Image.open(path).convert(mode)`` gets wrong: phone photos are stored
    sideways with an EXIF Orientation tag that says how to turn them, and ``convert``
    clips 16-bit values to 255, so a 16-bit image turns almost all white.

    With ``draft``, a JPEG is decoded at a half, a quarter or an eighth of its size when both
    sides stay at least ``draft`` (libjpeg's DCT scaling, ``Image.draft``; other formats are
    decoded in full), which makes resizing a photo down to a training size faster; the pixels
    differ from a full decode's by about a level of 255, the two being different downscaling filters. A square of the longer side, in either
    orientation, so that a deployment repeats it in one line (README).
    """
    with Image.open(path) as image:
        if draft is not None:
            image.draft(image.mode, (draft, draft))  # same mode: only the scale changes
        image.load()  # decodes it all: a truncated file fails here, not later in training
        ImageOps.exif_transpose(image, in_place=True)
        if image.mode in SIXTEEN_BIT_MODES:  # keep the top 8 of the 16 bits
            image = Image.fromarray(np.clip(np.asarray(image) >> 8, 0, 255).astype(np.uint8))
        return image.convert(mode)
