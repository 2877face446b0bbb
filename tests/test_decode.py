"""decode_image hands PNGs and JPEGs to torchvision where it gives Pillow's very pixels.

Each image is decoded twice, by decode_image as it is and with its torchvision step switched off
(`pillow_only`: Pillow's path, what decode_image did before), and the two must be equal to the
byte; a spy shows which images torchvision did decode, so that an equality cannot come from
torchvision never being asked. The traps (why alpha, tRNS and 16-bit stay with Pillow) are
shown by torchvision's own RGB read mode giving other pixels for them.
"""

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import ImageReadMode
from torchvision.io import decode_image as torchvision_decode

from mmdp.data import images
from mmdp.data.bad_rows import BAD_ROWS, exif_rotated_jpeg
from mmdp.data.images import BadImage, decode_image, load_image
from mmdp.data.sources import load_vqa_dataset

EMBEDDED_ROWS = 600  # the rows bench/bench_stage5.py runs on


def encoded(image: Image.Image, format: str, **options) -> dict:
    buffer = io.BytesIO()
    image.save(buffer, format=format, **options)
    return {"bytes": buffer.getvalue(), "path": None}


def noise(width: int = 53, height: int = 37, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def palette_with_a_transparent_index() -> dict:
    """A palette PNG whose index 3 (a third of its pixels) is transparent: over white in RGB."""
    indices = (np.arange(37 * 53) % 3 + 1).reshape(37, 53).astype(np.uint8)
    image = Image.fromarray(indices, "P")
    image.putpalette([0, 0, 0, 200, 10, 10, 10, 200, 10, 10, 10, 200] + [0] * 756)
    return encoded(image, "PNG", transparency=3)


def half_transparent() -> Image.Image:
    rgba = noise().convert("RGBA")
    rgba.putalpha(Image.fromarray(np.full((37, 53), 128, dtype=np.uint8), "L"))
    return rgba


def with_exif_orientation(image: Image.Image, format: str, value: int) -> dict:
    exif = Image.Exif()
    exif[images.EXIF_ORIENTATION] = value
    return encoded(image, format, exif=exif.tobytes())


@pytest.fixture
def torchvision_calls(monkeypatch):
    """Count the images torchvision decoded (returned pixels for)."""
    calls = []
    real = images.decode_fast

    def spy(image, pil):
        pixels = real(image, pil)
        if pixels is not None:
            calls.append(pil.size)
        return pixels

    monkeypatch.setattr(images, "decode_fast", spy)
    return calls


def pillow_only(cell, target=None):
    """decode_image with its torchvision step switched off: Pillow's path, as before."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(images, "decode_fast", lambda image, pil: None)
        return decode_image(cell, target)


def assert_same_decode(cell, target=None):
    fast, fast_mode = decode_image(cell, target)
    slow, slow_mode = pillow_only(cell, target)
    assert fast.mode == slow.mode == "RGB"
    assert fast_mode == slow_mode
    assert np.array_equal(np.asarray(fast), np.asarray(slow))


def as_jpeg(cell: dict) -> dict:
    return encoded(Image.open(io.BytesIO(cell["bytes"])).convert("RGB"), "JPEG", quality=90)


def test_every_embedded_image_decodes_to_pillows_pixels_as_png_and_as_jpeg(torchvision_calls):
    cells = [cell for row in load_vqa_dataset(num_rows=EMBEDDED_ROWS) for cell in row["images"]]
    assert len(cells) > 500
    for cell in cells:
        assert_same_decode(cell)
        assert_same_decode(as_jpeg(cell))
    assert len(torchvision_calls) == 2 * len(cells)


SAME_AS_PILLOW = {
    "RGB PNG": (encoded(noise(), "PNG"), True),
    "L PNG": (encoded(noise().convert("L"), "PNG"), True),
    "palette PNG": (encoded(noise().convert("P"), "PNG"), True),
    "RGB JPEG": (encoded(noise(), "JPEG", quality=90), True),
    "L JPEG": (encoded(noise().convert("L"), "JPEG"), True),
    "progressive JPEG": (encoded(noise(), "JPEG", progressive=True), True),
    "EXIF-rotated JPEG": (exif_rotated_jpeg(), True),
    "EXIF-rotated PNG (8)": (with_exif_orientation(noise(), "PNG", 8), True),
    "EXIF-mirrored JPEG (5)": (with_exif_orientation(noise(), "JPEG", 5), True),
    # Pillow's own rules: over white, 16 bits kept as their top 8; CMYK and GIF: not tried
    "RGBA PNG": (encoded(half_transparent(), "PNG"), False),
    "LA PNG": (encoded(half_transparent().convert("LA"), "PNG"), False),
    "palette PNG with a transparent index": (palette_with_a_transparent_index(), False),
    "RGB PNG with tRNS": (encoded(noise(), "PNG", transparency=(1, 2, 3)), False),
    "CMYK JPEG": (encoded(noise().convert("CMYK"), "JPEG"), False),
    "16-bit PNG": (
        encoded(Image.fromarray(np.arange(600, dtype=np.uint16).reshape(20, 30) * 100), "PNG"),
        False,
    ),
    "GIF": (encoded(noise().convert("P"), "GIF"), False),
}


@pytest.mark.parametrize("name", list(SAME_AS_PILLOW))
def test_each_kind_of_image_decodes_to_pillows_pixels(name, torchvision_calls):
    cell, by_torchvision = SAME_AS_PILLOW[name]
    assert_same_decode(cell)
    assert len(torchvision_calls) == int(by_torchvision)


@pytest.mark.parametrize(
    "name", ["RGBA PNG", "LA PNG", "palette PNG with a transparent index", "16-bit PNG"]
)
def test_the_trap_torchvision_reads_these_other_than_pillows_rules(name):
    """Why these stay with Pillow: torchvision's RGB read of them differs from decode_image's."""
    cell, _ = SAME_AS_PILLOW[name]
    data = torch.frombuffer(bytearray(cell["bytes"]), dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pixels = torchvision_decode(data, mode=ImageReadMode.RGB).permute(1, 2, 0).numpy()
    assert not np.array_equal(pixels, np.asarray(pillow_only(cell)[0]))


def test_an_exif_turned_image_would_come_back_unturned_without_the_turn():
    """The negative control for the EXIF cases: torchvision's pixels as stored are not upright."""
    cell = with_exif_orientation(noise(), "PNG", 8)
    data = torch.frombuffer(bytearray(cell["bytes"]), dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        stored = torchvision_decode(data, mode=ImageReadMode.RGB)
    assert tuple(stored.shape[1:]) == (37, 53)
    assert decode_image(cell)[0].size == (37, 53)  # upright: width 37, height 53


def test_a_jpeg_draft_decoding_reduces_stays_with_pillow(torchvision_calls):
    photo = np.linspace(0, 255, 1024 * 768 * 3).reshape(768, 1024, 3).astype(np.uint8)
    cell = encoded(Image.fromarray(photo), "JPEG", quality=90)
    assert decode_image(cell, target=(256, 256))[0].size == (512, 384)
    assert torchvision_calls == []
    assert_same_decode(cell, target=(400, 400))  # 768 // 400 = 1: full scale, torchvision
    assert len(torchvision_calls) == 1
    assert load_image(cell, 256)[0].shape == (3, 256, 256)


def without_address(error: BadImage) -> str:
    """The error's text up to an object's address (Pillow names the BytesIO it could not read)."""
    return str(error).split(" <")[0]


@pytest.mark.parametrize("format", ["PNG", "JPEG", "progressive JPEG"])
def test_a_cut_file_is_refused_exactly_when_pillow_refuses_it(format):
    """Every length of a cut file near its end and every 97th byte before: decode_image refuses
    it with Pillow's reason exactly when Pillow's path does, else gives Pillow's pixels."""
    photo = np.linspace(0, 255, 120 * 90 * 3).reshape(90, 120, 3)
    photo += np.random.default_rng(0).normal(0, 20, photo.shape)
    image = Image.fromarray(photo.clip(0, 255).astype(np.uint8), "RGB")
    if format == "progressive JPEG":
        whole = encoded(image, "JPEG", progressive=True)["bytes"]
    else:
        whole = encoded(image, format)["bytes"]
    refused = 0
    for cut in [*range(0, len(whole) - 64, 97), *range(len(whole) - 64, len(whole) + 1)]:
        cell = {"bytes": whole[:cut], "path": None}
        try:
            expected = pillow_only(cell)
        except BadImage as error:
            refused += 1
            with pytest.raises(BadImage) as raised:
                decode_image(cell)
            assert without_address(raised.value) == without_address(error)
            continue
        assert np.array_equal(np.asarray(decode_image(cell)[0]), np.asarray(expected[0]))
    assert refused > 10


@pytest.mark.parametrize("kind", ["garbage_image_bytes", "truncated_jpeg", "image_of_0x0_pixels"])
def test_the_bad_rows_images_are_refused_with_the_same_reason(kind):
    make_row, reason = BAD_ROWS[kind]
    (cell,) = make_row({"images": [], "texts": []})["images"]
    with pytest.raises(BadImage) as raised:
        decode_image(cell)
    assert raised.value.reason == reason
