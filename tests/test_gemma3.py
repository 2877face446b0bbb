"""Gemma 3 (mmdp.data.families.gemma3): pan-and-scan weighed from image headers, the attention masks mmdp
builds for packed rows, and what FlashAttention does with Gemma 3's bidirectional images.

Models are tests/test_families.py's tiny random Gemma 3 (28 px images, 4 soft tokens each, a
sliding window of 16), float32, on the CPU; weights are checked with the real processor (896 px).
"""

import io

import pytest
import torch
from PIL import Image
from test_families import (
    cell,
    language_model,
    packed_batch,
    summed_losses_alone,
    summed_losses_packed,
    turn,
)
from transformers import Gemma3ImageProcessor, Gemma3Processor
from transformers.models.gemma3.modeling_gemma3 import (
    create_masks_for_vision_model,
    get_block_sequence_ids_for_mask,
)

from mmdp.batch import sample_ids
from mmdp.data.conversation import chat_messages, chat_turns
from mmdp.data.families import family_for
from mmdp.data.families.gemma3 import (
    Gemma3,
    offline_processor,
    pan_and_scan_crops,
    tiny_processor,
)
from mmdp.errors import UserError
from mmdp.models.attention import flash_attention_on_cpu, use_attention
from mmdp.models.gemma3_masks import packed_attention_masks
from mmdp.models.inputs import model_inputs
from mmdp.models.tiny.gemma3 import tiny_model

DEFAULTS = {
    "pan_and_scan_min_crop_size": 256,
    "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}


@pytest.fixture(scope="module")
def model():
    return tiny_model(tiny_processor(), attn_implementation="eager")


def worst_relative_error(packed: list[float], alone: list[float]) -> float:
    return max(abs(p - a) / a for p, a in zip(packed, alone))


# Pan-and-scan ----------------------------------------------------------------------------------


# (width, height) -> crops, with Gemma3Processor's defaults: the ratio rounded half up, 2 to 4
# crops along the long edge, none under a ratio of 1.2 or for crops under 256 px.
CROPS = {
    (896, 896): 0,
    (299, 250): 0,  # ratio 1.196
    (640, 480): 2,  # ratio 1.33 rounds to 1, raised to 2 crops of 320 x 480
    (1792, 896): 2,
    (1000, 300): 3,
    (4000, 300): 4,  # ratio 13, at most 4
    (300, 4000): 4,
    (768, 256): 3,
    (767, 256): 2,  # 3 crops would be 255.7 px wide: 767 // 256 = 2
    (257, 128): 0,  # 2 crops of 129 x 128: under 256 px
    (1, 1): 0,
}


def test_pan_and_scan_crops_by_hand_and_as_the_image_processor_cuts_them():
    image_processor = Gemma3ImageProcessor(size={"height": 28, "width": 28})  # the cut is by size
    for (width, height), crops in CROPS.items():
        assert pan_and_scan_crops(width, height, **DEFAULTS) == crops, (width, height)
        image = Image.new("RGB", (width, height))
        made = image_processor(image, do_pan_and_scan=True, **DEFAULTS)["num_crops"]
        assert list(made) == [crops], (width, height)


def processor_output(family, row: dict) -> dict:
    """What the processor makes of a row, given the family's pan-and-scan settings."""
    text = family.render(chat_messages(chat_turns(row["texts"], ()), len(row["images"])))
    images = [Image.open(io.BytesIO(image["bytes"])).convert("RGB") for image in row["images"]]
    return family.processor(text=[text], images=images, return_tensors="pt", **family.pan_and_scan)


def test_pan_and_scan_weights_are_the_processors_own_ids():
    """Real processor (896 px, 256 tokens a run): 2 + 4 crops, then 3 crops."""
    family = Gemma3(offline_processor(), do_pan_and_scan=True)
    texts = [turn("Describe them.", "Two red rectangles.")]
    rows = [
        {"images": [cell(640, 480), cell(300, 4000)], "texts": texts},
        {"images": [cell(1000, 300)], "texts": texts},
    ]
    lengths, _, patches, _ = family.weigh([r["texts"] for r in rows], [r["images"] for r in rows])
    for row, length, patch_count, runs in zip(rows, lengths, patches, (1 + 2 + 1 + 4, 1 + 3)):
        sample, out = family.make_sample(row, 0), processor_output(family, row)
        assert len(sample["input_ids"]) == length
        assert torch.equal(sample["input_ids"], out["input_ids"][0])
        assert torch.equal(sample["token_type_ids"], out["token_type_ids"][0])
        assert len(sample["pixel_values"]) == len(out["pixel_values"]) == runs
        assert patch_count == sample["patches"] == runs * 64 * 64  # (896 / 14)^2 a run


def test_pan_and_scan_is_the_familys_setting_and_in_the_weights_cache_key():
    """Gemma3Processor sends its own do_pan_and_scan=False at every call, whatever its image
    processor was built with: the family passes its setting at call time instead."""
    image_processor = Gemma3ImageProcessor(size={"height": 28, "width": 28}, do_pan_and_scan=True)
    processor = Gemma3Processor(
        image_processor=image_processor, tokenizer=tiny_processor().tokenizer
    )
    image = Image.new("RGB", (640, 480))
    assert len(processor(text="<start_of_image>", images=[image])["pixel_values"]) == 1  # ignored
    family = Gemma3(processor, do_pan_and_scan=True)
    assert len(family.vision_inputs([image])["pixel_values"]) == 3  # the image and 2 crops
    assert family.fingerprint() != family_for(tiny_processor()).fingerprint()
    # a family that would silently not apply the image processor's setting is refused
    with pytest.raises(UserError, match=r"do_pan_and_scan=True, which Gemma3Processor"):
        family_for(processor)


def test_packed_rows_with_pan_and_scan_crops_give_each_sample_its_loss_alone(model):
    """The tiny model with crops from 8 px on: 2, 3, 3, 3 and 0 crops, their pixel rows in the
    order of their tokens."""
    family = Gemma3(tiny_processor(), do_pan_and_scan=True, pan_and_scan_min_crop_size=8)
    batch, samples = packed_batch(family)
    assert [s["num_crops"].tolist() for s in samples if s["image_count"]] == [
        [2],
        [3, 3],
        [3],
        [0],
    ]
    alone = summed_losses_alone(family, model, samples)
    assert summed_losses_packed(model, batch) == pytest.approx(alone, rel=1e-5)


# The masks of a packed row -----------------------------------------------------------------------


def allowed(masks: dict) -> dict:
    """Eager masks (0 where attended, the dtype's minimum elsewhere) as booleans."""
    return {layer: mask[:, 0] == 0 for layer, mask in masks.items()}


def own_masks(model, input_ids, token_type_ids, position_ids=None) -> dict:
    """The masks Gemma3Model builds itself (modeling_gemma3.py:879-893)."""
    embeds = torch.empty(*input_ids.shape, 0)
    blocks = get_block_sequence_ids_for_mask(token_type_ids)
    return create_masks_for_vision_model(
        model.config.get_text_config(), embeds, None, None, position_ids, blocks
    )


def test_packed_masks_are_each_samples_own_and_the_models_are_not(model):
    """Each sample's square of mmdp's masks equals the masks the model builds for the sample alone,
    and nothing crosses samples. The model's own sliding-window mask of the same rows differs
    inside the samples after the first of each row (transformers 5.23): when this part fails,
    transformers has fixed it and packed_attention_masks can go."""
    family = family_for(tiny_processor())
    batch, samples = packed_batch(family)
    ours = allowed(packed_attention_masks(batch, model))
    theirs = allowed(
        own_masks(model, *(batch[k] for k in ("input_ids", "token_type_ids", "position_ids")))
    )
    owner = sample_ids(batch)
    starts = [
        (int(row), int(at)) for row, at in ((owner >= 0) & (batch["position_ids"] == 0)).nonzero()
    ]
    wrong = 0
    for (row, start), sample in zip(starts, samples, strict=True):
        end = start + len(sample["input_ids"])
        alone = allowed(own_masks(model, sample["input_ids"][None], sample["token_type_ids"][None]))
        for layer in ours:
            assert torch.equal(ours[layer][row, start:end, start:end], alone[layer][0])
            wrong += int((theirs[layer][row, start:end, start:end] != alone[layer][0]).sum())
    for layer, mask in ours.items():
        same = owner[:, :, None] == owner[:, None, :]
        assert not (mask & ~same & (owner[:, :, None] >= 0)).any(), layer
    assert wrong > 0


def test_a_gemma3_batch_needs_its_model():
    batch, _ = packed_batch(family_for(tiny_processor()))
    with pytest.raises(ValueError, match="needs its model"):
        model_inputs(batch)


# FlashAttention ----------------------------------------------------------------------------------


def test_flash_attention_makes_the_images_causal(model):
    """Under FlashAttention, token_type_ids change nothing: a packed batch gives each sample its
    loss alone with causal images (eager, no token_type_ids), not Gemma 3's own (bidirectional)."""
    family = family_for(tiny_processor())
    batch, samples = packed_batch(family)
    bidirectional = summed_losses_alone(family, model, samples)
    family.token_keys = ()  # alone without token_type_ids: causal images
    causal = summed_losses_alone(family, model, samples)
    with flash_attention_on_cpu():
        use_attention(language_model(model), "flash_attention_2")
        try:
            packed = summed_losses_packed(model, batch)
        finally:
            use_attention(model, "eager")
    assert packed == pytest.approx(causal, rel=1e-5)
    assert worst_relative_error(packed, bidirectional) > 1e-4
