"""Videos (Qwen2.5-VL, Qwen3-VL): weights from container headers equal to the samples the real
processors build, broken videos counted, and packed batches with videos that keep every sample
apart in the real transformers classes (tiny random configs, float32, CPU).

Held-out clips (lengths, frame rates and sizes the synthetic task never draws) are encoded here;
a packed batch holds a video alone, a video with an image, two videos, an image alone and a
text-only sample, each of which must give the summed loss it gets run alone, the model computing
its own positions; and each trap (video grids out of order, a video's temporal positions
restarted) must break that equality.
"""

import io
import json
import sys

import numpy as np
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

from mmdp.batch import build_pack, collate_packs
from mmdp.data.conversation import chat_messages, chat_turns
from mmdp.data.families import family_for, offline_processor
from mmdp.data.families.qwen_vl import VIDEO_SETTINGS
from mmdp.data.reading.sources import VIDEO_FEATURES
from mmdp.data.synthetic.videos import encode_mp4, generate_video_row, moving_shape
from mmdp.data.videos import decode_frames, video_metadata
from mmdp.data.vqa_dataset import VQADataset
from mmdp.drop_reasons import UNDECODABLE_VIDEO, VIDEO_REFUSED
from mmdp.errors import UserError
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.models.attention import use_attention
from mmdp.models.inputs import model_inputs
from mmdp.models.tiny import tiny_model
from mmdp.packing.packing_config import PackingConfig

FAMILIES = ("qwen2_5_vl", "qwen3_vl")


def clip(frames: int, fps: int, width: int, height: int, motion: str = "left to right") -> dict:
    return {"bytes": encode_mp4(moving_shape("circle", "red", motion, frames, width, height), fps)}


# Held-out clips: (frames, fps, width, height), none of them the synthetic task's; 1 frame is
# refused by both processors (fewer frames than a temporal patch). The default suite weighs three,
# the slow group the two larger ones.
HELD_OUT = [
    (5, 3, 40, 30),
    (2, 1, 64, 64),
    (1, 5, 32, 32),
    pytest.param((9, 30, 100, 36), marks=pytest.mark.slow),
    pytest.param((30, 25, 160, 90), marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return family_for(offline_processor(request.param))


def processor_outputs(family, row: dict) -> dict:
    """What the family's own processor makes of a row, given every frame of its videos and their
    metadata (it samples the frames itself)."""
    turns = chat_turns(row["texts"], ())
    messages = chat_messages(turns, len(row["images"]), len(row["videos"]))
    text = family.processor.apply_chat_template(messages, tokenize=False)
    images = [Image.open(io.BytesIO(image["bytes"])).convert("RGB") for image in row["images"]]
    metadata = [video_metadata(video) for video in row["videos"]]
    videos = [decode_frames(v, range(m.total_num_frames)) for v, m in zip(row["videos"], metadata)]
    return family.processor(
        text=[text],
        images=images or None,
        videos=videos,
        video_metadata=metadata,
        return_tensors="pt",
        return_mm_token_type_ids=True,
    )


# Weights ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", HELD_OUT, ids=lambda s: "{}f-{}fps-{}x{}".format(*s))
def test_video_weight_is_the_processed_length_and_the_processors_own_inputs(family, size):
    texts = [turn("Which way does it move?", "Left to right.")]
    rows = [
        {"images": [], "videos": [clip(*size)], "texts": texts},
        {"images": [cell(40, 30)], "videos": [clip(*size), clip(6, 4, 48, 32)], "texts": texts},
    ]
    lengths, images, patches, reasons = family.weigh(
        [r["texts"] for r in rows], [r["images"] for r in rows], [r["videos"] for r in rows]
    )
    for row, length, count, patch_count, reason in zip(rows, lengths, images, patches, reasons):
        sample = family.make_sample(row, 0)
        if reason is not None:  # refused from the header alone, and so when built
            assert reason == sample["drop_reason"] == VIDEO_REFUSED
            with pytest.raises((ValueError, ZeroDivisionError)):
                processor_outputs(family, row)  # the processor refuses it too
            continue
        assert len(sample["input_ids"]) == length == len(sample["labels"])
        assert (count, patch_count) == (sample["image_count"], sample["patches"])
        assert sample["video_count"] == len(row["videos"])
        out = processor_outputs(family, row)
        assert torch.equal(sample["input_ids"], out["input_ids"][0])
        assert torch.equal(sample["mm_token_type_ids"], out["mm_token_type_ids"][0])
        assert torch.equal(sample["video_grid_thw"], out["video_grid_thw"])
        assert torch.equal(sample["pixel_values_videos"], out["pixel_values_videos"])
        if "second_per_grid_ts" in out:
            assert sample["second_per_grid_ts"].tolist() == pytest.approx(out["second_per_grid_ts"])


def test_the_per_video_cap_is_the_processors_setting(family):
    """A smaller video budget (max_video_tokens, as ms-swift's VIDEO_MAX_TOKEN_NUM caps it) costs
    fewer patches, weighed as the capped processor builds the sample (small frames allowed, so
    the cap, not the minimum, decides)."""
    row = {"images": [], "videos": [clip(30, 25, 160, 96)], "texts": [turn("Where?", "Left.")]}
    costs = []
    for max_video_tokens in (None, 4):
        processor = offline_processor(family.name)
        videos = processor.video_processor
        small = {"shortest_edge": 4 * (videos.patch_size * videos.merge_size) ** 2}
        settings = {"max_video_tokens": max_video_tokens} if max_video_tokens else {}
        processor.video_processor = type(videos)(
            **VIDEO_SETTINGS,
            **settings,
            size={"longest_edge": videos.size["longest_edge"], **small},
        )
        capped = family_for(processor)
        (length,), _, (patches,), _ = capped.weigh([row["texts"]], [[]], [row["videos"]])
        sample = capped.make_sample(row, 0)
        assert (len(sample["input_ids"]), sample["patches"]) == (length, patches)
        assert torch.equal(sample["input_ids"], processor_outputs(capped, row)["input_ids"][0])
        costs.append((length, patches))
    assert costs[1][0] < costs[0][0] and costs[1][1] < costs[0][1]


def test_a_broken_video_is_a_counted_drop_never_a_crash(family):
    good = clip(6, 4, 48, 32)["bytes"]
    broken = {
        "garbage": {"bytes": b"not a video at all"},
        "truncated": {"bytes": good[: len(good) // 2]},
        "missing": {"path": "/no/such/clip.mp4"},
    }
    texts = [turn("Hi?", "Hello.")]
    _, _, _, reasons = family.weigh([texts] * 3, [[]] * 3, [[video] for video in broken.values()])
    assert reasons == [UNDECODABLE_VIDEO] * 3
    for video in broken.values():
        row = {"images": [], "videos": [video], "texts": texts}
        assert family.make_sample(row, 0)["drop_reason"] == UNDECODABLE_VIDEO


def test_a_video_by_path_weighs_as_by_bytes(family, tmp_path):
    video = clip(6, 4, 48, 32)
    path = tmp_path / "clip.mp4"
    path.write_bytes(video["bytes"])
    texts = [turn("Which way?", "Left to right.")]
    by_bytes, by_path = family.weigh([texts] * 2, [[]] * 2, [[video], [{"path": str(path)}]])[0]
    assert by_bytes == by_path


def test_without_pyav_a_video_is_one_sentence(monkeypatch):
    from mmdp.data.videos import require_av
    from mmdp.errors import UserError

    monkeypatch.setitem(sys.modules, "av", None)  # import av raises ImportError
    with pytest.raises(UserError, match=r"video extra installs: uv sync --extra video"):
        require_av()


def test_the_synthetic_video_rows_are_what_they_say():
    row = generate_video_row(3)
    metadata = video_metadata(row["videos"][0])
    said = row["texts"][1]["assistant"]
    assert f"{metadata.total_num_frames} frames at {metadata.fps:g} fps" in said
    frames = decode_frames(row["videos"][0], [0, metadata.total_num_frames - 1])
    # the shape's centre of mass moves as the first answer says
    first, last = (np.argwhere((f < 200).any(-1)).mean(0) for f in frames)
    motion = row["texts"][0]["assistant"]
    axis, sign = {"left to": (1, 1), "right to": (1, -1), "top to": (0, 1), "bottom to": (0, -1)}[
        next(k for k in ("left to", "right to", "top to", "bottom to") if k in motion)
    ]
    assert sign * (last[axis] - first[axis]) > 0


# Packed batches through the real model class ----------------------------------------------------


def tiny_video_processor(name: str):
    """The family's processor with small video frames (min 8 merged patches a frame), so that
    the tiny model's vision encoder runs fast on CPU: the same rules, another setting."""
    processor = offline_processor(name)
    videos = processor.video_processor
    factor = (videos.patch_size * videos.merge_size) ** 2
    processor.video_processor = type(videos)(
        **VIDEO_SETTINGS, size={"shortest_edge": 8 * factor, "longest_edge": 64 * factor}
    )
    return processor


# The six samples of the packed batch: 3 per pack, videos of different lengths, rates and sizes.
# (frames, fps, width, height, motion) each video; the first and the last move otherwise, so
# swapping them (a trap below) shows.
ROWS = [
    {
        "images": [],
        "videos": [(8, 4, 48, 32, "left to right")],
        "texts": [turn("Which way?", "Left to right.")],
    },
    {"images": [cell(64, 48)], "videos": [(6, 2, 32, 64)], "texts": [turn("Same?", "No.")]},
    {"images": [], "videos": [], "texts": [turn("Spell cat.", "C-A-T."), turn("Dog?", "D-O-G.")]},
    {
        "images": [],
        "videos": [(12, 8, 64, 48), (4, 2, 32, 32)],
        "texts": [turn("Which is longer?", "The first one.")],
    },
    {"images": [cell(56, 56, (10, 10, 200))], "videos": [], "texts": [turn("Colour?", "Blue.")]},
    {
        "images": [],
        "videos": [(16, 24, 48, 48, "bottom to top")],
        "texts": [turn("Where to?", "Up, I think.")],
    },
]


@pytest.fixture(scope="module")
def tiny_family(family):
    return family_for(tiny_video_processor(family.name))


@pytest.fixture(scope="module")
def model(tiny_family):
    """The family's tiny model, its attention sharpened (queries and keys x 4) so that where a
    token sits shows in the loss: a trap's error stands well clear of float32 noise."""
    model = tiny_model(tiny_family.processor, attn_implementation="eager")
    with torch.no_grad():
        for name, weight in language_model(model).named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                weight.mul_(4)
    return model


@pytest.fixture(scope="module")
def packed(tiny_family):
    """(batch, samples): the six rows in two packs of 3, a padding tail in each."""
    return packed_batch(tiny_family)


def packed_batch(tiny_family) -> tuple[dict, list[dict]]:
    rows = [{**row, "videos": [clip(*size) for size in row["videos"]]} for row in ROWS]
    samples = [tiny_family.make_sample(row, i) for i, row in enumerate(rows)]
    assert all(s["drop_reason"] is None for s in samples)
    return two_packs_of_three(tiny_family, samples), samples


@pytest.fixture(scope="module")
def alone_eager(tiny_family, model, packed) -> list[float]:
    """Each sample's summed loss run alone, under eager attention."""
    return summed_losses_alone(tiny_family, model, packed[1])


def test_a_packed_batch_carries_the_videos_in_token_order(tiny_family, packed):
    batch, samples = packed
    inputs = model_inputs(batch)
    grids = torch.cat([s["video_grid_thw"] for s in samples if s["video_count"]])
    assert torch.equal(inputs["video_grid_thw"], grids)
    assert len(inputs["pixel_values_videos"]) == int(grids.prod(-1).sum())
    assert torch.equal(
        inputs["pixel_values"], torch.cat([s["pixel_values"] for s in samples if s["image_count"]])
    )
    assert ("second_per_grid_ts" in inputs) == (tiny_family.name == "qwen2_5_vl")
    video_tokens = int((inputs["mm_token_type_ids"] == 2).sum())
    assert video_tokens == int(grids.prod(-1).sum()) // tiny_family.merge_size**2
    assert batch["patches_per_pack"].tolist() == [
        sum(s["patches"] for s in samples[:3]),
        sum(s["patches"] for s in samples[3:]),
    ]


# The default suite checks eager (whose alone losses the traps reuse); the other implementations
# run with the slow group (uv run pytest -m slow).
ATTENTION = (
    "eager",
    pytest.param("sdpa", marks=pytest.mark.slow),
    pytest.param("flex_attention", marks=pytest.mark.slow),
    pytest.param("flash_attention_2", marks=pytest.mark.slow),
)


@pytest.mark.parametrize("attention", ATTENTION, indirect=True)
def test_packed_samples_with_videos_see_only_themselves(
    tiny_family, model, packed, alone_eager, attention
):
    """Called as Trainer calls the model (model(**inputs)); alone under the same attention
    (flex_attention: eager, which it equals on one sample)."""
    packed_losses, alone = losses_packed_and_alone(
        tiny_family, model, packed, alone_eager, attention
    )
    assert packed_losses == pytest.approx(alone, rel=1e-5)


def losses_packed_and_alone(family, model, packed, alone_eager, attention) -> tuple[list, list]:
    """Each sample's summed loss in the packed batch under `attention`, the model called as
    Trainer calls it (model(**inputs)), and each alone under the same attention (flex_attention:
    `alone_eager`, which it equals on one sample)."""
    batch, samples = packed
    alone = alone_eager
    try:
        if attention not in ("eager", "flex_attention"):
            use_attention(language_model(model), attention)
            alone = summed_losses_alone(family, model, samples)
        use_attention(language_model(model), attention)
        return summed_losses_packed(model, batch), alone
    finally:
        use_attention(model, "eager")


def videos_out_of_order(batch: dict, inputs: dict) -> dict:
    """The first and the last video of the batch swapped, patches and grids, as a collator that
    gathers videos in another order than their tokens. The model checks only the total of video
    features, so one sample's frames flow into another's tokens, silently."""
    grids = inputs["video_grid_thw"]
    blocks = list(inputs["pixel_values_videos"].split(grids.prod(-1).tolist()))
    order = [len(blocks) - 1, *range(1, len(blocks) - 1), 0]
    return {
        **inputs,
        "pixel_values_videos": torch.cat([blocks[i] for i in order]),
        "video_grid_thw": grids[order],
    }


def temporal_positions_restarted(batch: dict, inputs: dict, merge_size: int = 2) -> dict:
    """Every frame of a video at the temporal position of its first, as a collator that
    positions each frame as an image would (Qwen2.5-VL's frames are one run of tokens, Qwen3-VL's
    one run each, between timestamps: the video's tokens are counted off its grid either way)."""
    positions = inputs["position_ids"].clone()  # [4, B, L]
    temporal = positions[1].view(-1)  # a view: writes go to `positions`
    video_tokens = (inputs["mm_token_type_ids"] == 2).view(-1).nonzero().flatten()
    start = 0
    for t, h, w in inputs["video_grid_thw"].tolist():
        per_frame = h * w // merge_size**2
        tokens = video_tokens[start : start + t * per_frame].view(t, per_frame)
        temporal[tokens] = temporal[tokens[0]]
        start += t * per_frame
    assert start == len(video_tokens)
    return {**inputs, "position_ids": positions}


def test_the_video_traps_break_the_equality(tiny_family, model, packed, alone_eager):
    batch, alone = packed[0], alone_eager
    for trap in (videos_out_of_order, temporal_positions_restarted):
        inputs = trap(batch, model_inputs(batch, model))
        losses = summed_losses_packed(model, batch, inputs)
        worst = max(abs(p - a) / a for p, a in zip(losses, alone))
        print(f"{tiny_family.name}, {trap.__name__}: worst relative error {worst:.1e}")
        assert worst > 1e-4, trap.__name__


def test_a_batch_of_videos_without_images_gives_the_model_its_videos(
    tiny_family, model, packed, alone_eager
):
    """No image in the batch: model_inputs still passes the videos (and each sample its loss)."""
    samples = [packed[1][k] for k in (0, 2, 5)]  # a video, text only, a video
    used = sum(len(s["input_ids"]) for s in samples)
    pack = build_pack(
        samples,
        [len(s["input_ids"]) for s in samples],
        max_length=used + 3,
        pad_token_id=tiny_family.pad_token_id,
        batch_index=0,
    )
    batch = collate_packs([pack], tiny_family)
    inputs = model_inputs(batch, model)
    assert "pixel_values" not in inputs and len(inputs["pixel_values_videos"])
    expected = [alone_eager[k] for k in (0, 2, 5)]
    assert summed_losses_packed(model, batch) == pytest.approx(expected, rel=1e-5)


# Budgets, through the planned loader ----------------------------------------------------------


@pytest.mark.parametrize(
    "pretokenize",
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["weighed", "pretokenized"],
)
def test_a_video_counts_against_the_patch_budget_whole_and_a_broken_one_is_counted(
    tiny_family, pretokenize
):
    """The loader weighs the videos from their headers, drops the one over max_patches and the
    unreadable one (counted by reason), and packs every other video whole in one pack."""
    texts = [turn("Which way?", "Left to right.")]
    videos = [(8, 4, 48, 32), (24, 8, 96, 64), (4, 2, 32, 32), (12, 10, 64, 48)]
    rows = [{"images": [], "videos": [clip(*size)], "texts": texts} for size in videos]
    rows.append({"images": [], "videos": [{"bytes": b"broken", "path": None}], "texts": texts})
    rows.append({"images": [cell(40, 30)], "videos": [], "texts": texts})
    rows.append({"images": [], "videos": [], "texts": [turn("2 + 2?", "4.")]})
    _, _, patches, _ = tiny_family.weigh(
        *zip(*[(r["texts"], r["images"], r["videos"]) for r in rows])
    )
    max_patches = max(patches[:4]) - 1  # the largest video is over it
    over = {i for i, p in enumerate(patches) if p > max_patches}
    dataset = Dataset.from_list(rows, features=VIDEO_FEATURES)
    config = PackingConfig(max_length=1024, max_patches=max_patches, packs_per_batch=2)
    packed = PackedDataset(
        VQADataset(dataset, tiny_family.processor), config=config, pretokenize=pretokenize
    )
    batches = list(PackedDataLoader(packed, num_workers=0))
    assert packed.plan().dropped == {"too_many_patches": len(over), UNDECODABLE_VIDEO: 1}
    used = sorted(row for b in batches for row in b["sample_index"].tolist())
    assert used == sorted(set(range(len(rows))) - over - {4}) and set(used) & {0, 1, 2, 3}
    for batch in batches:
        assert (batch["patches_per_pack"] <= config.max_patches).all()
        inputs = model_inputs(batch)
        if "video_grid_thw" in inputs:
            grids = inputs["video_grid_thw"]
            assert len(inputs["pixel_values_videos"]) == int(grids.prod(-1).sum())
            video_tokens = int((inputs["mm_token_type_ids"] == 2).sum())
            assert video_tokens == int(grids.prod(-1).sum()) // tiny_family.merge_size**2


# The planned loader (examples/pack_planned.py) -------------------------------------------------


@pytest.mark.slow  # 46 s on a busy 2-core machine: the offline processors of every family
def test_planned_loader_packs_and_reports_the_videos_for_a_family_that_takes_them(
    run_main, tmp_path
):
    metrics = tmp_path / "m.json"
    status, out, err = run_main(
        "examples/pack_planned.py",
        *("--model", "qwen3_vl", "--num-rows", "24", "--video-rows", "6", "--num-workers", "0"),
        *("--out-dir", str(tmp_path), "--metrics-json", str(metrics)),
    )
    assert status == 0, err
    report = json.loads(metrics.read_text())
    assert report["rows_read"] == 30 and report["samples"] == 30
    assert "videos packed:    6 (tokens per video: min" in out
    assert "of the packs' patch budget" in out


@pytest.mark.slow  # a processor built per family (seconds): the rule is one string
def test_prepared_weights_are_refused_for_other_video_settings(family):
    """A prepared dataset's manifest names the video processor's settings: weights made at 2 fps
    do not pass for a run at 4 (mmdp.weighing.prepared.image_rule)."""
    from mmdp.weighing.prepared import image_rule

    processor = offline_processor(family.name)
    processor.video_processor = type(processor.video_processor)(**{**VIDEO_SETTINGS, "fps": 4})
    assert "fps=2" in image_rule(family)
    assert image_rule(family_for(processor)) != image_rule(family)


def test_qwen2_5_vl_positions_need_the_models_tokens_per_second(tiny_family, model, alone_eager):
    """The trap of a default config: video positions computed at transformers' default
    tokens_per_second (4) for a model configured as the released checkpoints (2) move every
    video's temporal positions, and its loss."""
    if tiny_family.name != "qwen2_5_vl":
        pytest.skip("only Qwen2.5-VL spaces a video's positions by tokens_per_second")

    class DefaultConfig(type(tiny_family)):
        tokens_per_second = None  # transformers' default vision config: 4

    batch, _ = packed_batch(DefaultConfig(tiny_family.processor))
    losses = summed_losses_packed(model, batch, model_inputs(batch))  # the model not checked
    worst = max(abs(p - a) / a for p, a in zip(losses, alone_eager))
    print(f"qwen2_5_vl, another tokens_per_second: worst relative error {worst:.1e}")
    assert worst > 1e-4
    # so model_inputs, given the model, refuses the batch in one sentence
    with pytest.raises(UserError, match="tokens_per_second = 2, but this qwen2_5_vl batch was"):
        model_inputs(batch, model)


def test_the_video_inputs_a_batch_may_carry_are_the_families_video_keys():
    from mmdp.data.families import FAMILIES, family_class
    from mmdp.data.families.base import VIDEO_INPUTS

    keys = {key for where in FAMILIES.values() for key in family_class(where).video_keys}
    assert set(VIDEO_INPUTS) == keys
