import pytest
import torch
from conftest import config_and_rest, image_cell
from datasets import Dataset
from PIL import Image
from torch.utils.data import DataLoader

from mmdp.batch import collate_packs, sample_ids
from mmdp.data.reading.sources import FEATURES, load_vqa_dataset
from mmdp.data.vqa_dataset import VQADataset
from mmdp.drop_reasons import (
    LEFT_OUT_TO_EQUALISE_RANKS,
    NO_TEXTS,
    TOO_LONG,
    TOO_MANY_IMAGES,
    UNDECODABLE_IMAGE,
)
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.packing_config import PackingConfig
from mmdp.report.pack_report import PackReport

IMAGE_SIZE = 16  # tiny images keep these tests fast; nothing here depends on the size


@pytest.fixture(scope="module")
def samples(tokenizer):
    return VQADataset(load_vqa_dataset(num_rows=120), tokenizer, image_size=IMAGE_SIZE)


def packed(samples, **kwargs):
    config, rest = config_and_rest({"max_length": 512, "packs_per_batch": 4, **kwargs})
    return PackedDataset(samples, config=config, **rest)


def epoch_rows(loader):
    return [batch["sample_index"].tolist() for batch in loader]


def test_each_sample_of_a_batch_is_its_dataset_item(samples):
    """The loader's batches hold the dataset's own samples (the layout itself is worked by hand
    in tests/test_batch.py)."""
    batch = next(iter(PackedDataLoader(packed(samples), num_workers=0)))
    assert batch["input_ids"].shape == (4, 512)
    owner = sample_ids(batch)
    for i, row in enumerate(batch["sample_index"].tolist()):
        item = samples[row]
        mine = owner == owner[owner >= 0].unique()[i]
        assert torch.equal(batch["input_ids"][mine], item["input_ids"])
        assert torch.equal(batch["labels"][mine][1:], item["labels"][1:])
        assert torch.equal(
            batch["pixel_values"][batch["sample_of_image"] == i], item["pixel_values"]
        )
    assert len(batch["sample_index"]) == int(batch["samples_per_pack"].sum())


def test_same_seed_and_epoch_same_batches_new_epoch_new_order(samples):
    first = epoch_rows(PackedDataLoader(packed(samples, seed=3), num_workers=2))
    again = epoch_rows(PackedDataLoader(packed(samples, seed=3), num_workers=0))
    assert first == again
    dataset = packed(samples, seed=3)
    dataset.set_epoch(1)
    other = epoch_rows(PackedDataLoader(dataset, num_workers=2))
    assert other != first
    assert sorted(sum(other, [])) == sorted(sum(first, []))


def test_resume_mid_epoch_yields_exactly_the_rest(samples):
    full = epoch_rows(PackedDataLoader(packed(samples), num_workers=2))
    loader = PackedDataLoader(packed(samples), num_workers=2)
    seen = []
    for batch in loader:
        seen.append(batch["sample_index"].tolist())
        if len(seen) == 3:
            state = loader.state_dict()
            break
    assert (state["seed"], state["epoch"], state["batches_done"]) == (0, 0, 3)
    resumed = PackedDataLoader(packed(samples), num_workers=2)
    resumed.load_state_dict(state)
    assert len(resumed) == len(full)  # the epoch's length, wherever it resumes
    resumed.set_epoch(0)  # what a trainer calls before every pass: the same epoch keeps its place
    assert seen + epoch_rows(resumed) == full
    # after a full epoch the position resets: iterating again gives the whole epoch
    assert epoch_rows(resumed) == full
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # another epoch starts from its beginning
    assert len(epoch_rows(resumed)) == len(full)


@pytest.mark.parametrize(("world_size", "packs_per_batch"), [(2, 3), (3, 2)])
def test_ranks_get_equal_batches_and_every_usable_row_exactly_once(
    samples, world_size, packs_per_batch
):
    # 120 rows make 32 packs: 2 ranks x 3 leave 2 for the last step (one each); 3 ranks x 2
    # leave 2 for 3 ranks, and the third rank's last batch is its filler
    ranks = [
        packed(samples, packs_per_batch=packs_per_batch, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    batches = [list(PackedDataLoader(d, num_workers=2)) for d in ranks]
    assert len({len(mine) for mine in batches}) == 1  # no rank waits for another at the end
    rows = [row for mine in batches for b in mine for row in b["sample_index"].tolist()]
    dropped = ranks[0].plan(0).dropped
    assert sorted(rows) == sorted(ranks[0].plan(0).rows.tolist())  # every planned row once
    assert len(rows) + sum(dropped.values()) == len(samples)  # the rest counted, by reason
    assert LEFT_OUT_TO_EQUALISE_RANKS not in dropped
    fillers = [b for mine in batches for b in mine if b.get("filler")]
    assert len(fillers) == (world_size == 3)
    for filler in fillers:  # a copy of another rank's pack that trains nothing
        assert (filler["labels"] == -100).all() and len(filler["sample_index"]) == 0
        assert not filler["real_token_mask"].any() and filler["batch_index"] == len(batches[0]) - 1
        assert not filler["dropped"] and not filler["dropped_rows"]  # the copied batch counts them
    # each rank's epoch report, merged, holds rows read == samples + dropped (a filler adds none)
    reports = []
    for dataset, mine in zip(ranks, batches):
        report = PackReport()
        for batch in mine:
            report.add_batch(batch)
        report.add_loader(PackedDataLoader(dataset, num_workers=0))
        reports.append(report)
    merged = PackReport.merged(reports)
    assert merged.samples + sum(merged.dropped.values()) == len(samples)
    assert sum(merged.images_per_row) == sum(samples.dataset[r]["images"].__len__() for r in rows)


def test_filtered_and_broken_samples_are_counted(tokenizer):
    good = image_cell(Image.new("RGB", (8, 8)))
    turn = [{"user": "What?", "assistant": "This.", "source": "test"}]
    rows = Dataset.from_list(
        [{"images": [good], "texts": turn} for _ in range(10)]
        + [{"images": [good] * 3, "texts": turn}]  # too many images for a budget of 2
        + [{"images": [], "texts": [{"user": "Q", "assistant": "w " * 600, "source": "t"}]}]
        + [{"images": [{"bytes": b"broken", "path": None}], "texts": turn}]  # fails at decode
        + [{"images": [good], "texts": []}],  # no conversation
        features=FEATURES,
    )
    dataset = PackedDataset(
        VQADataset(rows, tokenizer, image_size=IMAGE_SIZE),
        config=PackingConfig(max_length=256, max_images=2, packs_per_batch=2),
    )
    batches = list(PackedDataLoader(dataset, num_workers=2))
    used = sorted(row for b in batches for row in b["sample_index"].tolist())
    assert used == list(range(10))
    assert dataset.plan(0).dropped == {TOO_MANY_IMAGES: 1, TOO_LONG: 1, NO_TEXTS: 1}
    dropped_at_decode = sum(b["dropped"].get(UNDECODABLE_IMAGE, 0) for b in batches)
    assert dropped_at_decode == 1


def test_a_plain_dataloader_with_collate_packs_gives_the_same_batches(samples):
    dataset = packed(samples)
    plain = DataLoader(dataset, batch_size=4, collate_fn=collate_packs, num_workers=2)
    assert epoch_rows(plain) == epoch_rows(PackedDataLoader(packed(samples), num_workers=2))


def test_default_packs_fill_the_default_dataset(samples):
    dataset = packed(samples)
    packs = dataset.plan(0).packs()
    used = sum(int(dataset.weights.lengths[p].sum()) for p in packs)
    assert used / (len(packs) * 512) > 0.9
    assert all(dataset.weights.image_counts[p].sum() <= dataset.max_images for p in packs)
