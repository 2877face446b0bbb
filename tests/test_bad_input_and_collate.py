import json

import numpy as np
import pytest
import torch
from conftest import image_cell
from datasets import Dataset
from PIL import Image
from torch.utils.data import DataLoader

from mmdp import config
from mmdp.data.padding import ConstrainedPadCollator, NaivePadCollator, stage3_batch
from mmdp.data.reading.sources import FEATURES
from mmdp.data.vqa_dataset import VQADataset
from mmdp.drop_reasons import (
    EMPTY_REPLY,
    IMAGE_TOO_LARGE,
    NO_TEXTS,
    TOO_LONG,
    UNDECODABLE_IMAGE,
)
from mmdp.report.epoch import run_epoch
from mmdp.report.metrics import EpochReport


def turn(user="What is shown?", assistant="Shapes."):
    return {"user": user, "assistant": assistant, "source": "test"}


RGB = image_cell(Image.new("RGB", (40, 30), (200, 10, 10)))
ROWS = [
    {"images": [RGB], "texts": [turn()]},  # 0 fine
    {"images": [{"bytes": b"this is not an image", "path": None}], "texts": [turn()]},  # 1
    {"images": [RGB], "texts": []},  # 2 no texts
    {"images": [RGB], "texts": [turn(assistant="")]},  # 3 empty reply
    {"images": [image_cell(Image.new("L", (20, 20), 128))], "texts": [turn()]},  # 4 grayscale
    {"images": [image_cell(Image.new("RGBA", (20, 20), (0, 0, 255, 0)))], "texts": [turn()]},  # 5
    {"images": [image_cell(Image.new("P", (20, 20), 3))], "texts": [turn()]},  # 6 palette
    {"images": [image_cell(Image.new("1", (8000, 6000)))], "texts": [turn()]},  # 7 huge: 48 Mpx
    {"images": [RGB, RGB], "texts": [turn(), turn("More?", "No.")]},  # 8 fine, two images
    {"images": [], "texts": [turn(assistant="word " * 600)]},  # 9 fine, but long
]
EXPECTED_DROPS = {1: UNDECODABLE_IMAGE, 2: NO_TEXTS, 3: EMPTY_REPLY, 7: IMAGE_TOO_LARGE}


@pytest.fixture(scope="module")
def dataset(tokenizer):
    return VQADataset(Dataset.from_list(ROWS, features=FEATURES), tokenizer)


def test_each_bad_row_is_dropped_with_its_reason(dataset):
    for index in range(len(ROWS)):
        item = dataset[index]
        assert item["row"] == index
        assert item["drop_reason"] == EXPECTED_DROPS.get(index)


def test_odd_image_modes_are_converted_to_rgb(dataset):
    for index, mode in ((4, "L"), (5, "RGBA"), (6, "P")):
        item = dataset[index]
        assert item["converted"] == {mode: 1}
        assert item["pixel_values"].shape == (1, 3, config.IMAGE_SIZE, config.IMAGE_SIZE)
        assert item["pixel_values"].dtype == torch.float32
    # a fully transparent pixel becomes white, not black
    assert torch.allclose(dataset[5]["pixel_values"], torch.ones(1))


def test_epoch_through_workers_counts_every_row(dataset, tokenizer):
    loader = DataLoader(
        dataset,
        batch_size=4,
        num_workers=2,
        collate_fn=ConstrainedPadCollator(tokenizer.pad_token_id, max_length=256),
    )
    report = EpochReport()
    rows = []
    for batch in loader:
        report.add_batch(batch)
        rows += batch["sample_index"].tolist()
    assert report.rows_read == len(ROWS)
    assert sorted(rows) == [0, 4, 5, 6, 8]
    assert report.dropped == {
        UNDECODABLE_IMAGE: 1,
        NO_TEXTS: 1,
        EMPTY_REPLY: 1,
        IMAGE_TOO_LARGE: 1,
        TOO_LONG: 1,
    }
    assert report.converted == {"L": 1, "RGBA": 1, "P": 1}
    assert report.computed_tokens == 5 * 256  # every row padded to max_length
    summary = json.loads(json.dumps(report.as_dict()))
    assert summary["samples"] + sum(summary["dropped"].values()) == len(ROWS)


def test_naive_collator_pads_to_longest_with_explicit_mask(dataset, tokenizer):
    samples = [dataset[0], dataset[8], dataset[1]]
    batch = NaivePadCollator(tokenizer.pad_token_id)(samples)
    lengths = [len(dataset[0]["input_ids"]), len(dataset[8]["input_ids"])]
    assert batch["input_ids"].shape == (2, max(lengths))
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths
    assert batch["sample_index"].tolist() == [0, 8]
    assert batch["dropped"] == {UNDECODABLE_IMAGE: 1}
    # three images, in sample order, each mapped to its row of the batch
    assert batch["pixel_values"].shape[0] == 3 and batch["sample_of_image"].tolist() == [0, 1, 1]
    padding = batch["attention_mask"] == 0
    assert (batch["labels"][padding] == config.IGNORE_INDEX).all()
    assert (batch["input_ids"][padding] == tokenizer.pad_token_id).all()
    # a real <|im_end|> (same id as padding) keeps its label: padding is found by the mask
    real_im_end = (batch["input_ids"] == tokenizer.pad_token_id) & ~padding
    assert (batch["labels"][real_im_end] != config.IGNORE_INDEX).any()


def test_constrained_collator_drops_long_samples_and_pads_to_max(dataset, tokenizer):
    batch = ConstrainedPadCollator(tokenizer.pad_token_id, max_length=200)([dataset[0], dataset[9]])
    assert batch["input_ids"].shape == (1, 200)
    assert batch["dropped"] == {TOO_LONG: 1}
    assert batch["sample_index"].tolist() == [0]


def test_a_batch_with_every_sample_dropped_is_empty_not_an_error(dataset, tokenizer):
    batch = ConstrainedPadCollator(tokenizer.pad_token_id, max_length=64)([dataset[1], dataset[9]])
    assert batch["input_ids"].shape == (0, 64)
    assert batch["dropped"] == {UNDECODABLE_IMAGE: 1, TOO_LONG: 1}


def test_stage3_batch_is_the_batch_stage_3_shows(tokenizer):
    """Stage 5 draws stage 3's batch beside its own (05_vs_03.png): the same samples as stage 3's
    loader and run_epoch pick, found from the lengths alone. 16 rows, two too long."""
    rows = [{"images": [RGB] * (i % 2), "texts": [turn(assistant="word " * (5 + 9 * i))]}
            for i in range(14)]  # fmt: skip
    rows[9:9] = [{"images": [], "texts": [turn(assistant="word " * 300)]}] * 2
    dataset = VQADataset(Dataset.from_list(rows, features=FEATURES), tokenizer)
    items = [dataset[i] for i in range(len(rows))]  # each row tokenized once
    lengths = np.array([len(item["input_ids"]) for item in items])
    for seed in range(3):
        loader = DataLoader(  # stage 3's
            items,
            batch_size=4,
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
            collate_fn=ConstrainedPadCollator(tokenizer.pad_token_id, 256),
        )
        shown, _ = run_epoch(loader, EpochReport(), keep_batch=lambda batch: batch["dropped"])
        batch = stage3_batch(dataset, lengths, max_length=256, batch_size=4, seed=seed)
        assert batch["dropped"] == shown["dropped"] and TOO_LONG in batch["dropped"]
        assert batch["sample_index"].tolist() == shown["sample_index"].tolist()


def test_an_exif_rotated_jpeg_is_sized_and_decoded_upright():
    """EXIF orientation 6 (turn 90 degrees): the header's 40x20 is 20x40 upright, and the
    decoded pixels agree, without image_size decoding anything."""
    import io

    from mmdp.data.images import decode_image, image_size

    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    Image.new("RGB", (40, 20), (0, 0, 255)).save(buffer, format="JPEG", exif=exif.tobytes())
    cell = {"bytes": buffer.getvalue(), "path": None}
    assert image_size(cell) == (20, 40)
    assert decode_image(cell)[0].size == (20, 40)


def encoded(image: Image.Image, format: str, **options) -> dict:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format=format, **options)
    return {"bytes": buffer.getvalue(), "path": None}


def a_photo(width: int, height: int) -> Image.Image:
    """Smooth gradients and a few hard edges: what a JPEG of a real scene holds."""
    x = np.linspace(0, 1, width)[None, :]
    y = np.linspace(0, 1, height)[:, None]
    pixels = np.stack([x * 255 + 0 * y, y * 255 + 0 * x, (x + y) * 127], axis=-1)
    pixels[height // 4 : height // 2, width // 3 : width // 2] = (20, 200, 60)
    return Image.fromarray(pixels.astype(np.uint8), "RGB")


def test_a_jpeg_twice_the_target_is_decoded_reduced_and_close_to_the_full_decode():
    """A 1024x768 JPEG for 256x256: decoded at 1/2 scale (512x384, the largest reduction that
    stays >= 256 on both sides), and once resized within ~1 level of the full decode resized."""
    from mmdp.data.images import decode_image, load_image

    cell = encoded(a_photo(1024, 768), "JPEG", quality=90)
    assert decode_image(cell)[0].size == (1024, 768)  # no target: the full image
    assert decode_image(cell, target=(256, 256))[0].size == (512, 384)
    full = decode_image(cell)[0].resize((256, 256), Image.Resampling.BILINEAR)
    full = np.asarray(full, dtype=np.float32).transpose(2, 0, 1) / 255
    reduced = load_image(cell, 256)[0].numpy()
    assert np.abs(reduced - full).mean() < 1.5 / 255
    assert np.abs(reduced - full).mean() > 0  # it did decode differently


def test_a_jpeg_under_twice_the_target_and_a_png_are_decoded_in_full():
    from mmdp.data.images import decode_image, load_image

    jpeg = encoded(a_photo(500, 500), "JPEG")
    assert decode_image(jpeg, target=(256, 256))[0].size == (500, 500)
    png = encoded(a_photo(1024, 1024), "PNG")
    assert decode_image(png, target=(256, 256))[0].size == (1024, 1024)
    full = decode_image(png)[0].resize((256, 256), Image.Resampling.BILINEAR)
    full = np.asarray(full, dtype=np.float32).transpose(2, 0, 1) / 255
    assert np.array_equal(load_image(png, 256)[0].numpy(), full)


def test_an_exif_rotated_jpeg_is_reduced_by_its_upright_sides():
    """Stored 1024x512 with orientation 6 is 512x1024 upright: for an upright 128x256 target it
    decodes at 1/4 (the stored sides are compared with the target turned the same way)."""
    from mmdp.data.images import decode_image

    exif = Image.Exif()
    exif[0x0112] = 6
    cell = encoded(a_photo(1024, 512), "JPEG", exif=exif.tobytes())
    assert decode_image(cell)[0].size == (512, 1024)
    assert decode_image(cell, target=(128, 256))[0].size == (128, 256)
    assert decode_image(cell, target=(256, 128))[0].size == (256, 512)  # limited by the width
