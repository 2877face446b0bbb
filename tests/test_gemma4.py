"""Gemma 4 (mmdp.data.families.gemma4): weights from image and video headers equal to what the
real processor makes, the attention masks of packed rows, rows with audio counted, the planned
loader (examples/pack_planned.py).

Every family's packed batch (images and text in 2 packs, tests/test_families.py) already runs
Gemma 4's tiny model under every attention implementation, with its trap. Here: the image sizes
and clips of issue 59 with the checkpoints' processor (280 soft tokens an image, 32 frames a video),
a packed batch with videos, mmdp's masks against the model's own for each sample alone, the models
without bidirectional images (E2B, E4B), and audio.
"""

import copy
import io
import json

import pytest
import torch
from conftest import two_packs_of_three
from datasets import Dataset
from PIL import Image
from test_families import (
    cell,
    language_model,
    summed_losses_alone,
    summed_losses_packed,
    turn,
)
from test_video import ATTENTION, clip, losses_packed_and_alone, processor_outputs
from transformers.masking_utils import create_sliding_window_causal_mask
from transformers.models.gemma4.modeling_gemma4 import (
    create_masks_for_vision_model,
    get_block_sequence_ids_for_mask,
)

from mmdp.batch import build_pack, collate_packs, sample_ids
from mmdp.data.conversation import chat_messages, chat_turns
from mmdp.data.families import family_for, offline_processor, tiny_processor
from mmdp.data.reading.formats import to_cauldron
from mmdp.data.reading.sources import FEATURES
from mmdp.data.vqa_dataset import VQADataset
from mmdp.drop_reasons import AUDIO_REFUSED, VIDEO_REFUSED
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.models.attention import flash_attention_on_cpu, use_attention
from mmdp.models.gemma3_masks import masks_with_image_blocks, packed_attention_masks
from mmdp.models.inputs import model_inputs
from mmdp.models.tiny.gemma4 import tiny_model
from mmdp.packing.packing_config import PackingConfig


@pytest.fixture(scope="module")
def family():
    return family_for(offline_processor("gemma4"))


@pytest.fixture(scope="module")
def tiny():
    return family_for(tiny_processor("gemma4"))


@pytest.fixture(scope="module")
def model(tiny):
    return tiny_model(tiny.processor, attn_implementation="eager")


def worst_relative_error(packed: list[float], alone: list[float]) -> float:
    return max(abs(p - a) / a for p, a in zip(packed, alone))


# Weights -----------------------------------------------------------------------------------------

# Width x height: tiny, 4K both ways, very wide, very tall (any aspect ratio: the processor never
# refuses one, get_aspect_ratio_preserving_size); the slow group (-m slow) weighs the others.
SIZES = [(1, 1), (2, 3), (3840, 2160), (2160, 3840), (4000, 300), (8000, 50), (50, 8000)]
DEFAULT_SIZES = [(1, 1), (3840, 2160), (50, 8000)]


@pytest.mark.parametrize(
    "size",
    [pytest.param(s, marks=() if s in DEFAULT_SIZES else pytest.mark.slow) for s in SIZES],
    ids=lambda s: f"{s[0]}x{s[1]}",
)
def test_image_weights_are_the_processors_own_tokens_and_pixels(family, size):
    row = {"images": [cell(*size), cell(40, 30)], "texts": [turn("Describe them.", "Red.")]}
    lengths, _, patches, reasons = family.weigh([row["texts"]], [row["images"]])
    sample = family.make_sample(row, 0)
    assert reasons == [None] and len(sample["input_ids"]) == lengths[0]
    assert patches == [sample["patches"]] == [2 * 2520]  # padded to 280 x 3^2 each
    text = family.render(chat_messages(chat_turns(row["texts"], ()), 2))
    images = [Image.open(io.BytesIO(image["bytes"])).convert("RGB") for image in row["images"]]
    out = family.processor(text=[text], images=[images], return_tensors="pt")
    for key in ("input_ids", "mm_token_type_ids"):
        assert torch.equal(sample[key], out[key][0]), key
    for key in ("pixel_values", "image_position_ids"):
        assert torch.equal(sample[key], out[key]), key


def test_video_weights_are_the_processors_own_tokens_and_pixels(family):
    """The checkpoints' video processor samples 32 frames: clips of 40 and 32 frames (with an
    image) are the processor's to the pixel, one of 20 frames is refused by both."""
    texts = [turn("Which way does it move?", "Left to right.")]
    rows = [
        {"images": [], "videos": [clip(40, 10, 64, 48)], "texts": texts},
        {"images": [cell(90, 30)], "videos": [clip(32, 8, 30, 90)], "texts": texts},
        {"images": [], "videos": [clip(20, 10, 64, 48)], "texts": texts},
    ]
    lengths, _, patches, reasons = family.weigh(
        [r["texts"] for r in rows], [r["images"] for r in rows], [r["videos"] for r in rows]
    )
    assert reasons == [None, None, VIDEO_REFUSED]
    with pytest.raises(ValueError, match="exceeds total_num_frames"):
        processor_outputs(family, rows[2])
    for row, length, patch_count in zip(rows[:2], lengths, patches):
        sample, out = family.make_sample(row, 0), processor_outputs(family, row)
        assert len(sample["input_ids"]) == length
        assert patch_count == sample["patches"] == 2520 * len(row["images"]) + 32 * 630
        for key in ("input_ids", "mm_token_type_ids"):
            assert torch.equal(sample[key], out[key][0]), key
        for key in ("pixel_values_videos", "video_position_ids", "num_frames_per_video"):
            assert torch.equal(sample[key], torch.as_tensor(out[key])), key


# A packed batch with videos, and its masks --------------------------------------------------------

# 2 frames a clip at tiny_processor's settings, about 70 soft tokens each
ROWS = [
    {"images": [], "videos": [clip(6, 3, 40, 30)], "texts": [turn("Where?", "Left.")]},
    {"images": [cell(64, 48)], "videos": [], "texts": [turn("What is this?", "A red box.")]},
    {"images": [], "videos": [], "texts": [turn("Spell cat.", "C-A-T.")]},
    {"images": [cell(32, 96)], "videos": [clip(4, 2, 48, 32)], "texts": [turn("Both?", "Red.")]},
    {"images": [], "videos": [], "texts": [turn("2 + 2?", "4.")]},
]


@pytest.fixture(scope="module")
def packed(tiny):
    """ROWS in two packs (3 and 2 samples, a padding tail in each), and their samples."""
    samples = [tiny.make_sample(row, i) for i, row in enumerate(ROWS)]
    return two_packs_of_three(tiny, samples), samples


@pytest.fixture(scope="module")
def alone_eager(tiny, model, packed):
    return summed_losses_alone(tiny, model, packed[1])


@pytest.mark.parametrize("attention", ATTENTION, indirect=True)
def test_packed_samples_with_videos_see_only_themselves(
    tiny, model, packed, alone_eager, attention
):
    """Called as Trainer calls the model (model(**inputs)); alone under the same attention
    (flex_attention: eager, which it equals on one sample)."""
    assert packed[0]["num_frames_per_video"].tolist() == [2, 2]
    packed_losses, alone = losses_packed_and_alone(tiny, model, packed, alone_eager, attention)
    assert packed_losses == pytest.approx(alone, rel=1e-5)


def test_the_models_own_masks_mix_packed_samples_with_videos(model, packed, alone_eager):
    """No attention_mask: transformers 5.23 builds the masks itself, and they move the losses."""
    batch, _ = packed
    inputs = {k: v for k, v in model_inputs(batch, model).items() if k != "attention_mask"}
    assert worst_relative_error(summed_losses_packed(model, batch, inputs), alone_eager) > 1e-4


def test_flash_attention_makes_the_images_causal(tiny, model, packed, alone_eager):
    """Under FlashAttention the masks are None and the layers causal (Gemma4TextAttention's
    is_causal), as for Gemma 3: a packed batch gives each sample its loss alone with causal images
    (alone without mm_token_type_ids, which the model's bidirectional mask needs), not its own."""
    batch, samples = packed
    causal = copy.copy(tiny)
    causal.token_keys = ()
    causal_alone = summed_losses_alone(causal, model, samples)
    with flash_attention_on_cpu():
        use_attention(language_model(model), "flash_attention_2")
        try:
            packed_losses = summed_losses_packed(model, batch)
        finally:
            use_attention(model, "eager")
    assert packed_losses == pytest.approx(causal_alone, rel=1e-5)
    assert worst_relative_error(packed_losses, alone_eager) > 1e-4


def allowed(masks: dict) -> dict:
    """Eager masks (0 where attended, the dtype's minimum elsewhere) as booleans."""
    return {layer: mask[:, 0] == 0 for layer, mask in masks.items()}


def own_masks(model, sample: dict) -> dict:
    """The masks Gemma4Model builds for a sample alone (modeling_gemma4.py:2470-2488)."""
    types = sample["mm_token_type_ids"][None]
    embeds = torch.empty(*types.shape, 0)
    blocks = get_block_sequence_ids_for_mask(types, device=types.device)
    config = model.config.get_text_config()
    return allowed(create_masks_for_vision_model(config, embeds, None, None, None, blocks))


def test_packed_masks_are_each_samples_own_where_an_image_outruns_the_window(model, packed):
    """mmdp's masks of the packed rows: each sample's square is the model's own for it alone, and
    nothing crosses samples. Every image and frame here is a run of 50-70 soft tokens, longer
    than the window of 32; the negative control is Gemma 3's old composition (the blocks added
    after the window, create_sliding_window_causal_mask with block_sequence_ids), which lets an
    image's tokens reach past the window."""
    batch, samples = packed
    ours = allowed(packed_attention_masks(batch, model))
    blocks = get_block_sequence_ids_for_mask(batch["mm_token_type_ids"], device="cpu")
    config = model.config.get_text_config()
    embeds = torch.empty(*blocks.shape, 0)
    windowed_then_blocks = (
        create_sliding_window_causal_mask(
            config, embeds, None, None, batch["position_ids"], block_sequence_ids=blocks
        )[:, 0]
        == 0
    )
    owner = sample_ids(batch)
    starts = [
        (int(r), int(at)) for r, at in ((owner >= 0) & (batch["position_ids"] == 0)).nonzero()
    ]
    wrong = 0
    for (row, start), sample in zip(starts, samples, strict=True):
        end = start + len(sample["input_ids"])
        alone = own_masks(model, sample)
        for layer in ours:
            assert torch.equal(ours[layer][row, start:end, start:end], alone[layer][0]), layer
        square = windowed_then_blocks[row, start:end, start:end]
        wrong += int((square != alone["sliding_attention"][0]).sum())
    same = owner[:, :, None] == owner[:, None, :]
    for layer, mask in ours.items():
        assert not (mask & ~same & (owner[:, :, None] >= 0)).any(), layer
    assert wrong > 0
    # block ids restarting in each sample (a per-sample collator's) make the same masks
    restarted = torch.full_like(blocks, -1)
    for sample in owner.unique().tolist():
        where = owner == sample
        restarted[where] = get_block_sequence_ids_for_mask(
            batch["mm_token_type_ids"][where][None], "cpu"
        )[0]
    assert (restarted != blocks).any()
    again = masks_with_image_blocks(model, batch["position_ids"], restarted, full_blocks=False)
    assert all(torch.equal(allowed(again)[layer], ours[layer]) for layer in ours)


def test_models_without_bidirectional_images_pack_exactly(tiny):
    """E2B and E4B (use_bidirectional_attention=None): every layer causal, images included; mmdp's
    masks are then the plain per-sample ones, and packed still equals alone."""
    batch, samples = packed_batch_of(tiny, ROWS[1:3] + ROWS[3:])
    model = tiny_model(tiny.processor, bidirectional=None)
    alone = summed_losses_alone(tiny, model, samples)
    assert summed_losses_packed(model, batch) == pytest.approx(alone, rel=1e-5)


def packed_batch_of(family, rows: list[dict]) -> tuple[dict, list[dict]]:
    samples = [family.make_sample(row, i) for i, row in enumerate(rows)]
    lengths = [len(s["input_ids"]) for s in samples]
    pack = build_pack(samples, lengths, max_length=sum(lengths) + 7, pad_token_id=0, batch_index=0)
    return collate_packs([pack], family), samples


def test_a_model_with_all_tokens_bidirectional_is_refused(tiny, packed):
    model = tiny_model(tiny.processor, bidirectional="all")
    with pytest.raises(ValueError, match="use_bidirectional_attention is 'all'"):
        model_inputs(packed[0], model)


# Audio -------------------------------------------------------------------------------------------


def test_a_row_with_audio_is_counted_never_a_crash(tiny, tmp_path):
    """Gemma 4 takes audio, mmdp packs none yet: an <audio> tag (ms-swift's), an audio item of a
    messages row, or an `audios` column without tags drops the row as `audio_refused`, weighed
    or built, and the loader counts it."""
    good = {"images": [cell(64, 48)], "texts": [turn("What is this?", "A red box.")]}
    tagged = {"images": [], "texts": [turn("<audio> What is said?", "Hello.")]}
    item = to_cauldron(
        {"messages": [
            {"role": "user", "content": [{"type": "audio", "path": "a.wav"}, {"type": "text", "text": "Said?"}]},
            {"role": "assistant", "content": "Hello."},
        ]},
        "messages", str(tmp_path), None,
    )  # fmt: skip
    column = to_cauldron(
        {"messages": [{"role": "user", "content": "Said?"}, {"role": "assistant", "content": "Hi."}],
         "audios": ["a.wav"]},
        "messages", str(tmp_path), None,
    )  # fmt: skip
    assert column["texts"][0]["user"] == "<audio>Said?"
    rows = [
        good,
        tagged,
        {"images": [], "texts": item["texts"]},
        {"images": [], "texts": column["texts"]},
    ]
    _, _, _, reasons = tiny.weigh([r["texts"] for r in rows], [r["images"] for r in rows])
    assert reasons == [None, AUDIO_REFUSED, AUDIO_REFUSED, AUDIO_REFUSED]
    assert tiny.make_sample(tagged, 1)["drop_reason"] == AUDIO_REFUSED
    dataset = VQADataset(Dataset.from_list(rows, features=FEATURES), tiny.processor)
    loader = PackedDataLoader(
        PackedDataset(dataset, config=PackingConfig(max_length=512)), num_workers=0
    )
    assert sum(int(batch["samples_per_pack"].sum()) for batch in loader) == 1
    assert loader.dataset.plan().dropped == {AUDIO_REFUSED: 3}


# The planned loader (examples/pack_planned.py) ---------------------------------------------------


@pytest.mark.slow  # the script weighs every family's image costs for its figure: 30-60 s
@pytest.mark.parametrize("name", ["gemma4", "internvl"])
def test_the_planned_loader_runs_offline_for_the_family(run_main, tmp_path, name):
    """`uv run examples/pack_planned.py --model gemma4 --num-rows 200` (and internvl): every row
    trained or counted. Gemma 4's checkpoints sample 32 frames a clip, so the synthetic clips
    (4-24 frames) are all refused; InternVL's offline processor samples 4 and packs them."""
    metrics = tmp_path / "m.json"
    status, _, err = run_main(
        "examples/pack_planned.py", "--model", name, "--num-rows", "200",
        "--out-dir", str(tmp_path), "--metrics-json", str(metrics),
    )  # fmt: skip
    assert status == 0, err
    report = json.loads(metrics.read_text())
    assert report["samples"] + sum(report["dropped"].values()) == report["rows_read"] == 300
    refused = {"gemma4": {VIDEO_REFUSED: 100}, "internvl": {}}[name]
    assert report["dropped"] == refused and report["utilization"] > 0.9
