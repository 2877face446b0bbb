"""Real model families (mmdp.models): offline processors, weights from image headers equal to the
samples the processors build, and packed batches that keep samples apart in the real
transformers classes (tiny random configs, float32, CPU).

For each family, a packed batch of 2 packs x 3 samples (images of different sizes and aspect
ratios, a text-only sample, a 2-image sample) must give every sample the summed loss it gets run
alone, with the model computing its own positions, under every attention implementation the
class accepts; and the family's trap must break that equality.
"""

import contextlib
import io

import pytest
import torch
from conftest import two_packs_of_three
from datasets import Dataset
from doc_blocks import quoted_batch_keys, quoted_default_budgets
from hybrid_kernels import linear_attention_kernels
from PIL import Image
from transformers.models.llava_onevision.modeling_llava_onevision import image_size_to_num_patches

from mmdp.batch import sample_ids
from mmdp.data.conversation import chat_messages, chat_turns
from mmdp.data.families import (
    OFFLINE,
    family_for,
    offline_processor,
    tiny_processor,
)
from mmdp.data.reading.sources import FEATURES
from mmdp.data.synthetic.rows import encode_png
from mmdp.data.vqa_dataset import VQADataset
from mmdp.drop_reasons import IMAGE_SIZE_REFUSED, UNDECODABLE_IMAGE
from mmdp.loading.packed_dataset import PackedDataset
from mmdp.models.attention import use_attention
from mmdp.models.inputs import model_inputs
from mmdp.models.tiny import tiny_model
from mmdp.training.loss import summed_loss, token_losses

FAMILIES = tuple(OFFLINE)
# Widths x heights from a single pixel to very wide and very tall (Qwen refuses ratios over 200).
SIZES = [(1, 1), (28, 28), (300, 200), (200, 300), (640, 480), (4000, 300), (300, 4000), (97, 13)]
# The default suite weighs three sizes with every family (the smallest, a photo, the tallest), the
# slow group (uv run pytest -m slow) the others: SmolVLM's and LLaVA-OneVision's processors take
# seconds on each large image (tiles, crops), the others half a second an image size.
DEFAULT_SIZES = [(1, 1), (640, 480), (300, 4000)]


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
def tiny_family(family):
    """The family with the images its tiny model tests fast with (LLaVA-OneVision: 32 px tiles,
    not 384), for the packed batches; weights are checked with the real processor above."""
    return family_for(tiny_processor(family.name))


@pytest.fixture(scope="module")
def model(tiny_family):
    """The family's tiny model; Qwen3.5's with CPU stand-ins of the kernels that keep packed
    samples apart in its linear-attention layers (tests/hybrid_kernels.py, tests/test_qwen3_5.py)."""
    hybrid = tiny_family.name == "qwen3_5"
    with linear_attention_kernels() if hybrid else contextlib.nullcontext():
        yield tiny_model(tiny_family.processor, attn_implementation="eager")


def processor_input_ids(family, row: dict) -> torch.Tensor:
    """What the family's own processor makes of a row: its input_ids. The images go in nested,
    as one sample's (LLaVA-OneVision reads a flat list as one image per sample)."""
    turns = chat_turns(row["texts"], ())
    messages = chat_messages(turns, len(row["images"]))
    text = family.processor.apply_chat_template(messages, tokenize=False)
    images = [Image.open(io.BytesIO(image["bytes"])).convert("RGB") for image in row["images"]]
    out = family.processor(text=[text], images=[images] if images else None, return_tensors="pt")
    return out["input_ids"][0]


# Weights ---------------------------------------------------------------------------------------


WEIGHED = [
    pytest.param(
        name,
        size,
        id=f"{name}-{size[0]}x{size[1]}",
        marks=pytest.mark.slow if size not in DEFAULT_SIZES else (),
    )
    for name in FAMILIES
    for size in SIZES
]


@pytest.mark.parametrize(("family", "size"), WEIGHED, indirect=["family"])
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
    """ROWS in two packs of 3, a padding tail in each, and their samples."""
    samples = [family.make_sample(row, i) for i, row in enumerate(ROWS)]
    return two_packs_of_three(family, samples), samples


@pytest.mark.docs
def test_a_packed_batch_carries_the_keys_the_docs_list(tiny_family):
    """docs/use-in-your-trainer.md's batch contract and docs/real-vlms.md's table of families
    together list exactly the keys of the family's packed batch (tests/doc_blocks.py reads them;
    TinyVLM's batch: tests/test_stage_scripts.py)."""
    keys = set(packed_batch(tiny_family)[0]) | {"epoch"}  # the loader adds the batch's epoch
    quoted = quoted_batch_keys(tiny_family.name)
    assert keys == quoted, (
        f"{tiny_family.name}: in the batch, not in the docs: {sorted(keys - quoted)}; in the "
        f"docs, not in the batch: {sorted(quoted - keys)}"
    )


@pytest.mark.docs
def test_with_no_config_a_family_packs_to_the_default_budgets_the_docs_list(family):
    """docs/real-vlms.md: `PackedDataset(VQADataset(rows, processor))` with no config packs to the
    family's default budgets, which it lists (tests/doc_blocks.py reads them)."""
    samples = VQADataset(Dataset.from_list(ROWS, features=FEATURES), family.processor)
    config = PackedDataset(samples, rank=0, world_size=1).config
    assert (config.max_length, config.max_patches) == quoted_default_budgets()[family.name]


def alone_inputs(family, sample: dict) -> dict:
    """One sample as the model takes it unpacked: no positions (the model computes its own from
    the grids, and Qwen's from mm_token_type_ids and second_per_grid_ts), its images and videos
    as the family collates them."""
    inputs = {"input_ids": sample["input_ids"][None]}
    inputs.update({key: sample[key][None] for key in family.token_keys})
    if sample["image_count"] or sample.get("video_count"):
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
        logits = model(**(inputs or model_inputs(batch, model))).logits
    losses = token_losses(logits, batch["labels"])
    # a position's loss belongs to the sample of the label it predicts (the next position)
    owner = torch.nn.functional.pad(sample_ids(batch)[:, 1:], (0, 1), value=-1)
    return [float(losses[owner == i].sum()) for i in owner.unique().tolist() if i >= 0]


def language_model(model):
    inner = model.model
    return getattr(inner, "language_model", None) or inner.text_model


# The default suite checks every family under sdpa (and its traps under eager, below); the other
# implementations run with the slow group (uv run pytest -m slow). flex_attention compiles its
# kernels for the packed batch's shape: 46 s for LLaVA-OneVision on a quiet 2-core machine.
ATTENTION = (
    pytest.param("eager", marks=pytest.mark.slow),
    "sdpa",
    pytest.param("flex_attention", marks=pytest.mark.slow),
    pytest.param("flash_attention_2", marks=pytest.mark.slow),
)


@pytest.mark.parametrize("attention", ATTENTION, indirect=True)
def test_packed_samples_see_only_themselves(tiny_family, model, attention):
    """Alone under the same attention (flex_attention: eager, which it equals on one sample;
    compiling it for each sample's length would take minutes): what packing must not change.
    Whether an implementation computes the model's own attention is another question (Gemma 3
    under FlashAttention does not: tests/test_gemma3.py)."""
    if attention == "flex_attention" and not model._supports_flex_attn:
        pytest.skip(f"{type(model).__name__} does not accept flex_attention")
    batch, samples = packed_batch(tiny_family)
    assert len(batch["samples_per_pack"]) == 2 and batch["samples_per_pack"].tolist() == [3, 3]
    alone_attention = "eager" if attention == "flex_attention" else attention
    try:
        use_attention(language_model(model), alone_attention)
        alone = summed_losses_alone(tiny_family, model, samples)
        use_attention(language_model(model), attention)  # the images are encoded one by one
        packed = summed_losses_packed(model, batch)
    finally:
        use_attention(model, "eager")
    assert packed == pytest.approx(alone, rel=1e-5)


def three_row_positions(batch: dict, inputs: dict, model) -> dict:
    """Qwen-VL: the mRoPE rows alone, [3, B, L], as several trainers pass them."""
    return {**inputs, "position_ids": inputs["position_ids"][1:]}


def packs_tiles_swapped(batch: dict, inputs: dict, model) -> dict:
    """SmolVLM, Idefics3 and InternVL: the second pack's tiles before the first's, as a collator
    that gathers a batch's images in another order than its rows does. The model takes any order
    of the right number of tiles (it fills the image runs of the flattened rows in turn), so it
    raises nothing and gives each run another image's features."""
    pixels = inputs["pixel_values"]  # [1, T, 3, M, M] (SmolVLM) or [T, 3, M, M] (InternVL)
    tiles = pixels[0] if pixels.dim() == 5 else pixels  # every tile the same patches
    patches = batch["patches_per_pack"]
    first = len(tiles) * int(patches[0]) // int(patches.sum())
    swapped = torch.cat([tiles[first:], tiles[:first]])
    return {**inputs, "pixel_values": swapped[None] if pixels.dim() == 5 else swapped}


def images_out_of_order(batch: dict, inputs: dict, model) -> dict:
    """LLaVA-OneVision: the first and the last image of the batch (ROWS[0]'s and ROWS[5]'s, each
    alone in its sample) swapped, crops and sizes, as a collator that orders images otherwise
    than their tokens would. The model checks only the total of image features, so one sample's
    features flow into the other's tokens, silently."""
    pixels, sizes = inputs["pixel_values"], inputs["image_sizes"]
    alone = [n == 1 for n in batch["batch_num_images"].tolist() for _ in range(n)]
    assert alone[0] and alone[-1]
    tile = pixels.shape[-1]  # both processors' pinpoints: the 6 x 6 grid of tiles
    grid = [[tile * i, tile * j] for i in range(1, 7) for j in range(1, 7)]
    crops = [
        image_size_to_num_patches(size.tolist(), grid, tile) if a else 1
        for size, a in zip(sizes, alone)
    ]
    blocks = list(pixels.split(crops))
    order = [len(crops) - 1, *range(1, len(crops) - 1), 0]
    return {
        **inputs,
        "pixel_values": torch.cat([blocks[i] for i in order]),
        "image_sizes": sizes[order],
    }


def the_models_own_masks(batch: dict, inputs: dict, model) -> dict:
    """Gemma 3: no attention_mask, so the model builds its own masks, as transformers 5.23 does
    them (its sliding-window mask is wrong for every sample after the first of a row)."""
    return {key: value for key, value in inputs.items() if key != "attention_mask"}


def no_seq_idx(batch: dict, inputs: dict, model) -> dict:
    """Qwen3.5: no seq_idx (a trainer that passes FlashAttention's bounds alone): the causal conv
    reads each sample's first 3 tokens with the last ones of the sample before it, and the
    recurrence carries that through the sample."""
    return {key: value for key, value in inputs.items() if key != "seq_idx"}


def no_cu_seqlens(batch: dict, inputs: dict, model) -> dict:
    """Qwen3.5: no cu_seq_lens, so the recurrence (chunk_gated_delta_rule) carries each sample's
    state into the next; attention alone keeps them apart, by the restarting positions."""
    return {key: value for key, value in inputs.items() if not key.startswith("cu_seq_lens")}


# Each family's traps: what trainers get wrong for it, and what mixes its samples.
TRAPS = {
    "qwen2_5_vl": (three_row_positions,),
    "qwen3_vl": (three_row_positions,),
    "qwen3_5": (three_row_positions, no_seq_idx, no_cu_seqlens),
    "llava_onevision": (images_out_of_order,),
    "gemma3": (the_models_own_masks,),
    "gemma4": (the_models_own_masks,),
    "internvl": (packs_tiles_swapped,),
    "smolvlm": (packs_tiles_swapped,),
}


def test_the_familys_traps_break_the_equality(tiny_family, model):
    batch, samples = packed_batch(tiny_family)
    alone = summed_losses_alone(tiny_family, model, samples)
    for trap in TRAPS[tiny_family.name]:
        inputs = trap(batch, model_inputs(batch, model), model)
        packed = summed_losses_packed(model, batch, inputs)
        worst = max(abs(p - a) / a for p, a in zip(packed, alone))
        # docs/real-vlms.md quotes these: uv run pytest tests/test_families.py -k traps -s
        print(f"{tiny_family.name}, {trap.__name__}: worst relative error {worst:.1e}")
        assert worst > 1e-4, trap.__name__


# Qwen-VL's positions without the model's token-by-token grouping --------------------------------


def random_image_sample(generator: torch.Generator, merge_size: int) -> tuple[torch.Tensor, list]:
    """mm_token_type_ids of a sample of text runs and 0-4 images of random grids (t, h, w), each
    image between two text runs as Qwen's template puts it; and the grids."""
    types, grids = [torch.zeros(int(torch.randint(1, 30, (1,), generator=generator)))], []
    for _ in range(int(torch.randint(0, 5, (1,), generator=generator))):
        h, w = (merge_size * torch.randint(1, 20, (2,), generator=generator)).tolist()
        grids.append([1, h, w])
        types.append(torch.ones(h * w // merge_size**2))
        types.append(torch.zeros(int(torch.randint(1, 30, (1,), generator=generator))))
    return torch.cat(types).long(), grids


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_qwen_image_positions_are_the_models_own_rope_index(name):
    """RopeIndex finds the runs of a sample without videos at once; on 200 random samples its
    positions equal the model class's own get_rope_index to the element (and a shuffled grid
    order, the negative control, does not)."""
    from mmdp.data.families.qwen_vl import Qwen2_5_VL, Qwen3_5, Qwen3VL, RopeIndex

    family = {"qwen2_5_vl": Qwen2_5_VL, "qwen3_vl": Qwen3VL, "qwen3_5": Qwen3_5}[name]
    rope = RopeIndex(family.model_class, family.config_class, 2, family.tokens_per_second)
    generator = torch.Generator().manual_seed(0)
    controls_differ = 0
    for _ in range(200):
        types, grids = random_image_sample(generator, merge_size=2)
        grid_thw = torch.tensor(grids, dtype=torch.long) if grids else None
        models, _ = family.model_class.get_rope_index(
            rope, types[None], mm_token_type_ids=types[None], image_grid_thw=grid_thw
        )
        ours = rope.image_positions(types, grid_thw)
        assert ours.dtype == models.dtype
        assert torch.equal(ours, models[:, 0])
        if len(grids) > 1 and grids[0] != grids[-1]:
            controls_differ += not torch.equal(rope.image_positions(types, grid_thw.flip(0)), ours)
    assert controls_differ > 20
