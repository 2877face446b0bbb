"""The blog's knapsacks as it writes them, each held to the library's fast packer: stage 4's loops
(mmdp.packing.knapsack: the blog's packs, the producer-consumer) and stage 5's
ConstantLengthDataset (mmdp.loading.constant_length: its balanced greedy knapsack, its packs
beside PackedDataset's samples on the same rows, its sharding, its producer's errors, its batch
against mmdp.batch's contract and, through a real model, each sample seeing only itself)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdp.packing.knapsack import bin_packing, greedy_packing, packs_in_background
from mmdp.packing.packers import pack

BLOG_ITEMS = list(range(1, 25))  # the blog's toy: start=1, end=25, max_length 100
BLOG_PACKS = {  # what the blog prints
    "greedy": [list(range(1, 14)), list(range(14, 20)), list(range(20, 24)), [24]],
    "binpack": [[24, 23, 22, 21, 10], [20, 19, 18, 17, 16, 9, 1], [15, 14, 13, 12, 11, *range(8, 1, -1)]],
}  # fmt: skip
LOOPS = {
    "greedy": lambda items, budget: list(greedy_packing(items, budget)),
    "binpack": bin_packing,
}


@pytest.mark.parametrize("strategy", ["greedy", "binpack"])
def test_the_loops_and_the_producer_print_the_blogs_packs(strategy):
    assert LOOPS[strategy](BLOG_ITEMS, 100) == BLOG_PACKS[strategy]
    assert list(packs_in_background(BLOG_ITEMS, 100, strategy)) == BLOG_PACKS[strategy]


def test_hand_worked_packs():
    # max_length 7, items 5, 3, 3, 1:
    # greedy: 5 | 3+3 (5+3 > 7) | then 1 fits (7)
    assert list(greedy_packing([5, 3, 3, 1], 7)) == [[5], [3, 3, 1]]
    # binpack: 5 -> A (5); 3 -> A? 8 > 7 -> B (3); 3 -> B (6); 1 -> A, the first with room (6)
    assert bin_packing([5, 3, 3, 1], 7) == [[5, 1], [3, 3]]


def test_items_longer_than_a_pack_are_skipped_as_the_blog_does():
    assert list(greedy_packing([2, 9, 3], 5)) == [[2, 3]]
    assert bin_packing([2, 9, 3], 5) == [[3, 2]]


def test_the_producer_packs_a_stream_a_buffer_at_a_time():
    # binpack sorts each buffer of 3 alone: 1 2 3 | 4 5 6, max_length 7
    assert list(packs_in_background(range(1, 7), 7, "binpack", buffer_size=3)) == [
        [3, 2, 1],
        [6],
        [5],
        [4],
    ]
    with pytest.raises(ValueError, match="unknown strategy"):
        next(packs_in_background([1], 7, "bfd"))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 60), max_size=80),
    st.integers(1, 60),
    st.sampled_from(["greedy", "binpack"]),
)
def test_the_fast_packer_gives_the_loops_packs(items, max_length, strategy):
    items = [item for item in items if item <= max_length]  # the loops skip them, pack refuses
    fast = [[items[i] for i in p] for p in pack(items, max_length=max_length, strategy=strategy)]
    assert fast == LOOPS[strategy](items, max_length)


@pytest.mark.parametrize("strategy", ["greedy", "binpack"])
def test_the_fast_packer_gives_the_loops_packs_on_a_long_run(strategy):
    rng = random.Random(0)
    items = [rng.randint(1, 4096) for _ in range(3000)]
    fast = [[items[i] for i in p] for p in pack(items, max_length=4096, strategy=strategy)]
    assert fast == LOOPS[strategy](items, 4096)


# Stage 5's ConstantLengthDataset as the blog writes it (mmdp.loading.constant_length) ----------
# Its knapsack held to the library's packer, its packs to PackedDataset's samples, its batches to
# mmdp.batch's contract and, through a real model, to each sample alone.

import torch  # noqa: E402
from conftest import tiny_llama  # noqa: E402

from mmdp.config import IGNORE_INDEX  # noqa: E402
from mmdp.data.families import OFFLINE  # noqa: E402
from mmdp.drop_reasons import TOO_LONG  # noqa: E402
from mmdp.loading import constant_length  # noqa: E402
from mmdp.loading.constant_length import (  # noqa: E402
    DELTA,
    ConstantLengthDataset,
    _balanced_greedy_knapsack,
)
from mmdp.packing.packers import BALANCED_GREEDY_EXTRA_PACKS  # noqa: E402


def test_the_balanced_greedy_knapsack_by_hand():
    # 8 tokens and 2 images a pack, delta 0: 16 tokens, so packs A and B to start. Longest first:
    # 6 (1 image) -> A; 5 (2 images) -> B, the emptier; 3 (1 image): B (5 tokens) before A (6),
    # but B holds 2 images and A would hold 9 tokens -> a new pack C; 2 -> C, the emptiest (3).
    sizes = [(3, 1, 0), (6, 1, 0), (2, 0, 0), (5, 2, 0)]
    assert _balanced_greedy_knapsack(sizes, (8, 2, None), delta=0) == [[1], [3], [0, 2]]
    # without the image budget: 3 -> B (5 < 6, 8 tokens), 2 -> A (8 tokens)
    assert _balanced_greedy_knapsack(sizes, (8, None, None), delta=0) == [[1, 2], [3, 0]]
    # the blog's delta opens 5 packs more: each sample alone, as the library's packer does
    assert _balanced_greedy_knapsack(sizes, (8, None, None)) == [[1], [3], [0], [2]]
    assert pack([3, 6, 2, 5], max_length=8, strategy="balanced_greedy") == [[1], [3], [0], [2]]
    assert DELTA == BALANCED_GREEDY_EXTRA_PACKS


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 60), st.integers(0, 4), st.integers(0, 90)), max_size=60),
    st.integers(60, 120),
    st.sampled_from([None, 4, 9]),
    st.sampled_from([None, 90, 200]),
)
def test_the_blogs_knapsack_makes_the_packers_balanced_greedy_packs(
    sizes, max_length, max_images, max_patches
):
    """The blog's loop, item by item, and the library's engines (mmdp.packing.packers.pack):
    the same packs in the same order, under every budget."""
    lengths, images, patches = (list(column) for column in zip(*sizes)) if sizes else ([], [], [])
    fast = pack(lengths, max_length=max_length, strategy="balanced_greedy",
                image_counts=images, max_images=max_images,
                patch_counts=patches if max_patches else None, max_patches=max_patches)  # fmt: skip
    assert _balanced_greedy_knapsack(sizes, (max_length, max_images, max_patches)) == fast


class Samples:
    """A VQADataset's face (len, getitem, family) over ready samples."""

    def __init__(self, samples: list[dict], family):
        self.samples, self.family = samples, family

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index: int) -> dict:
        return self.samples[index]


def text_sample(row: int, length: int, generator: torch.Generator, vocab: int = 97) -> dict:
    """A text-only sample: random ids, about half of them trained."""
    input_ids = torch.randint(0, vocab, (length,), generator=generator)
    labels = torch.where(torch.rand(length, generator=generator) < 0.5, input_ids, IGNORE_INDEX)
    return {"row": row, "input_ids": input_ids, "labels": labels, "image_count": 0,
            "patches": 0, "converted": {}, "drop_reason": None,
            "pixel_values": torch.zeros(0, 3, 8, 8)}  # fmt: skip


@pytest.fixture(scope="module")
def cauldron(tokenizer):
    """160 rows of the embedded dataset as stage 5 reads them (VQADataset, TinyVLM)."""
    from mmdp.data.reading.settings import DataSettings
    from mmdp.data.vqa_dataset import VQADataset

    return VQADataset(DataSettings(num_rows=160).load(), tokenizer)


def test_on_the_same_rows_its_packs_are_the_packers_and_its_samples_packed_datasets(cauldron):
    """One buffer, read in make_base_iterator's order: the packs are mmdp.pack's balanced greedy
    packs of those samples, and the samples packed are the ones PackedDataset plans (the same
    filter: 19 rows over 256 tokens)."""
    from mmdp.loading.packed_dataset import PackedDataset
    from mmdp.packing.packing_config import PackingConfig

    dataset = ConstantLengthDataset(cauldron, max_length=256, max_images=3)
    packs = list(dataset)
    dropped = [row for p in packs for row in p["dropped_rows"]]
    assert {reason for _, reason in dropped} == {TOO_LONG}
    read = [i for i in dataset.make_base_iterator() if i not in dict(dropped)]
    size = {  # each sample's tokens and images, as its pack holds them
        row: (tokens, vision["image_count"])
        for p in packs
        for row, tokens, vision in zip(p["sample_index"], p["seq_lens"], p["vision"])
    }
    lengths, images = zip(*(size[i] for i in read))
    expected = pack(lengths, max_length=256, strategy="balanced_greedy",
                    image_counts=images, max_images=3)  # fmt: skip
    mine = sorted(sorted(p["sample_index"]) for p in packs if p["sample_index"])
    assert mine == sorted(sorted(read[i] for i in p) for p in expected)

    config = PackingConfig(max_length=256, max_images=3)
    plan = PackedDataset(cauldron, config=config).plan()
    assert set(plan.rows.tolist()) == {row for p in packs for row in p["sample_index"]}
    assert plan.dropped == {TOO_LONG: len(dropped)} and len(dropped) == 19


def test_every_row_read_once_over_ranks_and_workers(cauldron, monkeypatch):
    """make_base_iterator: 2 ranks x 2 workers share the shuffled indices, none twice, none lost;
    another epoch shuffles them otherwise."""
    dataset = ConstantLengthDataset(cauldron)
    shares = []
    for rank in range(2):
        for worker in range(2):
            info = type("WorkerInfo", (), {"id": worker, "num_workers": 2})
            monkeypatch.setattr(constant_length, "get_worker_info", lambda info=info: info)
            monkeypatch.setattr(constant_length.dist, "is_initialized", lambda: True)
            monkeypatch.setattr(constant_length.dist, "get_world_size", lambda: 2)
            monkeypatch.setattr(constant_length.dist, "get_rank", lambda rank=rank: rank)
            shares.append(list(dataset.make_base_iterator()))
    rows = [row for share in shares for row in share]
    assert sorted(rows) == list(range(len(cauldron))) and {len(s) for s in shares} == {40}
    dataset.set_epoch(1)
    assert list(dataset.make_base_iterator()) != shares[-1]


def test_a_producer_that_raises_reaches_the_consumer(cauldron):
    """The blog's consumer waits on queue.get() for ever when its producer dies; here the
    error comes out of the loop."""

    class Broken(Samples):
        def __getitem__(self, index):
            if index == 5:
                raise OSError("the disk went away")
            return super().__getitem__(index)

    samples = [text_sample(i, 20, torch.Generator().manual_seed(i)) for i in range(10)]
    with pytest.raises(OSError, match="the disk went away"):
        list(ConstantLengthDataset(Broken(samples, cauldron.family), max_length=64))


def test_rows_no_pack_follows_are_reported_by_a_pack_of_no_sample(cauldron):
    """Every row over the budget: no pack to carry the drops, so a pack of no sample does; it
    trains nothing (all padding, every label -100)."""
    generator = torch.Generator().manual_seed(0)
    samples = [text_sample(0, 100, generator), text_sample(1, 90, generator)]
    dataset = ConstantLengthDataset(Samples(samples, cauldron.family), max_length=64)
    batch = dataset.collate(list(dataset))
    assert batch["dropped"] == {TOO_LONG: 2} and batch["samples_per_pack"].tolist() == [0]
    assert not batch["real_token_mask"].any() and (batch["labels"] == IGNORE_INDEX).all()


FAMILIES = ["tiny", *(pytest.param(name, marks=pytest.mark.slow) for name in sorted(OFFLINE))]


@pytest.mark.parametrize("model", FAMILIES)
def test_its_batch_is_mmdp_batchs_contract(model, cauldron):
    """The same samples laid out and collated by mmdp.batch (the library's loaders) and by the
    blog's _pack_one_group and collate: every key equal, for TinyVLM and (-m slow) every real
    family (Qwen-VL's 4-row positions and token types, SmolVLM's tiles, LLaVA's image counts;
    the videos of those that take them)."""
    from mmdp.batch import collate_packs, layout_pack
    from mmdp.data.families import family_for, tiny_processor
    from mmdp.data.reading.sources import load_synthetic_videos, with_videos
    from mmdp.data.vqa_dataset import VQADataset

    rows = cauldron
    if model != "tiny":  # and for a family that takes video, two clips
        processor = tiny_processor(model)
        videos = load_synthetic_videos(2) if family_for(processor).video_token else None
        rows = VQADataset(
            cauldron.dataset if videos is None else with_videos(cauldron.dataset, videos), processor
        )
    family = rows.family
    dataset = ConstantLengthDataset(rows, max_length=4096)
    samples = [rows[i] for i in range(20)]
    fits = [s for s in samples if s["drop_reason"] is None and len(s["input_ids"]) < 600]
    clips = [rows[i] for i in range(len(cauldron), len(rows))]
    clips = [clip for clip in clips if clip["drop_reason"] is None]  # those the family takes
    groups = [fits[:3] + clips[:1], fits[3:5] + clips[1:]]  # images among them, clips with them
    assert sum(s["image_count"] for g in groups for s in g) > 0
    mine = dataset.collate([dataset._pack_one_group(group) for group in groups])
    packs = [layout_pack(g, 4096, family.pad_token_id, family) for g in groups]
    theirs = collate_packs([{**p, "batch_index": 0, "dropped": {}} for p in packs], family)
    assert set(mine) == set(theirs) - {"batch_index"} | {"epoch"}
    assert {clip["row"] for clip in clips} <= set(mine["sample_index"].tolist())
    for key in set(theirs) - {"batch_index", "dropped_rows"}:
        same = torch.equal if isinstance(theirs[key], torch.Tensor) else (lambda a, b: a == b)
        assert same(mine[key], theirs[key]), key
    if model == "tiny":  # positions restart at each sample and the padding run (the blog's: 0)
        assert (mine["position_ids"] == 0).sum(dim=1).tolist() == [4, 3]


@pytest.mark.parametrize("attention", ["eager", "sdpa", "flash_attention_2"], indirect=True)
def test_through_a_model_each_packed_sample_sees_only_itself(attention, cauldron):
    """A real transformers model (tests/test_attention.py's tiny Llama) on the blog's packs, as
    model_inputs passes them: each sample's loss is its loss alone. Negative control: the blog's
    own batch (one attention mask of ones over the pack, positions running on) mixes them."""
    from mmdp.models.inputs import model_inputs
    from mmdp.training.loss import summed_loss

    generator = torch.Generator().manual_seed(0)
    samples = [text_sample(i, n, generator) for i, n in enumerate((120, 80, 60, 100, 140))]
    dataset = ConstantLengthDataset(Samples(samples, cauldron.family), max_length=320)
    batch = dataset.collate(
        [dataset._pack_one_group(samples[:3]), dataset._pack_one_group(samples[3:])]
    )
    model = tiny_llama(97, attention)
    with torch.no_grad():
        alone = sum(
            float(summed_loss(model(input_ids=s["input_ids"][None]).logits, s["labels"][None]))
            for s in samples
        )
        packed = float(summed_loss(model(**model_inputs(batch)).logits, batch["labels"]))
        blogs = {
            "input_ids": batch["input_ids"],
            "attention_mask": torch.ones_like(batch["input_ids"]),
        }
        mixed = float(summed_loss(model(**blogs, use_cache=False).logits, batch["labels"]))
    assert abs(packed - alone) / alone < 1e-5
    assert abs(mixed - alone) / alone > 1e-3
