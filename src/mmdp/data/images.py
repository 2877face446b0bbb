"""Decode and resize images for the vision encoder, turning bad images into named outcomes."""

import io
import warnings

import numpy as np
import torch
from PIL import Image

from mmdp import config
from mmdp.drop_reasons import IMAGE_TOO_LARGE, UNDECODABLE_IMAGE


class BadImage(Exception):
    """An image that cannot be used; `reason` is one of mmdp.drop_reasons."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def open_image(image) -> Image.Image:
    """Open an image from a PIL image or a `datasets` {"bytes", "path"} dict, without decoding pixels."""
    if isinstance(image, Image.Image):
        return image
    try:
        if isinstance(image, dict) and image.get("bytes") is not None:
            return Image.open(io.BytesIO(image["bytes"]))
        if isinstance(image, dict) and image.get("path"):
            return Image.open(image["path"])
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise BadImage(UNDECODABLE_IMAGE, f"{error.__class__.__name__}: {error}") from error
    raise BadImage(UNDECODABLE_IMAGE, f"no image data in {type(image).__name__}")


def load_image(image, size: int = config.IMAGE_SIZE) -> tuple[torch.Tensor, str | None]:
    """Return (a float tensor [3, size, size] in [0, 1], the original mode if it was converted).

    Grayscale (L), palette (P), RGBA and other modes are converted to RGB (transparent pixels over
    white). Raises BadImage for a file that does not decode, or one larger than
    config.MAX_IMAGE_PIXELS (checked from the header, before any pixel is decoded).
    """
    pil = open_image(image)
    width, height = pil.size
    if width * height > config.MAX_IMAGE_PIXELS:
        raise BadImage(IMAGE_TOO_LARGE, f"{width}x{height} pixels")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            pil.load()
        converted_from = None if pil.mode == "RGB" else pil.mode
        if pil.mode in ("RGBA", "LA", "PA") or (pil.mode == "P" and "transparency" in pil.info):
            rgba = pil.convert("RGBA")
            pil = Image.new("RGB", rgba.size, (255, 255, 255))
            pil.paste(rgba, mask=rgba.getchannel("A"))
        elif pil.mode != "RGB":
            pil = pil.convert("RGB")
        pil = pil.resize((size, size), Image.Resampling.BILINEAR)
    except (OSError, ValueError, SyntaxError) as error:
        raise BadImage(UNDECODABLE_IMAGE, f"{error.__class__.__name__}: {error}") from error
    pixels = torch.from_numpy(np.asarray(pil, dtype=np.uint8).copy())
    return pixels.permute(2, 0, 1).float().div_(255), converted_from
