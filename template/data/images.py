"""How an image file becomes a PIL image: the one opener of the cached and the streamed paths."""

from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

# What Pillow may read a file as, told by its bytes whatever its name: raster formats it decodes itself. Not EPS,
# whose loader runs Ghostscript on the file's PostScript.
FORMATS = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP", "PPM", "TGA", "ICO", "JPEG2000", "AVIF")  # (MPO: JPEG's)


def open_image(path: Path, mode: str, draft: int | None = None) -> Image.Image:
    """The image of ``path`` decoded in full, upright (EXIF orientation), 16-bit scaled to 8, in ``mode``. With
    ``draft``, a JPEG is decoded at 1/2, 1/4 or 1/8 of its size while both sides stay at least ``draft`` (libjpeg's
    DCT scaling): faster, and within about a level of 255 of a full decode."""
    try:
        image = Image.open(path, formats=FORMATS)
    except Image.UnidentifiedImageError:  # Pillow's words name no format it was allowed
        raise ValueError(f"no image of a format read here ({', '.join(FORMATS)}): convert it to PNG or JPEG") from None
    except Image.DecompressionBombError:
        raise ValueError(f"over {Image.MAX_IMAGE_PIXELS:,} pixels (PIL.Image.MAX_IMAGE_PIXELS): resize it") from None
    with image:
        if draft is not None:
            image.draft(image.mode, (draft, draft))  # a square: either orientation
        if image.width * image.height > Image.MAX_IMAGE_PIXELS:  # Pillow only warns up to twice it: gigabytes
            raise ValueError(f"over {Image.MAX_IMAGE_PIXELS:,} pixels (PIL.Image.MAX_IMAGE_PIXELS): resize it")
        image.load()  # decodes it all: a truncated file fails here, not later in training
        ImageOps.exif_transpose(image, in_place=True)
        if image.mode == "F" or (image.mode == "I" and np.asarray(image).max(initial=0) > 65535):
            raise ValueError(f"{image.mode} pixels of no 8- or 16-bit range (float or 32-bit): save it as 8 or 16 bits")
        if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):  # keep the top 8 of the 16 bits
            image = Image.fromarray(np.clip(np.asarray(image) >> 8, 0, 255).astype(np.uint8))
        return image.convert(mode)
