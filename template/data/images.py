"""How an image file becomes a PIL image: the one opener of the cached and the streamed paths."""

from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

# Pillow's modes for 16-bit grey PNGs and TIFFs ("I" in older Pillow, and for some TIFFs).
SIXTEEN_BIT_MODES = {"I", "I;16", "I;16B", "I;16L", "I;16N"}


def open_image(path: Path, mode: str) -> Image.Image:
    """The image of ``path`` decoded in full, upright, in ``mode`` ("RGB" or "L").

    Two things ``Image.open(path).convert(mode)`` gets wrong: phone photos are stored
    sideways with an EXIF Orientation tag that says how to turn them, and ``convert``
    clips 16-bit values to 255, so a 16-bit image turns almost all white.
    """
    with Image.open(path) as image:
        image.load()  # decodes it all: a truncated file fails here, not later in training
        ImageOps.exif_transpose(image, in_place=True)
        if image.mode in SIXTEEN_BIT_MODES:  # keep the top 8 of the 16 bits
            image = Image.fromarray(np.clip(np.asarray(image) >> 8, 0, 255).astype(np.uint8))
        return image.convert(mode)
