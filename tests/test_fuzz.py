"""The property-based suite (issue 44): datasets drawn over the input space, and the invariants
every loader must keep on any of them.

The input space: every model family (their tiny processors); good rows with 0-3 images of any
size, format (PNG, JPEG, WebP, GIF), mode (RGB, L, P, RGBA, LA, CMYK, 16-bit) and EXIF
orientation; every bad kind mmdp knows (`KINDS`: bad_rows.BAD_ROWS, and the kinds
below: a header that reads over data that does not, a file that is not there, videos a family
takes or refuses, broken ones, WebM); the family's own image token in the text; rows over every
budget; budgets that force a large row alone in its pack; both loaders (planned, streaming),
1 and 2 ranks, 0 and 2 DataLoader workers (3 in the deep profile); datasets' Image() decoded or
not; a list, a Dataset or a datasets stream.

The invariants:
    no exception escapes;
    every row is trained exactly once or counted with its reason (from the epoch report alone);
    every batch has the family's keys, with consistent shapes;
    each planned weight is the length of the sample built (a pack's real tokens);
    the images converted to RGB are counted by their mode;
    the same batches for any number of workers;
    the weight of a row is what the family's own processor makes of it, its settings set as
    attributes included.

Two profiles: `fast` (the default suite, a few seconds: few examples, derandomized so that every
run tries the same ones) and `deep` (`uv run pytest -m slow -k "fuzz or property"`: many
examples, new ones every run). Every bug this suite found is also a plain test in
tests/test_never_a_crash.py. Adding a bad input kind is one line: an entry of BAD_ROWS (its
outcome the same for every family) or of EXTRA_KINDS here.
"""

import functools
import hashlib
import io
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import datasets
import numpy as np
import pytest
import torch
from bad_rows import (
    BAD_ROWS,
    encoded,
    mp4_with_broken_data,
    png_with_broken_data,
    with_images,
    with_reply,
)
from datasets import Dataset, Features, List
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from mmdp import drop_reasons
from mmdp.data.conversation import IMAGE_TAG, chat_messages, chat_turns
from mmdp.data.families import family_for, tiny_processor
from mmdp.data.families.smolvlm import Idefics3
from mmdp.data.families.smolvlm import tiny_processor as smolvlm_tiny_processor
from mmdp.data.reading.sources import VIDEO_FEATURES
from mmdp.data.synthetic.videos import encode_clip, encode_mp4, moving_shape
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.loading.streaming import StreamingDataLoader, StreamingPackedDataset
from mmdp.packing.packers import STRATEGIES
from mmdp.packing.packing_config import PackingConfig
from mmdp.report.pack_report import PackReport

FAST, DEEP = "mmdp-fast", "mmdp-deep"
COMMON = {
    "deadline": None,  # a loader's first batch may take a second on a busy machine
    "database": None,  # nothing written into the repository
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile(FAST, max_examples=4, derandomize=True, **COMMON)
settings.register_profile(DEEP, max_examples=60, **COMMON)
PROFILES = [FAST, pytest.param(DEEP, marks=pytest.mark.slow)]

FAMILIES = (
    *("tiny", "qwen2_5_vl", "qwen3_vl", "smolvlm", "idefics3", "llava_onevision", "gemma3"),
    *("gemma4", "internvl"),
)
TEXT = {"user": "What is in the picture?", "assistant": "A shape.", "source": "fuzz"}


@functools.cache
def family_named(name: str):
    """The family's tiny processor's family, built once per process."""
    if name == "tiny":
        return family_for(get_tokenizer(), image_size=32)
    if name == "idefics3":
        return family_for(smolvlm_tiny_processor(Idefics3))
    return family_for(tiny_processor(name))


# The kinds of rows ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A kind of row: `make(row, family)` breaks a good row; `outcome(family)` is the drop reason
    a loader must count it under, BUDGET (judged by the budgets, from its weight) or None
    (trained: converted images are counted by their mode)."""

    make: Callable
    outcome: Callable


BUDGET = "over a budget, or not"
CONVERTED_MODES = {"CMYK", "I;16", "P"}  # BAD_ROWS' outcomes that are a mode converted from
OVER_A_BUDGET = {drop_reasons.TOO_LONG, drop_reasons.TOO_MANY_IMAGES}


def from_bad_rows(name: str) -> Kind:
    break_row, outcome = BAD_ROWS[name]
    if outcome in CONVERTED_MODES:
        outcome = None
    elif outcome in OVER_A_BUDGET:
        outcome = BUDGET
    return Kind(lambda row, family: break_row(row), lambda family, outcome=outcome: outcome)


@functools.cache
def webm_clip() -> dict:
    clip = moving_shape("circle", "red", "left to right", 6, 32, 32)
    return {"bytes": encode_clip(clip, 4, "webm", "libvpx"), "path": None}


@functools.cache
def mp4_clip() -> dict:
    clip = moving_shape("square", "blue", "top to bottom", 5, 48, 32)
    return {"bytes": encode_mp4(clip, 3), "path": None}


def with_videos(*videos):
    return lambda row, family: {**row, "videos": list(videos)}


def takes_video(then, otherwise=drop_reasons.VIDEO_REFUSED):
    """The outcome of a row with a video: `then` for a family that takes video, else refused
    (a video whose header does not read is undecodable for every real family: it is opened
    before the family says it takes none; TinyVLM refuses any video unopened)."""
    return lambda family: then if family.video_token else otherwise


EXTRA_KINDS = {
    "header_reads_data_broken": Kind(
        lambda row, family: {**row, "images": [png_with_broken_data(120, 90)]},
        lambda family: drop_reasons.UNDECODABLE_IMAGE,
    ),
    "missing_file": Kind(
        lambda row, family: with_images({"bytes": None, "path": "/no/such/image.png"})(row),
        lambda family: drop_reasons.UNDECODABLE_IMAGE,
    ),
    "image_token_of_the_family_in_text": Kind(
        lambda row, family: with_reply(f"Look: {family.feature_token}", "A square.")(row),
        # SmolVLM's token is "<image>", the tag that places an image: one tag and no image
        lambda family: (
            drop_reasons.MEDIA_TAG_MISMATCH
            if family.feature_token == IMAGE_TAG
            else drop_reasons.IMAGE_TOKEN_IN_TEXT
        ),
    ),
    "mp4_video": Kind(with_videos(mp4_clip()), takes_video(None)),
    "webm_video": Kind(with_videos(webm_clip()), takes_video(None)),
    "video_header_reads_data_broken": Kind(
        with_videos(mp4_with_broken_data()), takes_video(drop_reasons.UNDECODABLE_VIDEO)
    ),
    "video_of_no_size": Kind(
        with_videos(mp4_with_broken_data(kept=0)),
        lambda family: (
            drop_reasons.UNDECODABLE_VIDEO if family.name != "tiny" else drop_reasons.VIDEO_REFUSED
        ),
    ),
}
# BAD_ROWS' text with TinyVLM's image token is an ordinary text for the other families: the kind
# above writes each family's own
KINDS = {
    **{name: from_bad_rows(name) for name in BAD_ROWS if name != "image_token_in_text"},
    **EXTRA_KINDS,
}


# Good rows: images of any size, format, mode and orientation -------------------------------------

FORMATS = {  # the modes each format writes
    "PNG": ("RGB", "L", "P", "RGBA", "LA", "I;16"),
    "JPEG": ("RGB", "L", "CMYK"),
    "WEBP": ("RGB", "RGBA"),
    "GIF": ("P",),
}


@functools.cache
def image_bytes(width: int, height: int, fmt: str, mode: str, orientation: int) -> bytes:
    noise = np.random.default_rng(width * 7919 + height).integers(0, 256, (height, width, 3))
    image = Image.fromarray(noise.astype(np.uint8)).convert("RGB")
    image = image.convert(mode) if mode != "I;16" else Image.new("I;16", (width, height), 40000)
    save = {}
    if orientation and fmt == "JPEG":
        exif = Image.Exif()
        exif[0x0112] = orientation
        save["exif"] = exif.tobytes()
    return encoded(image, fmt, **save)["bytes"]


images = st.builds(
    lambda size, fmt_mode, orientation: {
        "bytes": image_bytes(*size, *fmt_mode, orientation),
        "path": None,
    },
    st.tuples(st.integers(1, 160), st.integers(1, 160)),
    st.sampled_from([(fmt, mode) for fmt, modes in FORMATS.items() for mode in modes]),
    st.sampled_from([0, 0, 3, 6, 8]),
)
words = st.text(alphabet="abcdefgh ijk.?é中", min_size=1, max_size=12)
turns = st.builds(
    lambda user, reply, repeat: {"user": user, "assistant": reply * repeat, "source": "fuzz"},
    words,
    words.filter(str.strip),
    st.integers(1, 30),
)
good_rows = st.builds(
    lambda row_images, texts: {"images": row_images, "videos": [], "texts": texts},
    st.lists(images, max_size=3),
    st.lists(turns, min_size=1, max_size=3),
)


@st.composite
def datasets_of_rows(draw, families=FAMILIES):
    """(family name, rows, the kind of each row): good rows and bad ones, in any order."""
    name = draw(st.sampled_from(families))
    family = family_named(name)
    kinds_or_good = st.one_of(good_rows, st.sampled_from(sorted(KINDS)))
    spec = draw(st.lists(kinds_or_good, min_size=2, max_size=10))
    rows, kinds = [], []
    for item in spec:
        if isinstance(item, str):
            base = {"images": [], "videos": [], "texts": [TEXT]}
            row = KINDS[item].make(base, family)
            rows.append({"videos": [], **row})
            kinds.append(item)
        else:
            rows.append(item)
            kinds.append("good")
    return name, rows, kinds


@st.composite
def budgets(draw, lengths: np.ndarray):
    """A PackingConfig whose token budget ranges from the largest usable row (alone in its pack)
    to all of them, sometimes smaller (rows over it), with or without image and patch budgets."""
    usable = lengths[lengths > 0]
    largest = int(usable.max()) if len(usable) else 64
    max_length = draw(
        st.one_of(
            st.just(largest),
            st.integers(largest, max(largest, int(usable.sum()) if len(usable) else 64)),
            st.integers(min(16, largest), largest),
        )
    )
    return PackingConfig(
        max_length=max_length,
        max_images=draw(st.sampled_from([1, 2, 4, 18])),
        max_patches=draw(st.sampled_from([None, None, 64, 1024])),
        packs_per_batch=draw(st.integers(1, 3)),
        strategy=draw(st.sampled_from(STRATEGIES)),
        buffer_size=draw(st.integers(2, 8)),
        seed=draw(st.integers(0, 3)),
    )


# Running an epoch ------------------------------------------------------------------------------

FEATURES_DECODING = Features({**VIDEO_FEATURES, "images": List(datasets.Image())})


def as_dataset(rows: list[dict], decode: bool) -> Dataset:
    """The rows as a datasets.Dataset, its images with datasets' default Image() (decode=True)
    or kept encoded, as mmdp's loaders read them."""
    features = FEATURES_DECODING if decode else VIDEO_FEATURES
    return Dataset.from_list(rows, features=features)


def epoch(family, rows, config, *, loader: str, world_size: int, workers: int, source: str):
    """Every rank's batches of one epoch, and the epoch report merged over the ranks."""
    batches, reports = [], []
    for rank in range(world_size):
        if loader == "planned":
            samples = VQADataset(as_dataset(rows, source == "decoding"), family)
            dataset = PackedDataset(samples, config=config, rank=rank, world_size=world_size)
            it = PackedDataLoader(dataset, num_workers=workers)
        else:
            stream = {
                "list": rows,
                "decoding": as_dataset(rows, decode=True),
                "stream": as_dataset(rows, decode=False).to_iterable_dataset(num_shards=2),
            }[source]
            dataset = StreamingPackedDataset(
                stream, family, config=config, rank=rank, world_size=world_size
            )
            it = StreamingDataLoader(dataset, num_workers=workers, stop_together=False)
        report = PackReport()
        for batch in it:
            batches.append(batch)
            report.add_batch(batch)
        report.add_loader(it)
        reports.append(report)
    return batches, PackReport.merged(reports)


def expected_outcomes(family, kinds, weights, config) -> list[tuple[bool, str | None]]:
    """Each row's (planned, drop reason), in the order the loaders find them: a reason found
    while weighing (text, header: it must be the kind's), then the budgets (from the weight): the
    row is not planned; else the kind's reason found while its pack is built (data that does not
    decode), or None: trained. (A planned row may also be left out to equalise ranks.)"""
    outcomes = []
    for kind, length, count, patch_count, weighed in zip(kinds, *weights):
        outcome = None if kind == "good" else KINDS[kind].outcome(family)
        if weighed is not None:
            assert weighed == outcome, (kind, weighed, outcome)
            outcomes.append((False, outcome))
        elif length > config.max_length:
            outcomes.append((False, drop_reasons.TOO_LONG))
        elif count > config.max_images:
            outcomes.append((False, drop_reasons.TOO_MANY_IMAGES))
        elif config.max_patches is not None and patch_count > config.max_patches:
            outcomes.append((False, drop_reasons.TOO_MANY_PATCHES))
        else:
            outcomes.append((True, None if outcome == BUDGET else outcome))
    return outcomes


def converted_modes(row: dict) -> Counter:
    """The modes other than RGB a row's images open in (PIL's own reading of the file)."""
    modes = Counter()
    for image in row["images"] or []:
        mode = Image.open(io.BytesIO(image["bytes"])).mode
        modes[mode] += mode != "RGB"
    return +modes


def check_batch(batch: dict, family, config) -> None:
    """The family's keys, with consistent shapes."""
    rows, length = len(batch["samples_per_pack"]), config.max_length
    assert batch["input_ids"].shape == batch["labels"].shape == (rows, length)
    assert batch["real_token_mask"].shape == (rows, length)
    assert batch["position_ids"].shape == (*family.position_rows, rows, length)
    for key in family.token_keys:
        assert batch[key].shape == (rows, length), key
    assert int(batch["cu_seq_lens_q"][-1]) == rows * length
    assert int(batch["samples_per_pack"].sum()) == len(batch["sample_index"])
    assert (batch["labels"][~batch["real_token_mask"]] == -100).all()
    if len(batch["sample_of_image"]):
        assert set(family.vision_keys) <= set(batch), family.vision_keys


# The properties --------------------------------------------------------------------------------


@st.composite
def epochs(draw, workers=(0,)):
    name, rows, kinds = draw(datasets_of_rows())
    family = family_named(name)
    weights = family.weigh(
        [r["texts"] for r in rows], [r["images"] for r in rows], [r["videos"] for r in rows]
    )
    config = draw(budgets(np.asarray(weights[0])))
    loader = draw(st.sampled_from(["planned", "streaming"]))
    source = draw(
        st.sampled_from(
            ["list", "decoding", "stream"] if loader == "streaming" else ["encoded", "decoding"]
        )
    )
    ranks, workers = draw(st.sampled_from([1, 2])), draw(st.sampled_from(workers))
    return name, rows, kinds, weights, config, loader, ranks, workers, source


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.filterwarnings("ignore:a list has no shards", "ignore:.*shards")
def test_property_every_row_is_trained_once_or_counted(profile):
    """No exception escapes; the epoch report alone accounts for every row; every batch has
    the family's keys and shapes; every pack's real tokens are its samples' planned weights;
    images converted to RGB are counted by mode."""

    @settings(settings.get_profile(profile))
    @given(epochs(workers=(0,) if profile == FAST else (0, 0, 2)))
    def check(drawn):
        name, rows, kinds, weights, config, loader, world_size, workers, source = drawn
        family = family_named(name)
        batches, report = epoch(
            family, rows, config, loader=loader, world_size=world_size, workers=workers,
            source=source,
        )  # fmt: skip
        lengths = np.asarray(weights[0])
        outcomes = expected_outcomes(family, kinds, weights, config)
        trained = Counter(int(r) for b in batches for r in b["sample_index"])
        assert report.rows_read == len(rows)
        assert all(n == 1 for n in trained.values()), trained
        # left out while planning: exactly the reasons expected
        unplanned = Counter(reason for planned, reason in outcomes if not planned)
        dropped = Counter(report.dropped)
        equalised = dropped.pop(drop_reasons.LEFT_OUT_TO_EQUALISE_RANKS, 0)
        planned = [reason for is_planned, reason in outcomes if is_planned]
        built = dropped - unplanned  # dropped while their packs were built
        assert dropped - built == unplanned, (kinds, outcomes, report.dropped)
        assert built <= Counter(reason for reason in planned if reason), (kinds, outcomes, built)
        assert report.samples + sum(built.values()) + equalised == len(planned)
        assert report.samples <= planned.count(None)
        # row by row, where a row's id is its position (not in a datasets stream split between
        # readers: ranks x workers)
        if loader == "streaming" and source == "stream" and world_size * max(workers, 1) > 1:
            return
        assert all(outcomes[i] == (True, None) for i in trained), (kinds, outcomes, trained)
        for batch in batches:
            check_batch(batch, family, config)
            for row, reason in batch["dropped_rows"]:
                assert outcomes[row] == (True, reason)
            real = batch["real_token_mask"].sum(1).tolist()
            samples = np.split(batch["sample_index"].numpy(), np.cumsum(batch["samples_per_pack"]))
            assert real == [int(lengths[rows_of_pack].sum()) for rows_of_pack in samples[:-1]]
        converted = sum((converted_modes(rows[i]) for i in trained), Counter())
        assert report.converted == converted

    check()


def digest(batch: dict) -> str:
    """Every tensor of a batch with its key, dtype and shape, and what it dropped."""
    h = hashlib.sha256(repr(sorted(batch["dropped"].items())).encode())
    for key in sorted(batch):
        if isinstance(batch[key], torch.Tensor):
            h.update(f"{key} {batch[key].dtype} {tuple(batch[key].shape)}".encode())
            h.update(batch[key].contiguous().numpy().tobytes())
    return h.hexdigest()


@st.composite
def planned_epochs(draw):
    name, rows, kinds = draw(datasets_of_rows())
    family = family_named(name)
    weights = family.weigh(
        [r["texts"] for r in rows], [r["images"] for r in rows], [r["videos"] for r in rows]
    )
    return name, rows, draw(budgets(np.asarray(weights[0]))), draw(st.sampled_from([1, 2]))


@pytest.mark.parametrize(
    ("profile", "workers"), [(FAST, (0, 2)), pytest.param(DEEP, (0, 1, 3), marks=pytest.mark.slow)]
)
def test_property_the_same_batches_for_any_worker_count(profile, workers):
    """The planned loader's batches, tensor for tensor, and what they dropped, do not depend on
    how many DataLoader workers build them (each rank's, in order)."""

    @settings(settings.get_profile(profile), max_examples=2 if profile == FAST else 15)
    @given(planned_epochs())
    def check(drawn):
        name, rows, config, world_size = drawn
        family = family_named(name)
        runs = [
            [
                digest(batch)
                for batch in epoch(
                    family,
                    rows,
                    config,
                    loader="planned",
                    world_size=world_size,
                    workers=n,
                    source="encoded",
                )[0]
            ]  # fmt: skip
            for n in workers
        ]
        assert all(run == runs[0] for run in runs[1:])

    check()


# Weights against the processor itself ----------------------------------------------------------

# Settings users make on a loaded processor, as attributes, per family: what property 3 draws from.
ATTRIBUTE_SETTINGS = {
    "qwen2_5_vl": st.fixed_dictionaries(
        {},
        optional={
            "min_pixels": st.integers(4, 64).map(lambda n: n * 28 * 28),
            "max_pixels": st.integers(64, 400).map(lambda n: n * 28 * 28),
        },
    ),
    "qwen3_vl": st.fixed_dictionaries(
        {}, optional={"max_pixels": st.integers(32, 300).map(lambda n: n * 32 * 32)}
    ),
    "smolvlm": st.fixed_dictionaries(
        {},
        optional={
            "size": st.sampled_from([32, 64, 96, 160]).map(lambda n: {"longest_edge": n}),
            "do_image_splitting": st.booleans(),
        },
    ),
    "llava_onevision": st.fixed_dictionaries(
        {},
        optional={
            "image_grid_pinpoints": st.lists(
                st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=6, unique=True
            ).map(lambda grid: [[32 * a, 32 * b] for a, b in grid])
        },
    ),
    "gemma3": st.just({}),
}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.filterwarnings("ignore:Passing `min_pixels`:FutureWarning")
def test_property_a_rows_weight_is_what_the_processor_makes_of_it(profile):
    """For any images (sizes, formats, modes, EXIF orientations) and any settings made as
    attributes on the loaded processor, a row's planned weight is the length of its sample,
    whose input_ids are the processor's own."""

    @settings(settings.get_profile(profile))
    @given(st.data())
    def check(data):
        name = data.draw(st.sampled_from(sorted(ATTRIBUTE_SETTINGS)))
        family = family_named(name)
        image_processor = family.processor.image_processor
        attributes = data.draw(ATTRIBUTE_SETTINGS[name])
        row = {
            "images": data.draw(st.lists(images, min_size=1, max_size=3)),
            "texts": [data.draw(turns)],
        }
        before = {
            key: image_processor.__dict__[key]
            for key in attributes
            if key in image_processor.__dict__
        }
        try:
            for key, value in attributes.items():
                setattr(image_processor, key, value)
            (length,), _, (patches,), (reason,) = family.weigh([row["texts"]], [row["images"]])
            sample = family.make_sample(row, 0)
            if reason is not None:  # refused from the headers: and so when built
                assert sample["drop_reason"] == reason
                return
            assert (len(sample["input_ids"]), sample["patches"]) == (length, patches)
            assert torch.equal(
                sample["input_ids"], processed(family.processor, row)["input_ids"][0]
            )
        finally:
            for key in attributes:
                if key in before:
                    setattr(image_processor, key, before[key])
                else:
                    delattr(image_processor, key)

    check()


def processed(processor, row: dict) -> dict:
    """What the processor itself makes of a row: its images opened by PIL, upright (EXIF) and
    RGB, nested as one sample's (its counts depend on their sizes alone)."""
    messages = chat_messages(chat_turns(row["texts"], ()), len(row["images"]))
    text = processor.apply_chat_template(messages, tokenize=False)
    opened = [Image.open(io.BytesIO(image["bytes"])) for image in row["images"]]
    upright = [ImageOps.exif_transpose(image).convert("RGB") for image in opened]
    return processor(text=[text], images=[upright], return_tensors="pt")
