"""Real model families (mmdp.models): offline processors, weights from image headers equal to the
samples the processors build, and packed batches that keep samples apart in the real
transformers classes (tiny random configs, float32, CPU).

For each family, a packed batch of 2 packs x 3 samples (images of different sizes and aspect
ratios, a text-only sample, a 2-image sample) must give every sample the summed loss it gets run
alone, with the model computing its own positions, under every attention implementation the
class accepts; and the family's trap must break that equality.
"""

import io

import pytest
import torch
from PIL import Image

from mmdp.data.conversation import chat_messages, chat_turns
from mmdp.data.synthetic import encode_png
from mmdp.drop_reasons import IMAGE_SIZE_REFUSED, UNDECODABLE_IMAGE
from mmdp.models.attention import use_attention
from mmdp.models.families import OFFLINE, family_for, offline_processor, tiny_model
from mmdp.packing.batch import build_pack, collate_packs, model_inputs, sample_ids
from mmdp.training.loss import summed_loss, token_losses

FAMILIES = tuple(OFFLINE)
# Widths x heights from a single pixel to very wide and very tall (Qwen refuses ratios over 200).
SIZES = [(1, 1), (28, 28), (300, 200), (200, 300), (640, 480), (4000, 300), (300, 4000), (97, 13)]


def cell(width: int, height: int, colour=(200, 30, 30)) -> dict:
    return {"bytes": encode_png(Image.new("RGB", (width, height), colour)), "path": None}


def turn(user: str, assistant: str) -> dict:
    return {"user": user, "assistant": assistant, "source": "test"}


# The six samples of the packed batches: 3 per pack.
ROWS = [
    {"images": [cell(64, 48)], "texts": [turn("What is this?", "A red box.")]},
    {"images": [], "texts": [turn("Spell cat.", "C-A-T."), turn("And dog?", "D-O-G.")]},
    {"images": [cell(32, 96), cell(90, 30)], "texts": [turn("Compare them.", "Both are red.")]},
    {"images": [cell(120, 40, (10, 200, 10))], "texts": [turn("Colour?", "Green.")]},
    {"images": [], "texts": [turn("2 + 2?", "4.")]},
    {"images": [cell(56, 56, (10, 10, 200))], "texts": [turn("Colour?", "Blue, I think.")]},
]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return family_for(offline_processor(request.param))


@pytest.fixture(scope="module")
def model(family):
    return tiny_model(family.processor, attn_implementation="eager")


def processor_input_ids(family, row: dict) -> torch.Tensor:
    """What the family's own processor makes of a row: its input_ids."""
    turns = chat_turns(row["texts"], ())
    messages = chat_messages(turns, len(row["images"]))
    text = family.processor.apply_chat_template(messages, tokenize=False)
    images = [Image.open(io.BytesIO(image["bytes"])).convert("RGB") for image in row["images"]]
    out = family.processor(text=[text], images=images or None, return_tensors="pt")
    return out["input_ids"][0]


# Weights ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_planned_weight_is_the_processed_length_and_the_processors_own_ids(family, size):
    rows = [{"images": [cell(*size)], "texts": [turn("Describe it.", "A red rectangle.")]}]
    rows.append({"images": [cell(*size), cell(40, 30)], "texts": rows[0]["texts"]})
    lengths, images, patches, reasons = family.weigh(
        [r["texts"] for r in rows], [r["images"] for r in rows]
    )
    for row, length, count, patch_count, reason in zip(rows, lengths, images, patches, reasons):
        sample = family.make_sample(row, 0)
        if reason is not None:  # refused from the header alone, and so when built
            assert reason == sample["drop_reason"] == IMAGE_SIZE_REFUSED
            continue
        assert len(sample["input_ids"]) == length == len(sample["labels"])
        assert (count, patch_count) == (sample["image_count"], sample["patches"])
        assert torch.equal(sample["input_ids"], processor_input_ids(family, row))


def test_weighing_reads_headers_not_pixels(family):
    """A PNG whose header is valid but whose pixels are garbage: weighed as any image of its
    size, and dropped as undecodable only when its pack is built."""
    good = cell(64, 48)["bytes"]
    pixels = good.index(b"IDAT") + 4  # the compressed pixels: zeros, the chunks' frame intact
    broken = good[:pixels] + bytes(len(good) - pixels - 12) + good[-12:]
    row = {"images": [{"bytes": broken, "path": None}], "texts": [turn("Hi?", "Hello.")]}
    same_size = {"images": [{"bytes": good, "path": None}], "texts": row["texts"]}
    lengths, _, _, reasons = family.weigh([row["texts"]] * 2, [row["images"], same_size["images"]])
    assert reasons == [None, None] and lengths[0] == lengths[1]
    assert family.make_sample(row, 0)["drop_reason"] == UNDECODABLE_IMAGE


def test_replies_and_their_end_of_turn_are_the_only_labels(family):
    sample = family.make_sample(ROWS[1], 1)
    labelled = sample["labels"][sample["labels"] != -100]
    text = family.tokenizer.decode(labelled)
    assert text.replace(" ", "") == f"C-A-T.{family.end_of_turn}D-O-G.{family.end_of_turn}".replace(
        " ", ""
    )


# Packed batches through the real model class ----------------------------------------------------


def packed_batch(family) -> tuple[dict, list[dict]]:
    samples = [family.make_sample(row, i) for i, row in enumerate(ROWS)]
    longest = max(sum(len(s["input_ids"]) for s in samples[k : k + 3]) for k in (0, 3))
    packs = [
        build_pack(
            samples[k : k + 3],
            [len(s["input_ids"]) for s in samples[k : k + 3]],
            max_length=longest + 5,  # a padding tail in every pack
            pad_token_id=family.pad_token_id,
            batch_index=0,
        )
        for k in (0, 3)
    ]
    return collate_packs(packs, family), samples


def alone_inputs(family, sample: dict) -> dict:
    """One sample as the model takes it unpacked: no positions (the model computes its own), its
    images as the family collates them."""
    inputs = {"input_ids": sample["input_ids"][None]}
    inputs.update({key: sample[key][None] for key in family.token_keys})
    if sample["image_count"]:
        inputs.update(family.collate_vision([sample]))
    return inputs


def summed_losses_alone(family, model, samples) -> list[float]:
    with torch.no_grad():
        return [
            float(
                summed_loss(
                    model(**alone_inputs(family, s), use_cache=False).logits, s["labels"][None]
                )
            )
            for s in samples
        ]


def summed_losses_packed(model, batch, inputs=None) -> list[float]:
    """Each sample's summed loss in the packed batch (labels: its own, shifted within it)."""
    with torch.no_grad():
        logits = model(**(inputs or model_inputs(batch, model)), use_cache=False).logits
    losses = token_losses(logits, batch["labels"])
    # a position's loss belongs to the sample of the label it predicts (the next position)
    owner = torch.nn.functional.pad(sample_ids(batch)[:, 1:], (0, 1), value=-1)
    return [float(losses[owner == i].sum()) for i in owner.unique().tolist() if i >= 0]


def language_model(model):
    inner = model.model
    return getattr(inner, "language_model", None) or inner.text_model


ATTENTION = ("eager", "sdpa", "flex_attention", "flash_attention_2")


@pytest.mark.parametrize("attention", ATTENTION, indirect=True)
def test_packed_samples_see_only_themselves(family, model, attention):
    if attention == "flex_attention" and not model._supports_flex_attn:
        pytest.skip(f"{type(model).__name__} does not accept flex_attention")
    batch, samples = packed_batch(family)
    assert len(batch["samples_per_row"]) == 2 and batch["samples_per_row"].tolist() == [3, 3]
    alone = summed_losses_alone(family, use_attention(model, "eager"), samples)
    use_attention(language_model(model), attention)  # the images are encoded one by one anyway
    try:
        packed = summed_losses_packed(model, batch)
    finally:
        use_attention(model, "eager")
    assert packed == pytest.approx(alone, rel=1e-5)


def three_row_positions(batch: dict, inputs: dict) -> dict:
    """Qwen-VL: the mRoPE rows alone, [3, B, L], as several trainers pass them."""
    return {**inputs, "position_ids": inputs["position_ids"][1:]}


def packs_tiles_swapped(batch: dict, inputs: dict) -> dict:
    """SmolVLM and Idefics3: the second pack's tiles before the first's, as a collator that
    gathers a batch's images in another order than its rows does. The model takes any order of
    the right number of tiles (it fills the <image> runs of the flattened rows in turn), so it
    raises nothing and gives each run another image's features."""
    tiles = inputs["pixel_values"][0]  # [T, 3, M, M]; every tile the same patches
    patches = batch["patches_per_row"]
    first = len(tiles) * int(patches[0]) // int(patches.sum())
    return {**inputs, "pixel_values": torch.cat([tiles[first:], tiles[:first]])[None]}


# Each family's trap: what trainers get wrong for it, and what mixes its samples.
TRAPS = {
    "qwen2_5_vl": three_row_positions,
    "qwen3_vl": three_row_positions,
    "smolvlm": packs_tiles_swapped,
}


def trap(family, batch: dict, inputs: dict) -> dict:
    return TRAPS[family.name](batch, inputs)


def test_the_familys_trap_breaks_the_equality(family, model):
    batch, samples = packed_batch(family)
    alone = summed_losses_alone(family, model, samples)
    packed = summed_losses_packed(model, batch, trap(family, batch, model_inputs(batch, model)))
    worst = max(abs(p - a) / a for p, a in zip(packed, alone))
    assert worst > 1e-4
