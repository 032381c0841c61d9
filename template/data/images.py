"""How an image file becomes a PIL image: the one opener of the cached and the streamed paths."""

import mmap
import re
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps

from template.files import open_regular

# What Pillow may read a file as, told by its bytes whatever its name: raster formats it decodes itself. Not EPS,
# whose loader runs Ghostscript on the file's PostScript.
FORMATS = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP", "PPM", "TGA", "ICO", "JPEG2000", "AVIF")  # (MPO: JPEG's)
# Scans a JPEG may have: libjpeg's progressive mode writes 10 (6 for grey), well under it (nvImageCodec refuses
# over 256). libjpeg decodes every scan over the whole image, a repeated one too, and only warns: 4,000 scans of an
# 8,000 x 8,000 grey image (a 630 KB file) took 116 s to decode, where 100 would take about 3 s.
MAX_JPEG_SCANS = 100
# A marker within entropy-coded data: 0xFF then neither 0x00 (a stuffed 0xFF), RSTn (0xD0-0xD7) nor 0xFF (a fill).
ENTROPY_CODED_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def jpeg_scans(path: Path) -> int:
    """The scans (SOS segments) of the JPEG at ``path`` up to its EOI, found by walking its marker segments, not by
    decoding: an EXIF thumbnail's are inside a segment, and skipped with it. A broken file counts what it has."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        scans, position = 0, 2  # past SOI
        while position + 4 <= len(data) and data[position] == 0xFF:
            marker = data[position + 1]
            if marker == 0xD9:  # EOI: an MPO's next picture follows
                break
            if marker == 0xFF or marker == 0x01 or 0xD0 <= marker <= 0xD7:  # a fill byte, TEM, RSTn: no length
                position += 1 if marker == 0xFF else 2
                continue
            position += 2 + int.from_bytes(data[position + 2 : position + 4], "big")
            if marker == 0xDA:  # SOS: its header, then entropy-coded data up to the next marker
                scans += 1
                if (end := ENTROPY_CODED_END.search(data, position)) is None:
                    break
                position = end.start()
        return scans


def open_image(path: Path, mode: str, draft: int | None = None) -> Image.Image:
    """The image of ``path`` decoded in full, upright (EXIF orientation), 16-bit scaled to 8, in ``mode``. With
    ``draft``, a JPEG is decoded at 1/2, 1/4 or 1/8 of its size while both sides stay at least ``draft`` (libjpeg's
    DCT scaling): faster, and within about a level of 255 of a full decode."""
    with open_regular(path) as file:  # not a FIFO, nor a file of holes (gigabytes read for kilobytes sent)
        return decoded(file, path, mode, draft)


def decoded(file: BinaryIO, path: Path, mode: str, draft: int | None) -> Image.Image:
    try:
        image = Image.open(file, formats=FORMATS)
    except Image.UnidentifiedImageError:  # Pillow's words name no format it was allowed
        raise ValueError(f"no image of a format read here ({', '.join(FORMATS)}): convert it to PNG or JPEG") from None
    except Image.DecompressionBombError:
        raise ValueError(f"over {Image.MAX_IMAGE_PIXELS:,} pixels (PIL.Image.MAX_IMAGE_PIXELS): resize it") from None
    with image:
        if draft is not None:
            image.draft(image.mode, (draft, draft))  # a square: either orientation
        if image.width * image.height > Image.MAX_IMAGE_PIXELS:  # Pillow only warns up to twice it: gigabytes
            raise ValueError(f"over {Image.MAX_IMAGE_PIXELS:,} pixels (PIL.Image.MAX_IMAGE_PIXELS): resize it")
        if image.format in ("JPEG", "MPO") and (scans := jpeg_scans(path)) > MAX_JPEG_SCANS:
            raise ValueError(
                f"a JPEG of {scans:,} scans, over the {MAX_JPEG_SCANS} an encoder writes (each decodes the whole "
                "image again): re-save it"
            )
        image.load()  # decodes it all: a truncated file fails here, not later in training
        ImageOps.exif_transpose(image, in_place=True)
        if image.mode == "F" or (image.mode == "I" and np.asarray(image).max(initial=0) > 65535):
            raise ValueError(f"{image.mode} pixels of no 8- or 16-bit range (float or 32-bit): save it as 8 or 16 bits")
        if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):  # keep the top 8 of the 16 bits
            image = Image.fromarray(np.clip(np.asarray(image) >> 8, 0, 255).astype(np.uint8))
        return image.convert(mode)
