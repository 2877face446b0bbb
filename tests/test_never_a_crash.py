"""Bad input never ends an epoch (issue 44): the four paths that did, each as a plain test, with
what the user now sees. The property-based suite over the whole input space is tests/test_fuzz.py;
every bug it found has its plain test here too. docs/faults.md lists every bad input kind.
"""

import io

import numpy as np
import pytest
import torch
from datasets import Dataset
from PIL import Image

from mmdp.data.bad_rows import mp4_with_broken_data, png_with_broken_data
from mmdp.data.conversation import chat_messages, chat_turns
from mmdp.data.families import OFFLINE, family_for, offline_processor, tiny_processor
from mmdp.data.families.smolvlm import Idefics3
from mmdp.data.families.smolvlm import tiny_processor as smolvlm_tiny_processor
from mmdp.data.sources import FEATURES
from mmdp.data.synthetic import encode_png
from mmdp.data.synthetic_videos import encode_clip, moving_shape
from mmdp.data.videos import video_metadata
from mmdp.data.vqa_dataset import VQADataset
from mmdp.drop_reasons import UNDECODABLE_IMAGE, UNDECODABLE_VIDEO
from mmdp.packing.batch import build_pack, collate_packs
from mmdp.packing.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.streaming import StreamingDataLoader, StreamingPackedDataset

FAMILIES = ("tiny", *OFFLINE, "idefics3")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tokenizer):
    if request.param == "tiny":
        return family_for(tokenizer)
    if request.param == "idefics3":
        return family_for(smolvlm_tiny_processor(Idefics3))
    return family_for(tiny_processor(request.param))


def row(image: dict | None, reply: str = "A red box.") -> dict:
    images = [] if image is None else [image]
    return {
        "images": images,
        "texts": [{"user": "What is this?", "assistant": reply, "source": "t"}],
    }


GOOD = {"bytes": encode_png(Image.new("RGB", (64, 48), (200, 30, 30))), "path": None}


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
    assert batch["samples_per_row"].tolist() == [2, 0]


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl"])
def test_a_broken_video_alone_in_its_pack_is_padding_too(name):
    """The same with a video whose header reads and whose frames do not (Qwen-VL)."""
    family = family_for(tiny_processor(name))
    good = pack_of(family, [row(GOOD), row(None)])
    broken = {**row(None), "videos": [mp4_with_broken_data()]}
    empty = pack_of(family, [broken], first_row=2)
    assert empty["dropped"] == {UNDECODABLE_VIDEO: 1}
    batch = collate_packs([empty, good], family)
    assert batch["position_ids"].shape == (4, 2, 600)
    assert batch["mm_token_type_ids"].shape == (2, 600)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.filterwarnings("ignore:a list has no shards")
def test_a_large_broken_image_alone_in_its_pack_is_counted_by_both_loaders(num_workers):
    """The held-out probe: Qwen2.5-VL, a large image with a sound header and broken data, alone in
    its pack (its weight is the whole budget), 0 and 2 workers, planned and streaming: every row
    is a sample or counted as undecodable_image."""
    family = family_for(tiny_processor("qwen2_5_vl"))
    rows = [row(GOOD)] * 5 + [row(png_with_broken_data(900, 700))] + [row(None)] * 3
    (alone, *_), _, _, _ = family.weigh(
        [rows[5]["texts"]], [rows[5]["images"]], [None]
    )  # the broken image's tokens: no other row fits beside it
    config = PackingConfig(max_length=alone, packs_per_batch=2, max_patches=None, buffer_size=16)
    dataset = Dataset.from_list(rows, features=FEATURES)
    planned = PackedDataLoader(PackedDataset(VQADataset(dataset, family), config), num_workers)
    streamed = StreamingDataLoader(StreamingPackedDataset(rows, family, config), num_workers)
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
# The default suite weighs two, the slow group the others.
CLIPS = [
    ("webm", "libvpx-vp9", 9, 5, 40, 30),
    ("matroska", "libx264", 7, 3, 48, 64),
    pytest.param(("webm", "libvpx", 14, 12, 64, 48), marks=pytest.mark.slow),
    pytest.param(("matroska", "mpeg4", 5, 25, 32, 32), marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def video_family(request):
    return family_for(offline_processor(request.param))


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


def test_a_video_stream_of_no_size_is_counted_not_a_division_by_zero():
    """Found by the fuzz: an MP4 whose media data is zeroed from its first byte has 8 frames
    and no frame size in its header (0x0); the Qwen-VL processors' smart_resize divided by it
    (ZeroDivisionError out of weighing). Now it is undecodable_video."""
    family = family_for(tiny_processor("qwen2_5_vl"))
    video = mp4_with_broken_data(kept=0)
    texts = [{"user": "Hi?", "assistant": "Hello.", "source": "t"}]
    _, _, _, reasons = family.weigh([texts], [[]], [[video]])
    assert reasons == [UNDECODABLE_VIDEO]
