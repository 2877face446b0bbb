"""Users' own data (mmdp.data.reading.formats, mmdp.data.reading.sources): rows as ms-swift /
LLaMA-Factory (messages, sharegpt), LLaVA and the_cauldron (as `load_dataset` gives it) keep them,
written by hand here, read into one schema; each image placed where its tag stands, through the
family's own chat template, equal to what the real processor makes of the same messages; and stages
1 and 5 run on them, every row used or counted with its reason.
"""

import io
import json

import pytest
import torch
from doc_blocks import check_output
from PIL import Image

from mmdp import config
from mmdp.data.conversation import system_prompt
from mmdp.data.families import family_for, offline_processor
from mmdp.data.images import load_image
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.drop_reasons import (
    EMPTY_REPLY,
    MEDIA_TAG_MISMATCH,
    UNDECODABLE_IMAGE,
)
from mmdp.errors import UserError


def save(image: Image.Image, path, fmt: str = "PNG") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format=fmt)


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    """A user's folder: images (one in a subfolder, one truncated, one missing) and the files
    that name them, one per format. Returns the folder."""
    root = tmp_path_factory.mktemp("users_data")
    save(Image.new("RGB", (64, 48), (200, 30, 30)), root / "red.png")
    save(Image.new("RGB", (40, 60), (30, 200, 30)), root / "photos" / "green.jpg", "JPEG")
    save(Image.new("RGB", (56, 56), (30, 30, 200)), root / "elsewhere" / "blue.png")
    whole = io.BytesIO()
    Image.new("RGB", (64, 48), (90, 90, 90)).save(whole, format="JPEG")
    (root / "truncated.jpg").write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    absolute_blue = str(root / "elsewhere" / "blue.png")

    def user(text):
        return {"role": "user", "content": text}

    def reply(text):
        return {"role": "assistant", "content": text}

    messages = [
        # interleaved tags over two turns, a system prompt, relative and absolute paths
        {
            "messages": [
                {"role": "system", "content": "You compare colours."},
                user("Is <image> redder than <image>?"),
                reply("Yes, the first is red."),
                user("And <image>?"),
                reply("That one is blue."),
            ],
            "images": ["red.png", "photos/green.jpg", absolute_blue],
        },
        {"messages": [user("Spell cat."), reply("C-A-T.")]},  # text only
        {"messages": [user("<image> or <image>?"), reply("Red.")], "images": ["red.png"]},
        {"messages": [user("<image> What is it?"), reply("Gone.")], "images": ["missing.png"]},
        {"messages": [user("<image> What is it?"), reply("Grey.")], "images": ["truncated.jpg"]},
        {
            "messages": [user("Describe it."), reply("A red box.")],
            "images": ["file://" + str(root / "red.png")],
        },
        {"messages": [user("Nobody answers this.")]},  # a question without its reply
        {  # LLaMA-Factory's sharegpt spelling, its system prompt as a column
            "conversations": [
                {"from": "human", "value": "<image>Colour?"},
                {"from": "gpt", "value": "Green."},
            ],
            "system": "Answer in one word.",
            "images": ["photos/green.jpg"],
        },
    ]
    (root / "train.jsonl").write_text("\n".join(json.dumps(row) for row in messages) + "\n")
    llava = [
        {
            "id": "000000033471",
            "image": "coco/red.png",
            "conversations": [
                {"from": "human", "value": "<image>\nWhat colour is it?"},
                {"from": "gpt", "value": "Red."},
            ],
        },
        {
            "id": 7,
            "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}],
        },
        {
            "id": 8,
            "image": ["coco/red.png", "coco/red.png"],
            "conversations": [
                {"from": "human", "value": "<image> and <image>: the same?"},
                {"from": "gpt", "value": "Yes."},
            ],
        },
    ]
    (root / "llava.json").write_text(json.dumps(llava))
    save(Image.new("RGB", (64, 48), (200, 30, 30)), root / "image_folder" / "coco" / "red.png")
    return root


def test_format_messages_rows_keep_their_tags_system_prompt_and_turns(held_out):
    rows = load_vqa_dataset(str(held_out / "train.jsonl"))
    assert len(rows) == 8 and rows.features["images"].feature.decode is False
    first = rows[0]
    assert [image["path"] for image in first["images"]] == [
        str(held_out / "red.png"),
        str(held_out / "photos" / "green.jpg"),
        str(held_out / "elsewhere" / "blue.png"),
    ]
    assert [(t["user"], t["assistant"]) for t in first["texts"]] == [
        ("Is <image> redder than <image>?", "Yes, the first is red."),
        ("And <image>?", "That one is blue."),
    ]
    assert system_prompt(first["texts"]) == "You compare colours."
    assert rows[5]["images"][0]["path"] == str(held_out / "red.png")  # file:// taken off
    assert [(t["user"], t["assistant"]) for t in rows[6]["texts"]] == [
        ("Nobody answers this.", None)
    ]
    sharegpt = rows[7]
    assert system_prompt(sharegpt["texts"]) == "Answer in one word."
    assert sharegpt["texts"][0]["user"] == "<image>Colour?"


def test_format_llava_rows_read_under_an_image_root_and_named_by_format(held_out):
    rows = load_vqa_dataset(str(held_out / "llava.json"), image_root=str(held_out / "image_folder"))
    assert [len(row["images"]) for row in rows] == [1, 0, 2]  # "image": a path, none, or a list
    assert rows[0]["images"][0]["path"] == str(held_out / "image_folder" / "coco" / "red.png")
    assert rows[0]["texts"][0]["user"] == "<image>\nWhat colour is it?"
    named = load_vqa_dataset(
        str(held_out / "llava.json"), image_root=str(held_out / "image_folder"), format="llava"
    )
    assert named["texts"] == rows["texts"]
    with pytest.raises(UserError, match="format 'sharegpt'"):
        load_vqa_dataset(str(held_out / "llava.json"), format="sharegpt")


def test_format_the_cauldron_saved_with_decoding_images_is_read_undecoded(tmp_path, tokenizer):
    """the_cauldron as `load_dataset` gives it: an Image() feature that decodes. Loaded, its images
    are bytes (never pixels), and a truncated one is a counted drop, not an OSError."""
    from datasets import Dataset, Features, List, Value
    from datasets import Image as ImageFeature

    features = Features(
        {
            "images": List(ImageFeature()),
            "texts": List(
                {"user": Value("string"), "assistant": Value("string"), "source": Value("string")}
            ),
        }
    )
    whole = io.BytesIO()
    Image.new("RGB", (64, 48)).save(whole, format="JPEG")
    rows = [
        {
            "images": [Image.new("RGB", (32, 32), (255, 0, 0))],
            "texts": [{"user": "Colour?", "assistant": "Red.", "source": "c"}],
        },
        {
            "images": [{"bytes": whole.getvalue()[:300], "path": None}],
            "texts": [{"user": "And?", "assistant": "Cut.", "source": "c"}],
        },
    ]
    Dataset.from_list(rows, features=features).save_to_disk(str(tmp_path / "cauldron"))
    loaded = load_vqa_dataset(str(tmp_path / "cauldron"))
    assert loaded.features["images"].feature.decode is False
    assert isinstance(loaded[0]["images"][0]["bytes"], bytes)
    family = family_for(tokenizer)  # TinyVLM decodes every image of a sample it builds
    assert family.make_sample(loaded[0], 0)["drop_reason"] is None
    assert family.make_sample(loaded[1], 1)["drop_reason"] == UNDECODABLE_IMAGE


def test_a_relative_path_without_a_folder_to_look_in_is_one_sentence():
    from mmdp.data.reading.formats import to_cauldron

    with pytest.raises(UserError, match="--image-root"):
        to_cauldron({"image": "a.png", "conversations": []}, "llava", None, "hub")


# Each image where its tag stands, as the real processor puts it ------------------------------


def text(value: str) -> dict:
    return {"type": "text", "text": value}


IMAGE = {"type": "image"}
# The first row of train.jsonl as messages for a processor, written out by hand: each image where
# its tag stands...
INTERLEAVED = [
    {"role": "system", "content": [text("You compare colours.")]},
    {"role": "user", "content": [text("Is "), IMAGE, text(" redder than "), IMAGE, text("?")]},
    {"role": "assistant", "content": [text("Yes, the first is red.")]},
    {"role": "user", "content": [text("And "), IMAGE, text("?")]},
    {"role": "assistant", "content": [text("That one is blue.")]},
]
# ...and the negative control: the images first in the first user turn, the_cauldron's place
IMAGES_FIRST = [
    INTERLEAVED[0],
    {"role": "user", "content": [IMAGE, IMAGE, IMAGE, text("Is  redder than ?")]},
    INTERLEAVED[2],
    {"role": "user", "content": [text("And ?")]},
    INTERLEAVED[4],
]


def reference(family, messages: list[dict], paths: list[str]) -> dict:
    """What the family's real processor makes of `messages` with the images at `paths`, in order:
    its own chat template and image processor (processor.apply_chat_template, as transformers
    documents it for training data); TinyVLM, which has no processor: its tokenizer's template
    with 64 <|image|> tokens per image, each image resized. input_ids and the vision inputs."""
    pictures = iter(Image.open(path).convert("RGB") for path in paths)
    if family.name == "tiny":
        image = family.tokenizer.image_token * config.IMAGE_TOKEN_LENGTH
        flat = [
            {"role": m["role"], "content": "".join(i.get("text", image) for i in m["content"])}
            for m in messages
        ]
        ids = family.tokenizer.apply_chat_template(flat, tokenize=True, return_dict=True)
        pixels = [load_image({"bytes": None, "path": path})[0] for path in paths]
        return {"input_ids": torch.tensor(ids["input_ids"]), "pixel_values": torch.stack(pixels)}
    messages = [
        {
            **m,
            "content": [{**i, "image": next(pictures)} if i == IMAGE else i for i in m["content"]],
        }
        for m in messages
    ]
    out = family.processor.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_tensors="pt"
    )
    per_token = ("input_ids", "mm_token_type_ids", "token_type_ids")
    return {key: value[0] if key in per_token else value for key, value in out.items()}


def assert_same_as_the_processor(family, sample: dict, expected: dict) -> None:
    assert torch.equal(sample["input_ids"], expected["input_ids"])
    compared = [key for key in expected if key in sample and key != "input_ids"]
    assert "pixel_values" in compared
    for key in compared:  # the processor adds a batch dimension some families' samples do not
        assert sample[key].numel() == expected[key].numel(), key
        assert torch.equal(sample[key], expected[key].reshape(sample[key].shape)), key


INTERLEAVED_FAMILIES = [
    "tiny",
    "qwen2_5_vl",
    *[
        pytest.param(name, marks=pytest.mark.slow)
        for name in ("qwen3_vl", "smolvlm", "llava_onevision", "gemma3")
    ],
]


@pytest.mark.parametrize("name", INTERLEAVED_FAMILIES)
def test_interleaved_row_equals_the_real_processors_output_and_its_weight(
    name, held_out, tokenizer
):
    """The first row of train.jsonl (a system prompt, two turns, three images between words):
    mmdp's sample is the real processor's input_ids, pixels and grids for the same messages;
    its weight from the headers is its length; only the replies are labelled. With the images
    moved to the front (the_cauldron's place), the processor makes another sequence."""
    family = family_for(tokenizer if name == "tiny" else offline_processor(name))
    row = load_vqa_dataset(str(held_out / "train.jsonl"))[0]
    paths = [image["path"] for image in row["images"]]
    sample = family.make_sample(row, 0)
    assert sample["drop_reason"] is None
    assert_same_as_the_processor(family, sample, reference(family, INTERLEAVED, paths))
    lengths, counts, _, reasons = family.weigh([row["texts"]], [row["images"]])
    assert (lengths[0], counts[0], reasons[0]) == (len(sample["input_ids"]), 3, None)
    labelled = family.tokenizer.decode(sample["labels"][sample["labels"] != -100])
    end = family.end_of_turn or "<|im_end|>"  # TinyVLM's ChatML
    assert labelled.replace(" ", "") == f"Yes,thefirstisred.{end}Thatoneisblue.{end}"
    moved = reference(family, IMAGES_FIRST, paths)
    assert not torch.equal(sample["input_ids"], moved["input_ids"])


def test_interleave_tags_that_do_not_match_the_files_are_a_counted_drop(held_out, tokenizer):
    rows = load_vqa_dataset(str(held_out / "train.jsonl"))
    for family in (family_for(tokenizer), family_for(offline_processor("qwen2_5_vl"))):
        texts, images = [r["texts"] for r in rows], [r["images"] for r in rows]
        _, _, _, reasons = family.weigh(texts, images)
        assert reasons[2] == MEDIA_TAG_MISMATCH == family.make_sample(rows[2], 2)["drop_reason"]
        assert reasons[6] == EMPTY_REPLY
        assert reasons[0] is None and reasons[1] is None


def test_interleaved_video_before_an_image_equals_the_real_processors_output(held_out):
    """A user turn with a <video> before an <image> (Qwen2.5-VL, which takes both): each run of
    feature tokens takes its own file's layout, and the sample is the processor's for the same
    messages (given every frame and the metadata: it samples the frames itself); the_cauldron's
    place (the image, then the video, first) gives another sequence."""
    from mmdp.data.synthetic.videos import generate_video_row
    from mmdp.data.videos import decode_frames, video_metadata

    family = family_for(offline_processor("qwen2_5_vl"))
    video = generate_video_row(0)["videos"][0]
    image = {"bytes": (held_out / "red.png").read_bytes(), "path": None}
    texts = [{"user": "<video> Where does it go? And <image>?", "assistant": "Down; red."}]
    sample = family.make_sample({"images": [image], "videos": [video], "texts": texts}, 0)
    assert sample["drop_reason"] is None

    def processor_outputs(content: list[dict]) -> dict:
        messages = [
            {"role": "user", "content": content},
            {"role": "assistant", "content": [text("Down; red.")]},
        ]
        metadata = video_metadata(video)
        return family.processor(
            text=[family.processor.apply_chat_template(messages, tokenize=False)],
            images=[Image.open(io.BytesIO(image["bytes"])).convert("RGB")],
            videos=[decode_frames(video, range(metadata.total_num_frames))],
            video_metadata=[metadata],
            return_tensors="pt",
        )

    VIDEO = {"type": "video"}
    out = processor_outputs([VIDEO, text(" Where does it go? And "), IMAGE, text("?")])
    for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"):
        assert torch.equal(sample[key], out[key]), key
    assert torch.equal(sample["input_ids"], out["input_ids"][0])
    cauldron = processor_outputs([IMAGE, VIDEO, text(" Where does it go? And ?")])
    assert not torch.equal(sample["input_ids"], cauldron["input_ids"][0])


# Stages 1 and 5 on the held-out files --------------------------------------------------------


def test_format_stage1_shows_a_users_row_with_each_images_place(run_main, held_out, tmp_path):
    status, out, err = run_main(
        "01_check_dataset.py", "--dataset", str(held_out / "train.jsonl"), "--row", "0",
        "--out-dir", str(tmp_path),
    )  # fmt: skip
    assert status == 0, err
    assert "System:    You compare colours." in out
    assert "User:      Is [image 1] redder than [image 2]?" in out
    assert "User:      And [image 3]?" in out
    assert f"image 3: {held_out / 'elsewhere' / 'blue.png'} (56x56)" in out
    assert (tmp_path / "01.png").stat().st_size > 10_000
    argv = ["01_check_dataset.py", "--dataset", "train.jsonl", "--row", "0"]
    paths = {str(held_out): "/tmp/users_data", str(tmp_path): "assets"}
    check_output("uv run 01_check_dataset.py --dataset train.jsonl --row 0", argv, out, paths=paths)


def test_format_a_users_rows_pack_for_qwen2_5_vl_each_used_or_counted_by_reason(held_out):
    """Stage 5's loader (planned, packed for Qwen2.5-VL) on the held-out messages file: four rows
    trained on, the four others counted with their reasons (two when weighed, two when their
    packs are built). The script itself: the next test (slow group)."""
    from mmdp.data.vqa_dataset import VQADataset
    from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
    from mmdp.packing.packing_config import PackingConfig
    from mmdp.report.pack_report import PackReport

    rows = load_vqa_dataset(str(held_out / "train.jsonl"))
    samples = VQADataset(rows, offline_processor("qwen2_5_vl"))
    packed = PackedDataset(samples, config=PackingConfig(max_length=2048, packs_per_batch=2))
    report = PackReport()
    for batch in PackedDataLoader(packed, num_workers=0):
        report.add_batch(batch)
    report.dropped.update(packed.plan().dropped)
    assert report.samples == 4  # rows 0, 1, 5 and 7
    assert report.dropped == {MEDIA_TAG_MISMATCH: 1, UNDECODABLE_IMAGE: 2, EMPTY_REPLY: 1}


@pytest.mark.slow  # the script draws every family's costs: a processor each, 10-20 s
def test_format_the_planned_loader_packs_a_users_rows_and_counts_every_drop_by_reason(
    run_main, held_out, tmp_path
):
    metrics = tmp_path / "05.json"
    status, out, err = run_main(
        "examples/pack_planned.py", "--dataset", str(held_out / "train.jsonl"),
        "--model", "qwen2_5_vl", "--num-workers", "0", "--packs-per-batch", "2",
        "--out-dir", str(tmp_path), "--metrics-json", str(metrics),
    )  # fmt: skip
    assert status == 0, err
    report = json.loads(metrics.read_text())
    assert report["samples"] == 4  # rows 0, 1, 5 and 7
    assert report["dropped"] == {MEDIA_TAG_MISMATCH: 1, UNDECODABLE_IMAGE: 2, EMPTY_REPLY: 1}
    assert report["samples"] + sum(report["dropped"].values()) == 8
    assert "Your rows" in out and "media_tag_mismatch" in out and "tokens per sample" in out
    command = "uv run examples/pack_planned.py --dataset train.jsonl --model qwen2_5_vl"
    # the file as the docs' command names it (from its folder); other paths in /tmp/users_data
    paths = {str(held_out / "train.jsonl"): "train.jsonl", str(held_out): "/tmp/users_data",
             str(tmp_path): "assets"}  # fmt: skip
    check_output(command, ["examples/pack_planned.py", "--num-workers", "0"], out, paths=paths)


def test_format_a_users_file_is_a_source_of_a_mixture(held_out):
    """A mixture's source may be a user's file (its format and image root as keys): its rows keep
    their system prompts and tags beside the_cauldron's rows of another source."""
    from mmdp.data.mixture import load_mixture, mixture_from_dict

    spec = {
        "sources": [
            {"name": "count", "dataset": "synthetic:count", "share": 0.5},
            {"name": "mine", "dataset": str(held_out / "llava.json"), "share": 0.5,
             "image_root": str(held_out / "image_folder"), "format": "llava"},
        ]
    }  # fmt: skip
    mixed = load_mixture(mixture_from_dict(spec), num_rows=100)
    mine = mixed.dataset.select(range(mixed.rows_per_source[0], len(mixed.dataset)))
    assert mine["texts"][0][0]["user"] == "<image>\nWhat colour is it?"
    assert mine[0]["images"][0]["path"] == str(held_out / "image_folder" / "coco" / "red.png")
    assert mixed.dataset[0]["texts"][0]["system"] is None


def test_format_a_users_file_streams_as_the_same_rows(held_out):
    from mmdp.data.reading.stream import load_vqa_stream

    path = str(held_out / "train.jsonl")
    assert list(load_vqa_stream(path, num_shards=2)) == list(load_vqa_dataset(path))


def test_format_a_file_that_is_not_rows_mmdp_reads_is_one_sentence(tmp_path):
    (tmp_path / "broken.jsonl").write_text('{"messages": []}\n{not json\n')
    with pytest.raises(UserError, match="broken.jsonl, line 2: not JSON"):
        load_vqa_dataset(str(tmp_path / "broken.jsonl"))
    (tmp_path / "alpaca.jsonl").write_text('{"instruction": "Add 2 and 2.", "output": "4"}\n')
    with pytest.raises(UserError, match="instruction, output are in no format mmdp reads"):
        load_vqa_dataset(str(tmp_path / "alpaca.jsonl"))


def test_format_messages_saved_by_datasets_with_content_items_and_decoding_images(
    tmp_path, held_out
):
    """A Hub-style messages dataset (TRL's: content as items, images an Image() feature that
    decodes) saved with save_to_disk, and LLaVA rows in parquet naming files beside it: converted
    by one datasets.map, their images bytes or paths, never pixels, each tag where its item was."""
    from datasets import Dataset, Features, List, Value
    from datasets import Image as ImageFeature

    item = {"type": Value("string"), "text": Value("string")}
    features = Features(
        {
            "messages": List({"role": Value("string"), "content": List(item)}),
            "images": List(ImageFeature()),
        }
    )
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Is "}, {"type": "image", "text": None},
                                     {"type": "text", "text": " red?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Yes."}]},
    ]  # fmt: skip
    picture = Image.new("RGB", (20, 10), (250, 0, 0))
    Dataset.from_list(
        [{"messages": messages, "images": [picture]}], features=features
    ).save_to_disk(str(tmp_path / "trl"))
    row = load_vqa_dataset(str(tmp_path / "trl"))[0]
    assert row["texts"][0]["user"] == "Is <image> red?" and row["texts"][0]["assistant"] == "Yes."
    assert isinstance(row["images"][0]["bytes"], bytes)
    llava = json.loads((held_out / "llava.json").read_text())
    for entry in llava:
        entry["id"], entry["image"] = str(entry["id"]), entry.get("image", [])
        entry["image"] = [entry["image"]] if isinstance(entry["image"], str) else entry["image"]
    (tmp_path / "parquet" / "coco").mkdir(parents=True)
    save(Image.new("RGB", (8, 8)), tmp_path / "parquet" / "coco" / "red.png")
    Dataset.from_list(llava).to_parquet(str(tmp_path / "parquet" / "llava.parquet"))
    rows = load_vqa_dataset(str(tmp_path / "parquet" / "llava.parquet"))
    assert rows[0]["images"] == [
        {"bytes": None, "path": str(tmp_path / "parquet" / "coco" / "red.png")}
    ]
    assert [len(images) for images in rows["images"]] == [1, 0, 2]
