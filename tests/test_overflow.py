"""Over-long rows fitted, by choice (PackingConfig(overflow="truncate"), mmdp.weighing.overflow):
every over-long row whose text can be cut is kept, weighed at the length of the sample built
from it, counted (`truncated`), and trained exactly as the same cut sample alone; a row whose
image ends past the budget, or whose reply starts past it, is still `too_long`.
"""

import dataclasses
import json

import pytest
import torch
from conftest import ATTENTION_IMPLEMENTATIONS, PACKED_LENGTH, tiny_vlm_losses
from datasets import Dataset
from test_families import cell, language_model, summed_losses_alone, summed_losses_packed, turn

from mmdp import config
from mmdp.data.families import family_for, tiny_processor
from mmdp.data.reading.sources import FEATURES
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import UserError
from mmdp.flags import parse_flags
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.loading.streaming import StreamingPackedDataset
from mmdp.models.attention import use_attention
from mmdp.models.tiny import tiny_model
from mmdp.packing.packing_config import PackingConfig
from mmdp.report.pack_report import PackReport
from mmdp.weighing.overflow import cut_length, media_end, truncate_sample

IGNORE = config.IGNORE_INDEX


# The rule, on hand-worked labels ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "media_ends_at", "max_length", "expected"),
    [
        # 12 tokens, the reply from token 5: cut at 8 when the image ends by then
        ([IGNORE] * 5 + [7] * 7, 3, 8, 8),
        ([IGNORE] * 5 + [7] * 7, 8, 8, 8),  # the image ends exactly at the cut: kept whole
        ([IGNORE] * 5 + [7] * 7, 9, 8, 0),  # the cut would fall inside the image: too_long
        ([IGNORE] * 5 + [7] * 7, 0, 5, 0),  # no reply token in the first 5: nothing to train
        ([7] + [IGNORE] * 11, 0, 8, 0),  # only token 0 trained: a pack never trains it
        ([IGNORE] * 3 + [7] * 3, 9, 8, 6),  # fits: its own length, whatever its media
    ],
)
def test_cut_length_keeps_media_whole_and_a_trained_token(
    labels, media_ends_at, max_length, expected
):
    assert cut_length(torch.tensor(labels), media_ends_at, max_length) == expected


def test_overflow_is_validated_and_a_flag_a_resume_must_match():
    with pytest.raises(ValueError, match="overflow must be one of"):
        PackingConfig(overflow="wrap")
    assert parse_flags(PackingConfig, "", ["--overflow", "truncate"]).overflow == "truncate"
    assert parse_flags(PackingConfig, "", []).overflow == "drop"
    assert PackingConfig(overflow="truncate").settings()["overflow"] == "truncate"


# TinyVLM: every over-long text row kept, exact ---------------------------------------------------


LONG_REPLY = " ".join(["The box is red and square."] * 60)  # about 420 TinyVLM tokens


@pytest.fixture(scope="module")
def tiny_rows(tokenizer):
    """Two rows over PACKED_LENGTH tokens (an image, then a long reply) and six short ones."""
    rows = [{"images": [cell(32, 32)], "texts": [turn("Describe it.", LONG_REPLY)]}] * 2 + [
        {"images": [cell(32, 32)], "texts": [turn("Colour?", f"Red, {k}.")]} for k in range(6)
    ]
    return VQADataset(Dataset.from_list(rows, features=FEATURES), tokenizer, image_size=32)


def epoch(samples, overflow: str) -> tuple[PackedDataset, PackReport]:
    packing = PackingConfig(max_length=PACKED_LENGTH, packs_per_batch=2, overflow=overflow)
    dataset = PackedDataset(samples, config=packing, rank=0, world_size=1)
    return dataset, PackReport.of_epoch(PackedDataLoader(dataset, num_workers=0))


def test_truncate_keeps_every_over_long_text_row_weighed_as_built(tiny_rows):
    dropped, report = epoch(tiny_rows, "drop")
    too_long = report.dropped["too_long"]
    assert too_long == 2 and report.truncated == 0
    longest = int(dropped.weights.lengths.max())  # 99% of 8 rows is all 8: the longest
    assert report.budget_hint() == [
        f"--max-length that keeps 99% / 100% of the rows whole: {longest} / {longest} "
        "(or --overflow truncate: cut at --max-length)"
    ]
    fitted, report = epoch(tiny_rows, "truncate")
    assert len(fitted.truncated_rows) == too_long
    assert report.samples == len(tiny_rows) and not report.dropped
    assert report.truncated == too_long and f"({too_long} truncated to max_length)" in (
        report.summary()
    )
    assert report.budgets_to_keep is None  # nothing dropped: no hint
    for row in fitted.truncated_rows.tolist():
        built = truncate_sample(tiny_rows[row], PACKED_LENGTH, tiny_rows.family)
        assert built["truncated"] and len(built["input_ids"]) == PACKED_LENGTH
        assert fitted.weights.lengths[row] == PACKED_LENGTH  # the weight is the built sample
        assert dropped.weights.lengths[row] > PACKED_LENGTH
    # the rows that fit are untouched: the same weights, the same samples
    fits = dropped.weights.lengths <= PACKED_LENGTH
    assert (fitted.weights.lengths[fits] == dropped.weights.lengths[fits]).all()


def test_an_eval_dataset_with_another_overflow_fits_its_rows_again(tiny_rows):
    packing = PackingConfig(max_length=PACKED_LENGTH, packs_per_batch=2)
    train = PackedDataset(tiny_rows, config=packing, rank=0, world_size=1, eval_ratio=0.5)
    held_out = train.eval_dataset(dataclasses.replace(packing, overflow="truncate"))
    assert train.truncated_rows.tolist() == [] and held_out.truncated_rows.tolist() == [0, 1]
    assert (held_out.weights.lengths[:2] == PACKED_LENGTH).all()
    assert (train.weights.lengths[:2] > PACKED_LENGTH).all()


def test_the_streaming_loader_refuses_truncate_in_one_sentence(tokenizer):
    with pytest.raises(UserError, match="needs the planned loader"):
        StreamingPackedDataset([], tokenizer, config=PackingConfig(overflow="truncate"))


def test_a_row_whose_image_ends_past_the_budget_or_reply_starts_past_it_is_still_too_long(
    tokenizer,
):
    long_text = " ".join(["word"] * 400)
    rows = [
        # the image tagged in the last turn, after 400 words: a cut would fall before it
        {
            "images": [cell(32, 32)],
            "texts": [turn(long_text, "Yes."), turn("And <image>?", "A red box.")],
        },
        # the first user turn alone is over the budget: no reply token would be kept
        {"images": [], "texts": [turn(long_text, "Yes.")]},
        # the image first, then a long reply: cut
        {"images": [cell(32, 32)], "texts": [turn("Describe it.", long_text)]},
    ]
    samples = VQADataset(Dataset.from_list(rows, features=FEATURES), tokenizer, image_size=32)
    dataset, report = epoch(samples, "truncate")
    assert dataset.truncated_rows.tolist() == [2]
    assert report.dropped == {"too_long": 2} and report.truncated == 1
    hint = report.budget_hint()
    assert len(hint) == 2 and "images or videos end past --max-length" in hint[1]


@pytest.mark.parametrize(
    "attention",
    [
        pytest.param(a, marks=pytest.mark.slow) if a != "sdpa" else a
        for a in ATTENTION_IMPLEMENTATIONS
    ],
    indirect=True,
)
def test_a_truncated_tiny_vlm_sample_packed_has_its_loss_alone(attention, tiny_rows, tokenizer):
    dataset, _ = epoch(tiny_rows, "truncate")
    truncated = set(dataset.truncated_rows.tolist())
    batch = next(
        b
        for b in PackedDataLoader(dataset, num_workers=0)
        if truncated & set(b["sample_index"].tolist())
    )
    assert len(batch["samples_per_pack"]) == 2  # [2, PACKED_LENGTH]: flex's shared kernel

    def alone(row: int) -> dict:
        return truncate_sample(tiny_rows[row], PACKED_LENGTH, tiny_rows.family)

    packed, one_at_a_time = tiny_vlm_losses(batch, alone, tokenizer, attention)
    assert abs(packed - one_at_a_time) / abs(one_at_a_time) < 1e-5


# A real family: the cut after the image's closing token, exact in the real class ---------------


# Every family under every attention its class accepts: the slow group (a tiny model each).
FAMILIES = ("qwen2_5_vl", "qwen3_vl", "smolvlm", "llava_onevision", "gemma3")


def real_rows() -> list[dict]:
    """A 3-turn conversation about an image, over PACKED_LENGTH tokens, and two short rows."""
    long_reply = " ".join(["The box is red and square."] * 20)
    return [
        {
            "images": [cell(64, 48)],
            "texts": [
                turn("What is this?", long_reply),
                turn("Sure?", long_reply),
                turn("Colour?", "Red."),
            ],
        },  # fmt: skip
        {"images": [cell(56, 56)], "texts": [turn("Colour?", "Blue.")]},
        {"images": [], "texts": [turn("2 + 2?", "4.")]},
    ]


@pytest.mark.parametrize(
    ("name", "attention"),
    [
        pytest.param(name, attention, marks=pytest.mark.slow)
        for name in FAMILIES
        for attention in ATTENTION_IMPLEMENTATIONS
    ],
    indirect=["attention"],
)
def test_a_truncated_real_family_sample_packed_has_its_loss_alone(name, attention):
    family = family_for(tiny_processor(name))
    model = tiny_model(family.processor, attn_implementation="eager")
    if attention == "flex_attention" and not model._supports_flex_attn:
        pytest.skip(f"{type(model).__name__} does not accept flex_attention")
    samples = VQADataset(Dataset.from_list(real_rows(), features=FEATURES), family.processor)
    packing = PackingConfig(max_length=PACKED_LENGTH, packs_per_batch=2, overflow="truncate")
    dataset = PackedDataset(samples, config=packing, rank=0, world_size=1)
    assert dataset.truncated_rows.tolist() == [0]
    batch = next(iter(PackedDataLoader(dataset, num_workers=0)))
    assert sorted(batch["sample_index"].tolist()) == [0, 1, 2]
    cut = [truncate_sample(samples[row], PACKED_LENGTH, family)
           for row in batch["sample_index"].tolist()]  # fmt: skip
    first = next(s for s in cut if s["row"] == 0)
    assert first["truncated"] and len(first["input_ids"]) == PACKED_LENGTH
    assert media_end(family, first["input_ids"]) < PACKED_LENGTH  # the image whole
    alone_attention = "eager" if attention == "flex_attention" else attention
    try:
        use_attention(language_model(model), alone_attention)
        alone = summed_losses_alone(family, model, cut)
        use_attention(language_model(model), attention)
        packed = summed_losses_packed(model, batch)
    finally:
        use_attention(model, "eager")
    assert packed == pytest.approx(alone, rel=1e-5)


# The planned loader (examples/pack_planned.py) ----------------------------------------------------


@pytest.mark.slow
def test_planned_overflow_truncate_keeps_every_over_long_text_row(run_main, tmp_path):
    """`--overflow truncate` on the embedded rows: what `--overflow drop` counts too_long is kept,
    truncated, and the run says nothing of a budget (nothing was dropped)."""
    runs = {}
    for overflow in ("drop", "truncate"):
        metrics = tmp_path / f"{overflow}.json"
        argv = ["examples/pack_planned.py", "--num-rows", "400", "--overflow", overflow,
                "--out-dir", str(tmp_path), "--metrics-json", str(metrics)]  # fmt: skip
        status, out, err = run_main(*argv)
        assert status == 0, err
        runs[overflow] = (json.loads(metrics.read_text()), out)
    (dropped, said), (fitted, quiet) = runs["drop"], runs["truncate"]
    assert dropped["dropped"]["too_long"] > 0 and "keeps 99% / 100% of the rows whole" in said
    assert fitted["truncated"] == dropped["dropped"]["too_long"] and not fitted["dropped"]
    assert fitted["samples"] == fitted["rows_read"] == 400 and "whole:" not in quiet
    assert f"({fitted['truncated']} truncated to max_length)" in quiet
