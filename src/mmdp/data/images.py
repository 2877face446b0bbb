"""Decode images for the vision encoder, turning bad images into named outcomes.

Three steps, each usable alone:

    image_size(image)    (width, height) from the encoded header, EXIF rotation applied: no pixel
                         is decoded (weighing millions of rows reads only headers)
    decode_image(image)  an RGB PIL image, upright (EXIF rotation applied), transparent pixels over
                         white; what a model's own image processor takes. Given the size the
                         caller resizes to, a JPEG at least twice that size on both sides is
                         decoded at 1/2, 1/4 or 1/8 scale (Image.draft: libjpeg scales in the DCT
                         domain, skipping most of the work), never below that size
    load_image(image)    decode_image, resized to a square float tensor in [0, 1]: TinyVLM's input

A file that does not decode, or one larger than config.MAX_IMAGE_PIXELS (checked from the header,
before any pixel is decoded) raises BadImage with its reason from mmdp.drop_reasons.

An image cell without bytes is read from its path: a local one, or a remote one through fsspec
(mmdp.data.files): image_size then reads only the first KBs of the file, in ranged requests,
decode_image the whole file in one; a remote file that does not answer is `unreachable_file`.
"""

import dataclasses
import functools
import io
import warnings

import numpy as np
import torch
from PIL import Image

from mmdp import config
from mmdp.data import files
from mmdp.drop_reasons import IMAGE_TOO_LARGE, UNDECODABLE_IMAGE, UNREACHABLE_FILE, BadRow

# The EXIF orientation tag, and how each value turns the stored pixels upright (the table of
# PIL.ImageOps.exif_transpose). Orientations 5 to 8 turn by 90 degrees: width and height swap.
EXIF_ORIENTATION = 0x0112
UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
SWAPS_SIDES = {5, 6, 7, 8}
# 16-bit grayscale (a 16-bit PNG): values 0..65535, kept as the top 8 bits
SIXTEEN_BIT_MODES = {"I;16", "I;16L", "I;16B", "I;16N"}


class BadImage(BadRow):
    """An image that cannot be used; `reason` is one of mmdp.drop_reasons."""


def open_image(image, header_only: bool = False) -> Image.Image:
    """Open an image from a PIL image or a `datasets` {"bytes", "path"} dict, without decoding pixels.

    A path is local (or file://), or remote (s3://, https://...: mmdp.data.files); with
    `header_only`, a remote file is read only as far as its header (what image_size needs).
    """
    if isinstance(image, Image.Image):
        return image
    try:
        if isinstance(image, dict) and image.get("bytes") is not None:
            return Image.open(io.BytesIO(image["bytes"]))
        if isinstance(image, dict) and image.get("path"):
            path = image["path"]
            if not files.is_remote(path):
                return Image.open(files.local_path(path))
            if header_only:
                return files.read_header(path, lambda data: Image.open(io.BytesIO(data)))
            return Image.open(io.BytesIO(files.read_whole(path)))
    except files.UnreachableFile as error:
        raise BadImage(UNREACHABLE_FILE, str(error)) from error
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise BadImage(UNDECODABLE_IMAGE, f"{error.__class__.__name__}: {error}") from error
    raise BadImage(UNDECODABLE_IMAGE, f"no image data in {type(image).__name__}")


def image_size(image) -> tuple[int, int]:
    """(width, height) of the image as decode_image will return it, read from its header alone.

    Raises BadImage for a header that does not parse and for an image over MAX_IMAGE_PIXELS.
    """
    if isinstance(image, dict) and image.get("bytes") is None and image.get("path"):
        if files.is_remote(image["path"]):
            return remote_image_size(image["path"])
    return upright_size(open_image(image, header_only=True))


@functools.lru_cache(maxsize=1 << 16)
def remote_image_size(path: str) -> tuple[int, int]:
    """image_size of a remote file, its header read once in this process: stage 5 weighs a row,
    then reports what its images cost every family (a file that raises is read again)."""
    return upright_size(open_image({"bytes": None, "path": path}, header_only=True))


def upright_size(pil: Image.Image) -> tuple[int, int]:
    width, height = pil.size
    if width * height > config.MAX_IMAGE_PIXELS:
        raise BadImage(IMAGE_TOO_LARGE, f"{width}x{height} pixels")
    return (height, width) if orientation(pil) in SWAPS_SIDES else (width, height)


def orientation(pil: Image.Image) -> int | None:
    """The EXIF orientation found in the header (None without one, or if it does not parse).

    Only the EXIF read with the header counts (JPEG's APP1, a PNG eXIf chunk before the pixels):
    `Image.getexif()` would decode a PNG's pixels to look for one after them, and decode_image
    must turn an image exactly as image_size said.
    """
    raw = pil.info.get("exif")
    if not raw:
        return None
    exif = Image.Exif()
    try:
        exif.load(raw)
    except (OSError, ValueError, SyntaxError, TypeError):
        return None
    return exif.get(EXIF_ORIENTATION)


def decode_image(image, target: tuple[int, int] | None = None) -> tuple[Image.Image, str | None]:
    """Return (an upright RGB PIL image, the original mode if it was converted, else None).

    Grayscale (L), palette (P), RGBA and other modes are converted to RGB (transparent pixels over
    white); an EXIF orientation is applied, so that the image is upright as image_size says.
    `target`: the (width, height) the caller resizes the upright image to, if it does; a JPEG at
    least twice as large on both sides then comes back smaller, though never below `target`.
    """
    pil = open_image(image)
    width, height = pil.size
    if width * height > config.MAX_IMAGE_PIXELS:
        raise BadImage(IMAGE_TOO_LARGE, f"{width}x{height} pixels")
    try:
        if target is not None and pil.format == "JPEG":
            decode_reduced(pil, target)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            pil.load()
        converted_from = None if pil.mode == "RGB" else pil.mode
        if pil.mode in SIXTEEN_BIT_MODES:  # convert("RGB") would clip every value over 255 to white
            pil = Image.fromarray((np.asarray(pil, dtype=np.uint32) >> 8).astype(np.uint8), "L")
        turn = UPRIGHT.get(orientation(pil))
        if turn is not None:
            pil = pil.transpose(turn)
        if pil.mode in ("RGBA", "LA", "PA") or (pil.mode == "P" and "transparency" in pil.info):
            rgba = pil.convert("RGBA")
            pil = Image.new("RGB", rgba.size, (255, 255, 255))
            pil.paste(rgba, mask=rgba.getchannel("A"))
        elif pil.mode != "RGB":
            pil = pil.convert("RGB")
    except (OSError, ValueError, SyntaxError) as error:
        raise BadImage(UNDECODABLE_IMAGE, f"{error.__class__.__name__}: {error}") from error
    return pil, converted_from


def decode_reduced(pil: Image.Image, target: tuple[int, int]) -> None:
    """Have a JPEG decode at the smallest of 1/2, 1/4 and 1/8 scale that keeps it at least
    `target` (upright width, height) on both sides; at full scale if none does."""
    stored = target[::-1] if orientation(pil) in SWAPS_SIDES else target
    pil.draft(None, stored)


def load_image(image, size: int = config.IMAGE_SIZE) -> tuple[torch.Tensor, str | None]:
    """Return (a float tensor [3, size, size] in [0, 1], the original mode if it was converted):
    TinyVLM's input, decode_image resized to a square."""
    pil, converted_from = decode_image(image, target=(size, size))
    try:
        pil = pil.resize((size, size), Image.Resampling.BILINEAR)
    except (OSError, ValueError) as error:
        raise BadImage(UNDECODABLE_IMAGE, f"{error.__class__.__name__}: {error}") from error
    pixels = torch.from_numpy(np.asarray(pil, dtype=np.uint8).copy())
    return pixels.permute(2, 0, 1).float().div_(255), converted_from


def undecoded(rows):
    """`rows` (a datasets.Dataset or IterableDataset) with its images and videos kept encoded:
    every Image or Video feature of its columns cast to decode=False (datasets' default Image()
    decodes each image as the row is read, where a truncated file raises inside a DataLoader
    worker, outside mmdp's one decoding place). Only the features change, no row is rewritten;
    anything else, and a dataset already undecoded, comes back as it is (the same object, the
    same fingerprint)."""
    features = getattr(rows, "features", None)
    if features is None:
        return rows
    for column, feature in features.items():
        if (encoded := kept_encoded(feature)) != feature:
            rows = rows.cast_column(column, encoded)
    return rows


def kept_encoded(feature):
    """A feature with its Image and Video parts set to decode=False (nested in lists and
    dicts too)."""
    import datasets  # only for a datasets.Dataset's features: stage 1 reads no datasets here

    if isinstance(feature, (datasets.Image, datasets.Video)):
        return dataclasses.replace(feature, decode=False)
    if isinstance(feature, (datasets.List, datasets.LargeList)):
        return dataclasses.replace(feature, feature=kept_encoded(feature.feature))
    if isinstance(feature, dict):
        return type(feature)({key: kept_encoded(value) for key, value in feature.items()})
    return feature
