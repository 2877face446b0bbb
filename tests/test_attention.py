"""Packed batches keep samples apart under every attention implementation, through transformers'
real code: eager, sdpa, flex_attention, and FlashAttention's routing (with reference kernels on
the CPU). The check everywhere: the summed loss of a packed batch equals that of running each of
its samples alone (relative difference < 1e-5, float32)."""

import pytest
import torch
from conftest import ATTENTION_IMPLEMENTATIONS, PACKED_LENGTH, tiny_llama, tiny_vlm_losses
from transformers import DataCollatorWithFlattening

from mmdp import config
from mmdp.batch import collate_packs, layout_pack
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.models.attention import reference_flash_attn_func, reference_flash_attn_varlen_func
from mmdp.models.inputs import MIN_TRANSFORMERS, check_transformers, model_inputs
from mmdp.packing.packing_config import PackingConfig
from mmdp.training.loss import summed_loss

VOCAB = 97
MAX_LENGTH = PACKED_LENGTH
# Samples of these lengths, pack by pack, in packs of MAX_LENGTH tokens: each "no_padding" pack
# exactly full, each "padding_tail" pack ending in padding. flex_attention compiles its kernels
# for each shape of the batch (20-40 s of CPU a shape on 2 cores): batches of 1 and 2 packs of
# PACKED_LENGTH tokens, the 2 packs the shape every family's test and TinyVLM's run in
# (conftest.two_packs_of_three), so they compile once between them.
PACKS = {
    "no_padding": [[140, 100, 80], [120, 200]],
    "padding_tail": [[120, 80, 60], [100, 140]],
}


def random_sample(row: int, length: int, generator: torch.Generator) -> dict:
    """A VQADataset-like text sample: random ids, about half of them trained."""
    input_ids = torch.randint(0, VOCAB, (length,), generator=generator)
    trained = torch.rand(length, generator=generator) < 0.5
    labels = torch.where(trained, input_ids, config.IGNORE_INDEX)
    images = torch.zeros(0, 3, 8, 8)
    return {
        "row": row,
        "input_ids": input_ids,
        "labels": labels,
        "pixel_values": images,
        "image_count": 0,
        "patches": 0,
        "converted": {},
    }


def packed_batch(num_packs: int, layout: str) -> tuple[dict, list[dict]]:
    """A batch of the layout's first num_packs packs, laid out and collated by mmdp's own code."""
    generator = torch.Generator().manual_seed(num_packs * 100 + len(layout))
    packs, samples = [], []
    for lengths in PACKS[layout][:num_packs]:
        mine = [random_sample(len(samples) + i, n, generator) for i, n in enumerate(lengths)]
        samples += mine
        pack = layout_pack(mine, MAX_LENGTH, pad_token_id=0)
        packs.append({**pack, "batch_index": 0, "dropped": {}})
    return collate_packs(packs), samples


def loss_alone(samples: list[dict]) -> float:
    """Each sample on its own, under eager attention: no mask can leak there."""
    model = tiny_llama(VOCAB, "eager")
    with torch.no_grad():
        return sum(
            float(summed_loss(model(input_ids=s["input_ids"][None]).logits, s["labels"][None]))
            for s in samples
        )


def relative_difference(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# Every implementation on every layout. flex_attention compiles its kernels for each shape (the
# first compile in a process also starts inductor: 30 s to minutes on a busy 2-core machine), so it
# runs with the slow group (uv run pytest -m slow); the default suite checks the other three.
LAYOUTS = [
    pytest.param(
        num_packs,
        layout,
        attention,
        id=f"{layout}-{num_packs}-{attention}",
        marks=pytest.mark.slow if attention == "flex_attention" else (),
    )
    for layout in PACKS
    for num_packs in (1, 2)
    for attention in ATTENTION_IMPLEMENTATIONS
]
# The tiny VLM likewise: flex_attention with the slow group.
WITH_IMAGES = [
    pytest.param(name, marks=pytest.mark.slow) if name == "flex_attention" else name
    for name in ATTENTION_IMPLEMENTATIONS
]


@pytest.mark.parametrize(("num_packs", "layout", "attention"), LAYOUTS, indirect=["attention"])
def test_packed_loss_equals_one_sample_at_a_time(attention, num_packs, layout):
    batch, samples = packed_batch(num_packs, layout)
    real_tokens = batch["real_token_mask"].sum(dim=1)
    assert batch["input_ids"].shape == (num_packs, MAX_LENGTH)
    assert ((real_tokens < MAX_LENGTH) == (layout == "padding_tail")).all()  # the layout's own
    model = tiny_llama(VOCAB, attention)
    with torch.no_grad():
        packed = summed_loss(model(**model_inputs(batch)).logits, batch["labels"])
    assert relative_difference(float(packed), loss_alone(samples)) < 1e-5


@pytest.mark.parametrize("attention", ["flash_attention_2"], indirect=True)
def test_flash_attention_mixes_several_packs_without_its_kwargs(attention):
    """The trap: FlashAttention reads restarting position_ids only when the batch has one row.
    With several rows and no cu_seq_lens_* / max_length_*, it attends over each whole row."""
    model = tiny_llama(VOCAB, attention)
    for num_packs, mixed in ((1, False), (2, True)):
        batch, samples = packed_batch(num_packs, "padding_tail")
        without_kwargs = {k: batch[k] for k in ("input_ids", "labels", "position_ids")}
        with torch.no_grad():
            loss = summed_loss(model(**without_kwargs, use_cache=False).logits, batch["labels"])
        assert (relative_difference(float(loss), loss_alone(samples)) > 1e-3) == mixed


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["flex_attention"], indirect=True)
def test_flex_attention_keeps_the_samples_its_positions_say(attention):
    """flex_attention's negative control, on the kernel every [2, PACKED_LENGTH] batch shares: the
    kernel takes each batch's mask as an input, made from its restarting position_ids
    (transformers/masking_utils.py:750-778 and 873-881). Each pack given the other pack's
    positions, its samples are cut where the other's are: the loss is no longer theirs."""
    model = tiny_llama(VOCAB, attention)
    for layout in PACKS:
        batch, samples = packed_batch(2, layout)
        inputs = model_inputs(batch)
        swapped = {**inputs, "position_ids": inputs["position_ids"].flip(0)}
        with torch.no_grad():
            loss = summed_loss(model(**swapped).logits, batch["labels"])
        assert relative_difference(float(loss), loss_alone(samples)) > 1e-3, layout


@pytest.mark.parametrize("attention", ["sdpa"], indirect=True)
def test_the_other_traps_break_the_check(attention):
    """use_cache left on, a 2-D attention mask, or contiguous positions: samples see each other."""
    batch, samples = packed_batch(2, "padding_tail")
    inputs = model_inputs(batch)
    model = tiny_llama(VOCAB, attention)
    real = batch["real_token_mask"].long()
    with torch.no_grad():
        wrong = {
            "use_cache": model(**{**inputs, "use_cache": True}).logits,
            "attention_mask": model(**inputs, attention_mask=real).logits,
            "contiguous positions": model(input_ids=inputs["input_ids"], use_cache=False).logits,
        }
    alone = loss_alone(samples)
    for trap, logits in wrong.items():
        assert relative_difference(float(summed_loss(logits, batch["labels"])), alone) > 1e-3, trap


@pytest.fixture(scope="module")
def image_samples(tokenizer):
    return VQADataset(load_vqa_dataset(num_rows=40), tokenizer, image_size=32)


@pytest.mark.parametrize("attention", WITH_IMAGES, indirect=True)
def test_tiny_vlm_with_images_keeps_packed_samples_apart(attention, image_samples, tokenizer):
    config = PackingConfig(max_length=PACKED_LENGTH, packs_per_batch=2)  # flex: a shared kernel
    batch = next(iter(PackedDataLoader(PackedDataset(image_samples, config=config), num_workers=0)))
    assert len(batch["pixel_values"]) >= 2 and len(batch["samples_per_pack"]) == 2
    packed, alone = tiny_vlm_losses(batch, image_samples.__getitem__, tokenizer, attention)
    assert relative_difference(packed, alone) < 1e-5


def test_same_as_transformers_flattening_collator(image_samples):
    """One pack without padding: the same position_ids, boundaries and labels as
    transformers.DataCollatorWithFlattening for the same samples."""
    samples = [image_samples[row] for row in range(6)]
    samples = [s for s in samples if s["drop_reason"] is None][:4]
    total = sum(len(s["input_ids"]) for s in samples)
    ours = collate_packs([{**layout_pack(samples, total, 0), "batch_index": 0, "dropped": {}}])
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)(
        [{"input_ids": s["input_ids"], "labels": s["labels"]} for s in samples]
    )
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(ours[key], theirs[key]), key
        assert ours[key].dtype == theirs[key].dtype, key
    assert ours["max_length_q"] == theirs["max_length_q"] == ours["max_length_k"]
    assert isinstance(theirs["max_length_k"], int)


def test_a_transformers_that_mixes_packed_samples_is_refused():
    with pytest.raises(RuntimeError, match=f"transformers>={MIN_TRANSFORMERS}"):
        check_transformers("4.53.0")
    check_transformers("4.53.1")
    check_transformers("5.0.0")


@pytest.mark.parametrize("attention", ["sdpa"], indirect=True)
def test_in_bf16_packing_differs_by_rounding_not_leakage(attention, image_samples, tokenizer):
    """bf16 rounds differently in a pack than alone: a looser check (rel < 1e-4) still separates
    that from samples seeing each other (which costs more than 1e-3 even in bf16)."""
    loader = PackedDataLoader(
        PackedDataset(image_samples, config=PackingConfig(packs_per_batch=1)), num_workers=0
    )
    batch = next(iter(loader))
    assert batch["samples_per_pack"].min() >= 2  # one pack of several samples: they could mix
    model = tiny_llama(len(tokenizer), attention).to(torch.bfloat16)
    rows = batch["sample_index"].tolist()
    with torch.no_grad():
        alone = sum(
            float(summed_loss(model(input_ids=s["input_ids"][None]).logits, s["labels"][None]))
            for s in (image_samples[row] for row in rows)
        )
        packed = summed_loss(model(**model_inputs(batch)).logits, batch["labels"])
        mixed = summed_loss(model(input_ids=batch["input_ids"]).logits, batch["labels"])
    assert relative_difference(float(packed), alone) < 1e-4
    assert relative_difference(float(mixed), alone) > 1e-3


def test_the_reference_kernels_honour_window_size_as_flash_attn_does():
    """window_size=(left, right): keys at most `left` before and `right` after each query (-1: no
    limit), queries aligned bottom-right. With equal scores each query averages the values of
    the keys it sees: values 0..4, causal, window (1, -1) -> each value with the one before."""
    values = torch.arange(5.0).view(1, 5, 1, 1)  # [batch, length, heads, dim]
    zeros = torch.zeros(1, 5, 1, 1)

    def averages(q, **kwargs) -> list[float]:
        return reference_flash_attn_func(q, zeros, values, **kwargs).flatten().tolist()

    assert averages(zeros, causal=True) == pytest.approx([0, 0.5, 1, 1.5, 2])
    assert averages(zeros, causal=True, window_size=(1, -1)) == pytest.approx(
        [0, 0.5, 1.5, 2.5, 3.5]
    )
    assert averages(zeros, window_size=(1, 1)) == pytest.approx([0.5, 1, 2, 3, 3.5])
    assert averages(zeros[:, 3:], causal=True, window_size=(1, -1)) == pytest.approx([2.5, 3.5])
    bounds = torch.tensor([0, 3, 5], dtype=torch.int32)  # two sequences: 0, 1, 2 and 3, 4
    varlen = reference_flash_attn_varlen_func(
        zeros[0], zeros[0], values[0], bounds, bounds, causal=True, window_size=(1, -1)
    )
    assert varlen.flatten().tolist() == pytest.approx([0, 0.5, 1.5, 3, 3.5])
