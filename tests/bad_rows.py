"""Rows broken in every way mmdp knows, for the fault tests and the bad-input benchmark
(bench/bench_bad_rows.py imports them from here).

`BAD_ROWS` maps a name to a function that breaks a good row (the_cauldron's schema, images as
{"bytes", "path"} cells) and the outcome the loaders must give it: a drop reason (the row is
skipped and counted), or a mode it is converted from (the row is trained on, counted in
`converted`), or None (trained on as it is).

    >>> row = {"images": [], "texts": [{"user": "Hi?", "assistant": "Hello.", "source": "t"}]}
    >>> BAD_ROWS["nulls_in_texts"][0](row)["texts"]
    [None]
"""

import io
import struct
import zlib
from collections import Counter

import numpy as np
from datasets import Dataset
from PIL import Image

from mmdp import drop_reasons
from mmdp.data.reading.sources import FEATURES


def encoded(image: Image.Image, fmt: str, **save_args) -> dict:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save_args)
    return {"bytes": buffer.getvalue(), "path": None}


def png_of_0x0_pixels() -> dict:
    """A PNG whose header says 0 x 0 pixels (PIL cannot write one: built chunk by chunk)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", 0, 0, 8, 2, 0, 0, 0)  # width, height, 8-bit RGB
    png = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    return {"bytes": b"\x89PNG\r\n\x1a\n" + png, "path": None}


def exif_rotated_jpeg() -> dict:
    exif = Image.Exif()
    exif[0x0112] = 6  # turn 90 degrees: stored 40x20, upright 20x40
    return encoded(Image.new("RGB", (40, 20), (0, 0, 255)), "JPEG", exif=exif.tobytes())


def animated_gif() -> dict:
    frames = [Image.new("P", (24, 24), color) for color in (1, 2, 3)]
    return encoded(frames[0], "GIF", save_all=True, append_images=frames[1:])


def truncated_jpeg() -> dict:
    whole = encoded(Image.new("RGB", (64, 48), (10, 200, 10)), "JPEG")["bytes"]
    return {"bytes": whole[: len(whole) // 2], "path": None}


def png_with_broken_data(width: int, height: int) -> dict:
    """A PNG whose header reads (so it is weighed and planned by its size) and whose pixel data
    does not decode: bytes inside its IDAT chunk flipped. Found only while its pack is built."""
    noise = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    whole = encoded(Image.fromarray(noise), "PNG")["bytes"]
    start = whole.find(b"IDAT") + 8 + len(whole) // 8
    flipped = bytes(b ^ 0xFF for b in whole[start : start + 64])
    return {"bytes": whole[:start] + flipped + whole[start + 64 :], "path": None}


def mp4_with_broken_data(frames: int = 8, fps: int = 4, kept: int = 40) -> dict:
    """An MP4 whose container header reads (frames, rate and size: weighed and planned) and whose
    frames do not decode: its media data zeroed after the first `kept` bytes (FFmpeg reads the
    frame size there). kept=0: no size either (a 0x0 stream). Needs PyAV (the video extra)."""
    from mmdp.data.synthetic.videos import encode_mp4, moving_shape

    whole = encode_mp4(moving_shape("circle", "red", "left to right", frames, 48, 32), fps)
    start, end = whole.find(b"mdat") + 4 + kept, whole.find(b"moov") - 4
    return {"bytes": whole[:start] + bytes(end - start) + whole[end:], "path": None}


def with_images(*cells):
    return lambda row: {**row, "images": list(cells)}


def with_texts(texts):
    return lambda row: {**row, "texts": texts}


def with_reply(user, assistant):
    return with_texts([{"user": user, "assistant": assistant, "source": None}])


BAD_ROWS = {
    # skipped, with their reason
    "garbage_image_bytes": (
        with_images({"bytes": b"\x00 not an image " * 8, "path": None}),
        drop_reasons.UNDECODABLE_IMAGE,
    ),
    "truncated_jpeg": (with_images(truncated_jpeg()), drop_reasons.UNDECODABLE_IMAGE),
    "image_of_0x0_pixels": (with_images(png_of_0x0_pixels()), drop_reasons.UNDECODABLE_IMAGE),
    "image_over_40_megapixels": (
        with_images(encoded(Image.new("1", (8000, 6000)), "PNG")),
        drop_reasons.IMAGE_TOO_LARGE,
    ),
    "null_image_cell": (with_images(None), drop_reasons.UNDECODABLE_IMAGE),
    "image_cell_of_nulls": (
        with_images({"bytes": None, "path": None}),
        drop_reasons.UNDECODABLE_IMAGE,
    ),
    "no_texts": (with_texts([]), drop_reasons.NO_TEXTS),
    "null_texts": (with_texts(None), drop_reasons.NO_TEXTS),
    "nulls_in_texts": (with_texts([None]), drop_reasons.NO_TEXTS),
    "null_reply": (with_reply("What is it?", None), drop_reasons.EMPTY_REPLY),
    "empty_reply": (with_reply("What is it?", ""), drop_reasons.EMPTY_REPLY),
    "image_token_in_text": (
        with_reply("Look: <|image|>", "A square."),
        drop_reasons.IMAGE_TOKEN_IN_TEXT,
    ),
    "too_long": (with_reply("Tell me everything.", "word " * 5000), drop_reasons.TOO_LONG),
    "too_many_images": (
        with_images(*[encoded(Image.new("RGB", (8, 8)), "PNG")] * 20),
        drop_reasons.TOO_MANY_IMAGES,
    ),
    "more_image_tags_than_images": (
        lambda row: with_reply("<image> or <image>: which is red?", "The first.")(
            with_images(encoded(Image.new("RGB", (30, 30), (200, 0, 0)), "PNG"))(row)
        ),
        drop_reasons.MEDIA_TAG_MISMATCH,
    ),
    "fewer_image_tags_than_images": (
        lambda row: with_reply("Is <image> red?", "Yes.")(
            with_images(*[encoded(Image.new("RGB", (30, 30), (200, 0, 0)), "PNG")] * 2)(row)
        ),
        drop_reasons.MEDIA_TAG_MISMATCH,
    ),
    "audio_tag": (with_reply("<audio> What is said?", "Hello."), drop_reasons.AUDIO_REFUSED),
    # trained on, converted to RGB (counted by mode)
    "cmyk_jpeg": (
        with_images(encoded(Image.new("CMYK", (30, 30), (0, 50, 100, 0)), "JPEG")),
        "CMYK",
    ),
    "png_of_16_bits": (with_images(encoded(Image.new("I;16", (30, 30), 40000), "PNG")), "I;16"),
    "animated_gif": (with_images(animated_gif()), "P"),  # its first frame
    # trained on as they are
    "image_between_text": (
        lambda row: with_reply("Here: <image> What colour is it?", "Red.")(
            with_images(encoded(Image.new("RGB", (30, 30), (200, 0, 0)), "PNG"))(row)
        ),
        None,
    ),
    "exif_rotated_jpeg": (with_images(exif_rotated_jpeg()), None),
    "null_images": (lambda row: {**row, "images": None}, None),  # a text-only row
    "null_question": (with_reply(None, "A square."), None),
}


def with_bad_rows(good: Dataset, every: int = 10) -> tuple[Dataset, Counter, Counter]:
    """`good`, with one row in `every` (the last of each `every`) broken in the next way of
    BAD_ROWS, in turn; and the outcomes the loaders must give: drops by reason, conversions by
    the mode converted from."""
    kinds = list(BAD_ROWS)
    table, drops, conversions = [], Counter(), Counter()
    for index in range(len(good)):
        row = good[index]
        if index % every == every - 1:
            break_row, outcome = BAD_ROWS[kinds[(index // every) % len(kinds)]]
            row = break_row(row)
            target = conversions if outcome in ("CMYK", "I;16", "P") else drops
            if outcome is not None:
                target[outcome] += 1
        table.append(row)
    return Dataset.from_list(table, features=FEATURES), drops, conversions
