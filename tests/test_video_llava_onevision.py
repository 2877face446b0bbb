"""LLaVA-OneVision videos, proved as Qwen's are (tests/test_video.py): a video's weight from its
container's header is the length of the sample the real processor builds, with the processor's
own frames and pixels; a clip shorter than the frames the processor samples is a counted drop;
and a packed batch of videos, images and text through a tiny random
LlavaOnevisionForConditionalGeneration (the real class) gives each sample the summed loss it gets
alone, while the videos out of order break that equality."""

import io

import pytest
import torch
from conftest import two_packs_of_three
from PIL import Image
from test_families import cell, summed_losses_alone, summed_losses_packed, turn
from test_video import clip

from mmdp.data.conversation import chat_messages, chat_turns
from mmdp.data.families import family_for, offline_processor, tiny_processor
from mmdp.data.families.llava_onevision import VIDEO_FRAMES
from mmdp.data.videos import decode_frames, video_metadata
from mmdp.drop_reasons import UNDECODABLE_VIDEO, VIDEO_REFUSED
from mmdp.errors import UserError
from mmdp.models.inputs import model_inputs
from mmdp.models.tiny import tiny_model

TEXTS = [turn("Which way does it move?", "Left to right.")]


def processor_outputs(family, row: dict) -> dict:
    """The real processor on a row, given every frame of its videos (it samples them itself)."""
    messages = chat_messages(chat_turns(row["texts"], ()), len(row["images"]), len(row["videos"]))
    text = family.processor.apply_chat_template(messages, tokenize=False)
    images = [Image.open(io.BytesIO(image["bytes"])).convert("RGB") for image in row["images"]]
    metadata = [video_metadata(video) for video in row["videos"]]
    videos = [decode_frames(v, range(m.total_num_frames)) for v, m in zip(row["videos"], metadata)]
    return family.processor(
        text=[text], images=images or None, videos=videos, video_metadata=metadata,
        return_tensors="pt",
    )  # fmt: skip


@pytest.fixture(scope="module")
def family():
    return family_for(offline_processor("llava_onevision"))


# (frames, fps, width, height): none of them the synthetic task's; 3 frames are fewer than the
# processor samples (VIDEO_FRAMES = 4) and refused by its rule, as by the processor itself
HELD_OUT = [(5, 3, 40, 30), (9, 30, 100, 36), (3, 5, 32, 32)]


def test_video_weight_is_the_processed_length_and_the_processors_own_frames(family):
    rows = [{"images": [], "videos": [clip(*size)], "texts": TEXTS} for size in HELD_OUT] + [
        {
            "images": [cell(40, 30)],
            "videos": [clip(6, 4, 48, 32), clip(*HELD_OUT[1])],
            "texts": TEXTS,
        }
    ]
    lengths, images, patches, reasons = family.weigh(
        [r["texts"] for r in rows], [r["images"] for r in rows], [r["videos"] for r in rows]
    )
    assert reasons == [None, None, VIDEO_REFUSED, None]
    for row, length, count, patch_count, reason in zip(rows, lengths, images, patches, reasons):
        sample = family.make_sample(row, 0)
        if reason is not None:  # refused from the header alone, and so when built
            assert sample["drop_reason"] == VIDEO_REFUSED
            with pytest.raises(ValueError, match="num_frames"):
                processor_outputs(family, row)  # the processor refuses it too
            continue
        out = processor_outputs(family, row)
        assert len(sample["input_ids"]) == length and torch.equal(
            sample["input_ids"], out["input_ids"][0]
        )
        assert torch.equal(sample["pixel_values_videos"], out["pixel_values_videos"])
        assert sample["pixel_values_videos"].shape[1] == VIDEO_FRAMES
        assert (count, patch_count) == (sample["image_count"], sample["patches"])


def test_a_broken_video_is_a_counted_drop_and_a_processor_without_fixed_frames_one_sentence(
    family,
):
    good = clip(6, 4, 48, 32)["bytes"]
    broken = [{"bytes": b"not a video at all"}, {"bytes": good[: len(good) // 2]}]
    _, _, _, reasons = family.weigh([TEXTS] * 2, [[]] * 2, [[video] for video in broken])
    assert reasons == [UNDECODABLE_VIDEO] * 2
    processor = offline_processor("llava_onevision")
    processor.video_processor.do_sample_frames = False  # every frame: videos of a batch differ
    with pytest.raises(UserError, match="do_sample_frames=True and num_frames"):
        family_for(processor).weigh([TEXTS], [[]], [[clip(6, 4, 48, 32)]])


# Packed batches through the real model class ----------------------------------------------------

# Six samples, 3 a pack: videos of different lengths, rates and sizes (the same frames each,
# sampled), with an image, with two videos, text only. The first and last videos move otherwise.
ROWS = [
    {"images": [], "videos": [(8, 4, 48, 32, "left to right")], "texts": TEXTS},
    {"images": [cell(64, 48)], "videos": [(6, 2, 32, 64)], "texts": [turn("Same?", "No.")]},
    {"images": [], "videos": [], "texts": [turn("Spell cat.", "C-A-T.")]},
    {"images": [], "videos": [(12, 8, 64, 48), (4, 2, 32, 32)], "texts": [turn("Longer?", "1.")]},
    {"images": [cell(56, 56, (10, 10, 200))], "videos": [], "texts": [turn("Colour?", "Blue.")]},
    {"images": [], "videos": [(16, 24, 48, 48, "bottom to top")], "texts": [turn("To?", "Up.")]},
]


@pytest.fixture(scope="module")
def tiny():
    """(family, model, packed batch, samples, each sample's summed loss alone)."""
    family = family_for(tiny_processor("llava_onevision"))
    model = tiny_model(family.processor, attn_implementation="eager")
    rows = [{**row, "videos": [clip(*size) for size in row["videos"]]} for row in ROWS]
    samples = [family.make_sample(row, i) for i, row in enumerate(rows)]
    assert all(s["drop_reason"] is None for s in samples)
    batch = two_packs_of_three(family, samples)
    return family, model, batch, samples, summed_losses_alone(family, model, samples)


def test_packed_samples_with_videos_see_only_themselves(tiny):
    family, model, batch, samples, alone = tiny
    inputs = model_inputs(batch, model)  # as Trainer calls the model: model(**inputs)
    videos = [s["pixel_values_videos"] for s in samples if "pixel_values_videos" in s]
    assert torch.equal(inputs["pixel_values_videos"], torch.cat(videos))  # in token order
    assert len(inputs["pixel_values_videos"]) == 5 and "pixel_values" in inputs
    assert summed_losses_packed(model, batch) == pytest.approx(alone, rel=1e-5)


def test_videos_out_of_order_break_the_equality(tiny):
    """The trap: a collator that gathers the batch's videos in another order than their tokens
    (the first and the last swapped). The model checks only the total of video features."""
    family, model, batch, _, alone = tiny
    inputs = model_inputs(batch, model)
    videos = inputs["pixel_values_videos"]
    swapped = {**inputs, "pixel_values_videos": videos[[len(videos) - 1, 1, 2, 3, 0]]}
    losses = summed_losses_packed(model, batch, swapped)
    worst = max(abs(p - a) / a for p, a in zip(losses, alone))
    print(f"llava_onevision, videos_out_of_order: worst relative error {worst:.1e}")
    assert worst > 1e-4
