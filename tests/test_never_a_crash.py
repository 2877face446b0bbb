"""Bad input never ends an epoch (issue 44): the four paths that did, each as a plain test, with
what the user now sees. The property-based suite over the whole input space is tests/test_fuzz.py;
every bug it found has its plain test here too. docs/faults.md lists every bad input kind.
"""

import functools
import io
from collections import Counter

import datasets
import numpy as np
import pytest
import torch
from bad_rows import mp4_with_broken_data, png_with_broken_data, truncated_jpeg
from datasets import Dataset, Features, List, Value
from PIL import Image

from mmdp.batch import build_pack, collate_packs
from mmdp.data.conversation import chat_messages, chat_turns
from mmdp.data.families import OFFLINE, family_for, tiny_processor
from mmdp.data.families.qwen_vl import Qwen2_5_VL
from mmdp.data.families.smolvlm import Idefics3
from mmdp.data.families.smolvlm import tiny_processor as smolvlm_tiny_processor
from mmdp.data.images import undecoded
from mmdp.data.mixture import MixedRows, mixture_from_dict
from mmdp.data.reading.sources import FEATURES
from mmdp.data.synthetic.rows import encode_png
from mmdp.data.synthetic.videos import encode_clip, encode_mp4, moving_shape
from mmdp.data.videos import video_metadata
from mmdp.data.vqa_dataset import VQADataset
from mmdp.drop_reasons import LEFT_OUT_BY_MIXTURE, TOO_LONG, UNDECODABLE_IMAGE, UNDECODABLE_VIDEO
from mmdp.errors import UserError
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.loading.streaming import StreamingDataLoader, StreamingPackedDataset
from mmdp.models.inputs import model_inputs
from mmdp.models.tiny import tiny_model
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Budgets
from mmdp.planning.source_shares import MixturePlan
from mmdp.report.pack_report import PackReport
from mmdp.report.sources import source_report

# The default suite checks Qwen2.5-VL (the family that crashed); the slow group every family (the
# fuzz's fast profile draws any of them too).
FAMILIES = [
    pytest.param(name, marks=() if name == "qwen2_5_vl" else pytest.mark.slow)
    for name in ("tiny", *OFFLINE, "idefics3")
]


@pytest.fixture(scope="module")
def processors():
    """Each family's tiny processor, built once (a test that changes one restores it)."""
    return functools.cache(tiny_processor)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tokenizer, processors):
    if request.param == "tiny":
        return family_for(tokenizer)
    if request.param == "idefics3":
        return family_for(smolvlm_tiny_processor(Idefics3))
    return family_for(processors(request.param))


def row(image: dict | None, reply: str = "A red box.") -> dict:
    images = [] if image is None else [image]
    return {
        "images": images,
        "texts": [{"user": "What is this?", "assistant": reply, "source": "t"}],
    }


def image_cell(width: int, height: int) -> dict:
    return {"bytes": encode_png(Image.new("RGB", (width, height), (200, 30, 30))), "path": None}


GOOD = image_cell(64, 48)


# 1. A pack whose samples all fail while built ---------------------------------------------------


def pack_of(family, rows: list[dict], first_row: int = 0) -> dict:
    samples = [family.make_sample(r, first_row + i) for i, r in enumerate(rows)]
    lengths = [len(s.get("input_ids", ())) for s in samples]
    return build_pack(
        samples, lengths, max_length=600, pad_token_id=family.pad_token_id, batch_index=0,
        family=family,
    )  # fmt: skip


def test_a_pack_whose_samples_all_fail_is_padding_with_the_familys_keys_and_shapes(family):
    """A large image whose header reads (so it is weighed and planned alone in its pack) and whose
    data does not decode: its pack is one run of padding, with the same keys and shapes as a pack
    of good samples, and the batch stacks. Before, a family with 4-row positions (Qwen-VL) took
    the padding's shape from the first usable sample, found none, and collating raised
    `stack expects each tensor to be equal size, but got [L] at entry 0 and [4, L] at entry 1`;
    the pack also lacked mm_token_type_ids."""
    good = pack_of(family, [row(GOOD), row(None)])
    empty = pack_of(family, [row(png_with_broken_data(900, 700))], first_row=2)
    assert empty["dropped"] == {UNDECODABLE_IMAGE: 1} and empty["sample_index"] == []
    assert empty.keys() == good.keys()
    for key, value in good.items():
        if isinstance(value, torch.Tensor):
            assert empty[key].shape == value.shape, key
    assert not empty["real_token_mask"].any() and (empty["labels"] == -100).all()
    batch = collate_packs([good, empty], family)
    both_good = collate_packs([good, good], family)
    assert batch.keys() == both_good.keys()
    for key in ("input_ids", "labels", "position_ids", "real_token_mask", *family.token_keys):
        assert batch[key].shape == both_good[key].shape, key
    assert batch["samples_per_pack"].tolist() == [2, 0]


@pytest.mark.parametrize("name", ["qwen3_vl", pytest.param("qwen2_5_vl", marks=pytest.mark.slow)])
def test_a_broken_video_alone_in_its_pack_is_padding_too(name, processors):
    """The same with a video whose header reads and whose frames do not (Qwen-VL)."""
    family = family_for(processors(name))
    good = pack_of(family, [row(GOOD), row(None)])
    broken = {**row(None), "videos": [mp4_with_broken_data()]}
    empty = pack_of(family, [broken], first_row=2)
    assert empty["dropped"] == {UNDECODABLE_VIDEO: 1}
    batch = collate_packs([empty, good], family)
    assert batch["position_ids"].shape == (4, 2, 600)
    assert batch["mm_token_type_ids"].shape == (2, 600)


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.filterwarnings("ignore:a list has no shards")
def test_a_large_broken_image_alone_in_its_pack_is_counted_by_both_loaders(num_workers, processors):
    """The held-out probe: Qwen2.5-VL, a large image with a sound header and broken data, alone in
    its pack (its weight is the whole budget), 0 and 2 workers, planned and streaming: every row
    is a sample or counted as undecodable_image."""
    family = family_for(processors("qwen2_5_vl"))
    rows = [row(GOOD)] * 5 + [row(png_with_broken_data(900, 700))] + [row(None)] * 3
    (alone, *_), _, _, _ = family.weigh(
        [rows[5]["texts"]], [rows[5]["images"]], [None]
    )  # the broken image's tokens: no other row fits beside it
    config = PackingConfig(max_length=alone, packs_per_batch=2, max_patches=None, buffer_size=16)
    dataset = Dataset.from_list(rows, features=FEATURES)
    planned = PackedDataLoader(
        PackedDataset(VQADataset(dataset, family), config=config), num_workers
    )
    streamed = StreamingDataLoader(StreamingPackedDataset(rows, family, config=config), num_workers)
    for loader in (planned, streamed):
        samples, dropped = [], {}
        for batch in loader:
            assert batch["position_ids"].shape[:2] == (4, len(batch["input_ids"]))
            assert batch["mm_token_type_ids"].shape == batch["input_ids"].shape
            samples += batch["sample_index"].tolist()
            for reason, n in batch["dropped"].items():
                dropped[reason] = dropped.get(reason, 0) + n
        assert sorted(samples) == [0, 1, 2, 3, 4, 6, 7, 8]
        assert dropped == {UNDECODABLE_IMAGE: 1}


# 3. WebM and Matroska videos --------------------------------------------------------------------

# Held-out clips: (container, codec, frames, fps, width, height); no header counts the frames.
# The default suite weighs one, the slow group the others.
CLIPS = [
    ("webm", "libvpx-vp9", 9, 5, 40, 30),
    pytest.param(("matroska", "libx264", 7, 3, 48, 64), marks=pytest.mark.slow),
    pytest.param(("webm", "libvpx", 14, 12, 64, 48), marks=pytest.mark.slow),
    pytest.param(("matroska", "mpeg4", 5, 25, 32, 32), marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def video_family(request, processors):
    return family_for(processors(request.param))  # tiny_processor: the offline one, for Qwen-VL


def encoded_clip(container, codec, frames, fps, width, height) -> dict:
    clip = moving_shape("square", "blue", "top to bottom", frames, width, height)
    return {"bytes": encode_clip(clip, fps, container, codec), "path": None}


def decoded_whole(video: dict):
    """Every frame, decoded, and the metadata transformers' reader would give if the header
    counted them: the truth the packet count must equal."""
    import av
    from transformers.video_utils import VideoMetadata

    with av.open(io.BytesIO(video["bytes"])) as container:
        stream = container.streams.video[0]
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
        fps = float(stream.average_rate)
    height, width = frames.shape[1:3]
    metadata = VideoMetadata(len(frames), fps, width, height, len(frames) / fps, "pyav")
    return frames, metadata


@pytest.mark.parametrize("clip", CLIPS, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}f")
def test_webm_and_matroska_clips_weigh_what_the_processor_makes(video_family, clip):
    """A WebM or Matroska clip (no frame count in its header) used to be dropped as
    undecodable_video though it decodes; now its frames are counted from its packets, and its
    weight is the length of the sample, whose input_ids and video inputs are the processor's own,
    given every frame decoded."""
    family = video_family
    video = encoded_clip(*clip)
    frames, truth = decoded_whole(video)
    assert video_metadata(video).total_num_frames == truth.total_num_frames == clip[2]
    texts = [{"user": "Which way does it move?", "assistant": "Down.", "source": "t"}]
    video_row = {"images": [], "videos": [video], "texts": texts}
    (length,), _, (patches,), (reason,) = family.weigh([texts], [[]], [[video]])
    assert reason is None
    sample = family.make_sample(video_row, 0)
    assert (len(sample["input_ids"]), sample["patches"]) == (length, patches)
    messages = chat_messages(chat_turns(texts, ()), 0, 1)
    text = family.processor.apply_chat_template(messages, tokenize=False)
    out = family.processor(
        text=[text], videos=[frames], video_metadata=[truth], return_tensors="pt"
    )
    assert torch.equal(sample["input_ids"], out["input_ids"][0])
    assert torch.equal(sample["video_grid_thw"], out["video_grid_thw"])
    assert torch.equal(sample["pixel_values_videos"], out["pixel_values_videos"])


def test_a_video_stream_of_no_size_is_counted_not_a_division_by_zero(processors):
    """Found while making a video whose header reads and whose data does not (now a fuzz kind,
    video_of_no_size): an MP4 whose media data is zeroed from its first byte has 8 frames
    and no frame size in its header (0x0); the Qwen-VL processors' smart_resize divided by it
    (ZeroDivisionError out of weighing). Now it is undecodable_video."""
    family = family_for(processors("qwen2_5_vl"))
    video = mp4_with_broken_data(kept=0)
    texts = [{"user": "Hi?", "assistant": "Hello.", "source": "t"}]
    _, _, _, reasons = family.weigh([texts], [[]], [[video]])
    assert reasons == [UNDECODABLE_VIDEO]


# 4. datasets' default Image() ----------------------------------------------------------------

DECODING = Features(
    {
        "images": List(datasets.Image()),  # datasets' default: decode=True
        "texts": List(
            {"user": Value("string"), "assistant": Value("string"), "source": Value("string")}
        ),
    }
)


@pytest.mark.parametrize("name", ["tiny", pytest.param("qwen2_5_vl", marks=pytest.mark.slow)])
@pytest.mark.filterwarnings("ignore:a list has no shards")
def test_datasets_default_image_feature_is_read_undecoded_by_every_loader(
    name, tokenizer, processors
):
    """A dataset with datasets' default Image() decodes each image as its row is read: a truncated
    file raised `OSError: Truncated File Read` out of VQADataset, the planned loader and the
    streaming one over a map-style Dataset. Every loader now casts it to Image(decode=False) and
    the file is a counted drop, decoded in mmdp's one place."""
    processor = tokenizer if name == "tiny" else processors(name)
    rows = [row(GOOD)] * 3 + [row(truncated_jpeg())]
    dataset = Dataset.from_list(rows, features=DECODING)
    with pytest.raises(OSError, match="Truncated"):
        dataset[3]  # the trap: reading the row decodes it
    assert VQADataset(dataset, processor)[3]["drop_reason"] == UNDECODABLE_IMAGE
    config = PackingConfig(max_length=512, packs_per_batch=1, max_patches=None)
    loaders = [
        PackedDataLoader(
            PackedDataset(VQADataset(dataset, processor), config=config), num_workers=2
        ),
        StreamingDataLoader(
            StreamingPackedDataset(dataset, processor, config=config), num_workers=0
        ),
        StreamingDataLoader(
            StreamingPackedDataset(dataset.to_iterable_dataset(), processor, config=config),
            num_workers=0,
        ),
    ]
    for loader in loaders:
        report = PackReport.of_epoch(loader)
        assert report.samples == 3 and report.dropped == {UNDECODABLE_IMAGE: 1}
        assert report.rows_read == 4


def test_video_features_are_read_undecoded_too():
    features = Features({**DECODING, "videos": List(datasets.Video())})
    rows = Dataset.from_dict({"images": [[]], "texts": [[]], "videos": [[]]}, features=features)
    undecoded_rows = undecoded(rows)
    assert undecoded_rows.features["images"] == List(datasets.Image(decode=False))
    assert undecoded_rows.features["videos"] == List(datasets.Video(decode=False))
    already = undecoded_rows
    assert undecoded(already) is already  # nothing to cast: the same dataset, the same fingerprint


# 5. The model's config against the settings the batch was built with ----------------------------


def test_model_inputs_refuses_a_model_configured_otherwise_than_the_batch(processors):
    """Qwen2.5-VL spaces a video's temporal positions by vision_config.tokens_per_second: the
    batches are built for the released checkpoints' 2, and a model saying 4 (transformers'
    default config) trained on other positions without a word (1.2e-4 in a sample's loss,
    tests/test_video.py). model_inputs(batch, model) now refuses it in one sentence, and a family
    built for the model's setting is accepted; another image token id is refused the same way."""
    processor = processors("qwen2_5_vl")
    family = family_for(processor)
    batch = collate_packs([pack_of(family, [row(GOOD), row(None)])], family)
    model = tiny_model(processor)
    model_inputs(batch, model)  # built for this model: accepted
    model.config.vision_config.tokens_per_second = 4
    with pytest.raises(UserError, match=r"tokens_per_second = 4, but .* built for 2; .*=4\)"):
        model_inputs(batch, model)
    four = Qwen2_5_VL(processor, tokens_per_second=4)
    model_inputs(collate_packs([pack_of(four, [row(GOOD)])], four), model)
    model.config.image_token_id = family.feature_token_id + 1
    with pytest.raises(UserError, match="image_token_id"):
        model_inputs(batch, model)


# 6. One epoch report -------------------------------------------------------------------------


def test_one_epoch_report_adds_the_plans_and_the_batches_drops_per_reason_and_source(tokenizer):
    """A mixture of two sources over 2 ranks: rows over the budget (the plan drops them), a
    broken image (dropped while its batch is built), rows the mixture leaves out and packs left
    out to equalise the ranks. The merged report alone adds up, overall and per source:
    rows read == samples + dropped, and every source's rows read are its rows. (The mixture's
    table used to count the broken image as left_out_to_equalise_ranks.)"""
    a = [row(GOOD)] * 9 + [row(png_with_broken_data(60, 40)), row(None, "word " * 400)]
    b = [row(None, f"Reply {i}.") for i in range(14)]  # more than a: the mixture leaves some
    mixture = mixture_from_dict(
        {"sources": [{"name": "a", "dataset": "x", "share": 1}, {"name": "b", "dataset": "y", "share": 1}],
         "share_by": "rows"}
    )  # fmt: skip
    source_of_row = np.repeat(np.arange(2, dtype=np.int16), [len(a), len(b)])
    mixed = MixedRows(Dataset.from_list(a + b, features=FEATURES), source_of_row, mixture)
    samples = VQADataset(mixed.dataset, tokenizer, image_size=32, mixture=mixed)
    config = PackingConfig(max_length=256, packs_per_batch=2)
    reports = []
    for rank in (0, 1):
        packed = PackedDataset(
            samples, config=config, rank=rank, world_size=2, mixture=MixturePlan.of(mixed)
        )
        reports.append(PackReport.of_epoch(PackedDataLoader(packed, num_workers=0)))
    report = PackReport.merged(reports)
    by_source = report.by_source()
    assert report.rows_read == report.samples + sum(report.dropped.values()) == len(a) + len(b)
    assert {name: s["rows_read"] for name, s in by_source.items()} == {"a": len(a), "b": len(b)}
    assert by_source["a"]["dropped"][UNDECODABLE_IMAGE] == 1
    assert by_source["a"]["dropped"][TOO_LONG] == 1
    total = Counter()
    for s in by_source.values():
        assert s["rows_read"] == s["samples"] + sum(s["dropped"].values())
        total.update(s["dropped"])
    assert total == report.dropped and LEFT_OUT_BY_MIXTURE in total
    table = source_report(
        mixed, MixturePlan.of(mixed), packed.weights, [r.sample_index for r in reports],
        budgets=Budgets(256, config.max_images),
        report_by_source=by_source,
    )  # fmt: skip
    assert table[0]["dropped"] == by_source["a"]["dropped"]


# 2. Processor settings set as attributes -------------------------------------------------------

# (family, how the user sets it, sizes): each setting made the way users make it, on a loaded
# processor, after it was built. Before, mmdp weighed Qwen-VL images from `size` alone and the
# epoch died mid-way (`weighed [1564] patches, the processor made [936] (image_grid_thw)`), and
# SmolVLM, LLaVA-OneVision and Gemma 3 read theirs once, when the family was made.
ATTRIBUTES = {
    "qwen2_5_vl: min_pixels, max_pixels": (
        "qwen2_5_vl",
        {"min_pixels": 64 * 28 * 28, "max_pixels": 300 * 28 * 28},
    ),
    "qwen3_vl: max_pixels": ("qwen3_vl", {"max_pixels": 200 * 32 * 32}),
    "smolvlm: size, max_image_size": (
        "smolvlm",
        {"size": {"longest_edge": 96}, "max_image_size": {"longest_edge": 32}},
    ),
    "smolvlm: no splitting": ("smolvlm", {"do_image_splitting": False}),
    "llava_onevision: pinpoints": (
        "llava_onevision",
        {"image_grid_pinpoints": [[32, 64], [64, 32], [64, 64], [96, 32]]},
    ),
}
# The default suite weighs three sizes, the slow group these and three more.
SIZES = [(640, 480), (20, 30), (300, 2000)]
MORE_SIZES = [(1000, 200), (97, 13), (1, 1)]


def processed(processor, row: dict) -> dict:
    """What the processor itself makes of a row (its images nested as one sample's)."""
    messages = chat_messages(chat_turns(row["texts"], ()), len(row["images"]))
    text = processor.apply_chat_template(messages, tokenize=False)
    images = [Image.open(io.BytesIO(image["bytes"])).convert("RGB") for image in row["images"]]
    return processor(text=[text], images=[images], return_tensors="pt")


@pytest.mark.filterwarnings("ignore:Passing `min_pixels`:FutureWarning")
@pytest.mark.parametrize("sizes", [SIZES, pytest.param(MORE_SIZES, marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "setting",
    [
        pytest.param(s, marks=() if s.startswith("qwen2_5_vl") else pytest.mark.slow)
        for s in ATTRIBUTES
    ],
)
def test_settings_set_as_attributes_are_weighed_as_the_processor_applies_them(
    setting, sizes, processors, monkeypatch
):
    name, attributes = ATTRIBUTES[setting]
    processor = processors(name)
    before = family_for(processor)
    settings = before.read_settings()
    for attribute, value in attributes.items():
        monkeypatch.setattr(processor.image_processor, attribute, value, raising=False)
    family = family_for(processor)
    # the weights' cache key follows the setting, also for a family made before it was set
    assert family.fingerprint()["settings"] == before.read_settings() != settings
    rows = [
        {"images": [image_cell(w, h)], "texts": [{"user": "Q?", "assistant": "A.", "source": "t"}]}
        for w, h in sizes
    ]
    lengths, _, patches, reasons = family.weigh(
        [r["texts"] for r in rows], [r["images"] for r in rows]
    )
    for row, length, patch_count, reason in zip(rows, lengths, patches, reasons):
        sample = family.make_sample(row, 0)
        if reason is not None:  # refused from the header (an aspect ratio over 200), and built
            assert sample["drop_reason"] == reason
            continue
        assert (len(sample["input_ids"]), sample["patches"]) == (length, patch_count)
        assert torch.equal(sample["input_ids"], processed(processor, row)["input_ids"][0])


def test_a_setting_the_processor_would_never_apply_is_refused_in_one_sentence(
    processors, monkeypatch
):
    """Gemma3Processor sends its own pan-and-scan at every call: set on its image processor, it
    would be silently ignored, so the family refuses it (and is given it instead); a Qwen-VL
    image processor that does not resize cannot cut most images into its patches."""
    processor = processors("gemma3")
    monkeypatch.setattr(processor.image_processor, "do_pan_and_scan", True)
    with pytest.raises(UserError, match=r"Gemma3\(processor, do_pan_and_scan=True\)"):
        family_for(processor)
    processor = processors("qwen2_5_vl")
    monkeypatch.setattr(processor.image_processor, "do_resize", False)
    with pytest.raises(UserError, match="do_resize=False"):
        family_for(processor)


@pytest.mark.filterwarnings("ignore:Passing `min_pixels`:FutureWarning")
@pytest.mark.parametrize("name", ["qwen2_5_vl", pytest.param("qwen3_vl", marks=pytest.mark.slow)])
def test_video_settings_set_as_attributes_are_weighed_as_the_processor_applies_them(
    name, processors, monkeypatch
):
    """The video processor's frame sampling (fps, min and max frames) and pixels, set as
    attributes: the weight is the sample's length, its input_ids and grids the processor's own."""
    processor = processors(name)
    settings = {"fps": 3, "min_frames": 2, "max_frames": 6}
    if name == "qwen2_5_vl":  # Qwen2VLVideoProcessor takes min/max pixels (Qwen3-VL's does not)
        settings.update(min_pixels=8 * 28 * 28, max_pixels=16 * 28 * 28)
    for attribute, value in settings.items():
        monkeypatch.setattr(processor.video_processor, attribute, value, raising=False)
    family = family_for(processor)
    texts = [{"user": "Which way?", "assistant": "Down.", "source": "t"}]
    for clip in ((9, 5, 40, 30), (20, 10, 64, 48)):
        frames, fps, width, height = clip
        drawn = moving_shape("circle", "red", "left to right", frames, width, height)
        video = {"bytes": encode_mp4(drawn, fps)}
        (length,), _, (patches,), (reason,) = family.weigh([texts], [[]], [[video]])
        sample = family.make_sample({"images": [], "videos": [video], "texts": texts}, 0)
        assert reason is None and (len(sample["input_ids"]), sample["patches"]) == (length, patches)
        frames, truth = decoded_whole(video)
        messages = chat_messages(chat_turns(texts, ()), 0, 1)
        text = processor.apply_chat_template(messages, tokenize=False)
        out = processor(text=[text], videos=[frames], video_metadata=[truth], return_tensors="pt")
        assert torch.equal(sample["input_ids"], out["input_ids"][0])
        assert torch.equal(sample["video_grid_thw"], out["video_grid_thw"])


def test_a_setting_changed_after_the_rows_were_weighed_is_one_sentence(processors, monkeypatch):
    """Set after the PackedDataset weighed its rows, a setting would make samples of other
    lengths than the plan packed (the epoch died mid-way, `weighed [...] patches, the processor
    made [...]`): the first pack built says so instead, naming the setting."""
    processor = processors("qwen2_5_vl")
    rows = Dataset.from_list([row(image_cell(640, 480))] * 2, features=FEATURES)
    config = PackingConfig(max_length=2048, packs_per_batch=1, max_patches=None)
    packed = PackedDataset(VQADataset(rows, processor), config=config)
    monkeypatch.setattr(processor.image_processor, "max_pixels", 100 * 28 * 28, raising=False)
    with pytest.raises(UserError, match="settings changed after its rows were weighed"):
        next(iter(PackedDataLoader(packed, num_workers=0)))
