"""InternVL (mmdp.data.families.internvl): GotOcr2 tiles weighed from image headers as the real
processor cuts them, videos whose frames share pixel_values with the images, and packed batches
with videos through the tiny model.

Every family's packed batch (images and text in 2 packs, tests/test_families.py) already runs
InternVL's tiny model under every attention implementation, with its trap (tiles out of order).
"""

import io

import pytest
import torch
from conftest import two_packs_of_three
from PIL import Image
from test_families import (
    cell,
    packs_tiles_swapped,
    summed_losses_alone,
    summed_losses_packed,
    turn,
)
from test_video import ATTENTION, clip, losses_packed_and_alone, processor_outputs
from transformers import GotOcr2ImageProcessor, InternVLProcessor

from mmdp.data.conversation import chat_messages, chat_turns
from mmdp.data.families import family_for, offline_processor, tiny_processor
from mmdp.data.families.internvl import IMAGE_SETTINGS
from mmdp.drop_reasons import VIDEO_REFUSED
from mmdp.models.inputs import model_inputs
from mmdp.models.tiny import tiny_model


@pytest.fixture(scope="module")
def family():
    return family_for(offline_processor("internvl"))


def processor_images(processor, row: dict) -> dict:
    turns = chat_turns(row["texts"], ())
    text = processor.apply_chat_template(chat_messages(turns, len(row["images"])), tokenize=False)
    images = [Image.open(io.BytesIO(image["bytes"])).convert("RGB") for image in row["images"]]
    return processor(text=[text], images=images, return_tensors="pt")


# Width x height -> tiles: 1 for a square, a grid and its thumbnail otherwise (12 at most + 1);
# the slow group (-m slow) weighs the sizes after the first two.
TILES = {(3840, 2160): 9, (97, 13): 8, (1, 1): 1, (640, 480): 13, (2160, 3840): 9, (4000, 300): 13}


@pytest.mark.parametrize(
    "size",
    [pytest.param(s, marks=() if k < 2 else pytest.mark.slow) for k, s in enumerate(TILES)],
    ids=lambda s: f"{s[0]}x{s[1]}",
)
def test_image_weights_are_the_processors_own_tiles_and_tokens(family, size):
    row = {"images": [cell(*size)], "texts": [turn("Describe it.", "Red.")]}
    lengths, _, patches, reasons = family.weigh([row["texts"]], [row["images"]])
    sample = family.make_sample(row, 0)
    assert reasons == [None] and len(sample["input_ids"]) == lengths[0]
    assert patches == [sample["patches"]] == [TILES[size] * 1024]  # (448 / 14)^2 a tile
    out = processor_images(family.processor, row)
    assert torch.equal(sample["input_ids"], out["input_ids"][0])
    assert torch.equal(family.collate_vision([sample])["pixel_values"], out["pixel_values"])


def test_the_processor_crops_whatever_its_image_processor_says(family):
    """InternVLProcessor sends crop_to_patches=True at every call (its images_kwargs), and the
    GotOcr2 class default is False: an image processor left at False still gets tiles, and mmdp
    weighs them."""
    image_processor = GotOcr2ImageProcessor(**IMAGE_SETTINGS, crop_to_patches=False)
    assert not image_processor.crop_to_patches
    processor = InternVLProcessor(
        image_processor=image_processor,
        tokenizer=family.tokenizer,
        video_processor=family.processor.video_processor,
        chat_template=family.processor.chat_template,
    )
    row = {"images": [cell(640, 480)], "texts": [turn("Describe it.", "Red.")]}
    assert len(processor_images(processor, row)["pixel_values"]) == 13
    assert family_for(processor).make_sample(row, 0)["patches"] == 13 * 1024


def test_video_weights_are_the_processors_own_tokens_and_tiles(family):
    """The offline processor samples 4 frames, each a tile, after the sample's images in one
    pixel_values; a clip of 3 frames is refused by both."""
    texts = [turn("Which way does it move?", "Left to right.")]
    rows = [
        {"images": [], "videos": [clip(9, 3, 64, 48)], "texts": texts},
        {"images": [cell(90, 30)], "videos": [clip(5, 5, 30, 90)], "texts": texts},
        {"images": [], "videos": [clip(3, 3, 64, 48)], "texts": texts},
    ]
    lengths, _, patches, reasons = family.weigh(
        [r["texts"] for r in rows], [r["images"] for r in rows], [r["videos"] for r in rows]
    )
    assert reasons == [None, None, VIDEO_REFUSED]
    with pytest.raises(ValueError, match="exceeds `total_num_frames"):
        processor_outputs(family, rows[2])
    for row, length, patch_count, tiles in zip(rows, lengths, patches, (4, 4 + 4)):
        sample, out = family.make_sample(row, 0), processor_outputs(family, row)
        assert len(sample["input_ids"]) == length and patch_count == tiles * 1024
        assert torch.equal(sample["input_ids"], out["input_ids"][0])
        assert torch.equal(family.collate_vision([sample])["pixel_values"], out["pixel_values"])


def test_a_video_before_an_image_is_a_counted_drop(family):
    """The model fills the <IMG_CONTEXT> runs in text order from one pixel_values; mmdp lays a
    sample out as its images, then its videos, so a row that puts a video first is refused, weighed
    or built."""
    row = {
        "images": [cell(90, 30)],
        "videos": [clip(5, 5, 30, 90)],
        "texts": [turn("<video> then <image>: the same colour?", "Yes.")],
    }
    _, _, _, reasons = family.weigh([row["texts"]], [row["images"]], [row["videos"]])
    assert reasons == [VIDEO_REFUSED] == [family.make_sample(row, 0)["drop_reason"]]
    # the processor (text order): the video's 4 frames, then the image's 3 + 1 tiles
    image = Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")
    tiles = family.vision_inputs([image])["pixel_values"]
    assert torch.equal(processor_outputs(family, row)["pixel_values"][4:], tiles)


# A packed batch with videos --------------------------------------------------------------------

ROWS = [
    {"images": [], "videos": [clip(6, 3, 40, 30)], "texts": [turn("Where?", "Left.")]},
    {"images": [cell(64, 48)], "videos": [], "texts": [turn("What is this?", "A red box.")]},
    {"images": [], "videos": [], "texts": [turn("Spell cat.", "C-A-T.")]},
    {"images": [cell(32, 96)], "videos": [clip(4, 2, 48, 32)], "texts": [turn("Both?", "Red.")]},
    {"images": [], "videos": [], "texts": [turn("2 + 2?", "4.")]},
]


@pytest.fixture(scope="module")
def tiny():
    return family_for(tiny_processor("internvl"))


@pytest.fixture(scope="module")
def model(tiny):
    return tiny_model(tiny.processor, attn_implementation="eager")


@pytest.fixture(scope="module")
def packed(tiny):
    samples = [tiny.make_sample(row, i) for i, row in enumerate(ROWS)]
    return two_packs_of_three(tiny, samples), samples


@pytest.fixture(scope="module")
def alone_eager(tiny, model, packed):
    return summed_losses_alone(tiny, model, packed[1])


@pytest.mark.parametrize("attention", ATTENTION, indirect=True)
def test_packed_samples_with_videos_see_only_themselves(
    tiny, model, packed, alone_eager, attention
):
    """One pixel_values of tiles and frames in token order; alone under the same attention
    (flex_attention: eager, which it equals on one sample)."""
    batch, samples = packed
    tiles = sum(s["patches"] for s in samples) // (4 * tiny.processor.image_seq_length)
    assert len(batch["pixel_values"]) == tiles and "pixel_values_videos" not in batch
    packed_losses, alone = losses_packed_and_alone(tiny, model, packed, alone_eager, attention)
    assert packed_losses == pytest.approx(alone, rel=1e-5)


def test_tiles_and_frames_out_of_order_mix_samples(model, packed, alone_eager):
    batch, _ = packed
    inputs = packs_tiles_swapped(batch, model_inputs(batch, model), model)
    packed_losses = summed_losses_packed(model, batch, inputs)
    assert max(abs(p - a) / a for p, a in zip(packed_losses, alone_eager)) > 1e-4
