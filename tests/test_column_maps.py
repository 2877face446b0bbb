"""Column maps (mmdp.data.reading.column_maps): LLaMA-Factory's dataset_info.json entries and
ms-swift's --columns, written by hand here in each shape (sharegpt with renamed columns and
tags, alpaca with history and images, a folder, a parquet file), read as the same rows, and
made into the same samples (input_ids, labels, pixels), as the plain files they describe; what
mmdp would not read as the trainer does is one sentence."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from mmdp.data.reading.settings import DataSettings
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.reading.stream import load_vqa_stream
from mmdp.data.vqa_dataset import VQADataset
from mmdp.drop_reasons import EMPTY_REPLY, NO_TEXTS, VIDEO_REFUSED
from mmdp.errors import UserError
from mmdp.flags import parse_flags


def user(text):
    return {"role": "user", "content": text}


def reply(text):
    return {"role": "assistant", "content": text}


# The plain file: messages rows as mmdp reads them (mmdp.data.reading.formats), files beside it.
PLAIN = [
    {
        "messages": [
            {"role": "system", "content": "You compare colours."},
            user("Is <image> redder than <image>?"),
            reply("Yes, the first is red."),
            user("And <image>?"),
            reply("That one is blue."),
        ],
        "images": ["red.png", "photos/green.jpg", "blue.png"],
    },
    {"messages": [user("Spell cat."), reply("C-A-T.")]},
    {
        "messages": [user("<image>Colour?"), reply("Green.")],
        "system": "Answer in one word.",
        "images": ["photos/green.jpg"],
        "videos": ["clips/moving.mp4"],
    },
]


def sharegpt_row(row: dict) -> dict:
    """A plain row in the sharegpt entry's spelling: columns and tags renamed, the system
    prompt a first "narrator" message or the "preamble" column."""
    speakers = {"system": "narrator", "user": "person", "assistant": "bot"}
    said = [{"speaker": speakers[m["role"]], "says": m["content"]} for m in row["messages"]]
    renamed = {"dialogue": said, "pictures": row.get("images", [])}
    if "system" in row:
        renamed["preamble"] = row["system"]
    if "videos" in row:
        renamed["clips"] = row["videos"]
    return renamed


SHAREGPT_ENTRY = {
    "file_name": "llamafactory/renamed.json",  # in a folder: its paths are under dataset_info's
    "formatting": "sharegpt",
    "columns": {
        "messages": "dialogue",
        "system": "preamble",
        "images": "pictures",
        "videos": "clips",
    },
    "tags": {
        "role_tag": "speaker",
        "content_tag": "says",
        "user_tag": "person",
        "assistant_tag": "bot",
        "system_tag": "narrator",
    },
}
# The plain rows 0 and 1 in alpaca's shape: earlier turns as history, prompt and query
# joined by a newline ("Spell" + "cat."), the system prompt a column.
ALPACA = [
    {
        "instruction": "And <image>?",
        "input": "",
        "output": "That one is blue.",
        "history": [["Is <image> redder than <image>?", "Yes, the first is red."]],
        "system": "You compare colours.",
        "images": ["red.png", "photos/green.jpg", "blue.png"],
    },
    {"instruction": "Spell", "input": "cat.", "output": "C-A-T.", "history": [], "images": []},
]
ALPACA_COLUMNS = {
    "prompt": "instruction",
    "query": "input",
    "response": "output",
    "history": "history",
    "system": "system",
    "images": "images",
}
ALPACA_AS_PLAIN = [
    PLAIN[0],
    {"messages": [user("Spell\ncat."), reply("C-A-T.")], "images": []},
]


def write_json(path, rows) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    else:
        path.write_text(json.dumps(rows))
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A LLaMA-Factory data folder: the images, the plain files, the entries' files, and
    dataset_info.json describing them."""
    root = tmp_path_factory.mktemp("llamafactory_data")
    for name, size, colour in (
        ("red.png", (64, 48), (200, 30, 30)),
        ("photos/green.jpg", (40, 60), (30, 200, 30)),
        ("blue.png", (56, 56), (30, 30, 200)),
    ):
        (root / name).parent.mkdir(exist_ok=True)
        Image.new("RGB", size, colour).save(root / name)
    write_json(root / "plain.jsonl", PLAIN)
    write_json(root / "plain_alpaca.jsonl", ALPACA_AS_PLAIN)
    write_json(root / "llamafactory" / "renamed.json", [sharegpt_row(row) for row in PLAIN])
    write_json(root / "alpaca.json", ALPACA)
    pq.write_table(pa.Table.from_pylist(ALPACA), root / "alpaca.parquet")
    # a folder of the plain rows in sharegpt's own spelling (from/value, human/gpt)
    spelled = [
        {
            "conversations": [
                {
                    "from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]),
                    "value": m["content"],
                }
                for m in row["messages"]
            ],
            **{key: row[key] for key in ("system", "images", "videos") if key in row},
        }
        for row in PLAIN
    ]
    write_json(root / "parts" / "a.jsonl", spelled[:2])
    write_json(root / "parts" / "b.json", spelled[2:])
    info = {
        "renamed": SHAREGPT_ENTRY,
        "alpaca": {"file_name": "alpaca.json", "columns": ALPACA_COLUMNS},
        "alpaca_parquet": {"file_name": "alpaca.parquet", "columns": ALPACA_COLUMNS},
        "parts": {
            "file_name": "parts",
            "formatting": "sharegpt",
            "columns": {
                "messages": "conversations",
                "system": "system",
                "images": "images",
                "videos": "videos",
            },
        },
    }
    (root / "dataset_info.json").write_text(json.dumps(info))
    return root


def without_source(rows) -> list[dict]:
    """The rows as dicts, each turn without its source (the name of the file read)."""
    return [
        {**row, "texts": [{k: v for k, v in t.items() if k != "source"} for t in row["texts"]]}
        for row in rows
    ]


def assert_same_samples(rows, plain, tokenizer, reasons: list) -> None:
    """The rows are the plain file's, and TinyVLM's samples of them equal tensor for tensor
    (each used, or dropped for the reason in `reasons`)."""
    assert without_source(rows) == without_source(plain)
    ours, theirs = VQADataset(rows, tokenizer), VQADataset(plain, tokenizer)
    assert [ours[k]["drop_reason"] for k in range(len(plain))] == reasons
    for k in range(len(plain)):
        a, b = ours[k], theirs[k]
        assert a["drop_reason"] == b["drop_reason"]
        for key in ("input_ids", "labels", "pixel_values"):
            assert (key in a) == (key in b) and (key not in a or torch.equal(a[key], b[key])), key


def test_a_sharegpt_entry_with_renamed_columns_and_tags_reads_as_the_plain_file(data, tokenizer):
    rows = load_vqa_dataset(f"{data}/dataset_info.json:renamed")
    plain = load_vqa_dataset(str(data / "plain.jsonl"))
    # paths under dataset_info.json's folder (LLaMA-Factory's media_dir), not the file's
    assert rows[0]["images"][1]["path"] == str(data / "photos" / "green.jpg")
    assert rows[0]["texts"][0]["system"] == "You compare colours."  # the first message's
    assert rows[2]["texts"][0]["system"] == "Answer in one word."  # the preamble column's
    assert rows[2]["videos"] == [{"bytes": None, "path": str(data / "clips" / "moving.mp4")}]
    # TinyVLM takes no video: the third row is dropped, from either file
    assert_same_samples(rows, plain, tokenizer, [None, None, VIDEO_REFUSED])
    # the same entry named in Python, and as a stream
    assert load_vqa_dataset(str(data / "dataset_info.json"), name="renamed")[:] == rows[:]
    assert list(load_vqa_stream(f"{data}/dataset_info.json:renamed")) == list(rows)


def test_an_alpaca_entry_with_history_and_images_reads_as_the_plain_file(data, tokenizer):
    plain = load_vqa_dataset(str(data / "plain_alpaca.jsonl"))
    for name in ("alpaca", "alpaca_parquet"):  # JSON read by mmdp, parquet by datasets
        rows = load_vqa_dataset(f"{data}/dataset_info.json:{name}")
        assert_same_samples(rows, plain, tokenizer, [None, None])


def test_a_folder_entry_reads_its_files_as_the_plain_file(data, tokenizer):
    rows = load_vqa_dataset(f"{data}/dataset_info.json:parts")
    plain = load_vqa_dataset(str(data / "plain.jsonl"))
    assert_same_samples(rows, plain, tokenizer, [None, None, VIDEO_REFUSED])


def test_an_entry_reads_only_the_columns_it_names_as_llamafactory_does(tmp_path):
    """With `columns`, a column it does not name is not read (the alpaca query, the images);
    without, the defaults (instruction, input, output; no images, no system)."""
    rows = [{"instruction": "Spell", "input": "cat.", "output": "C-A-T.", "images": ["a.png"]}]
    write_json(tmp_path / "rows.json", rows)
    info = {
        "defaults": {"file_name": "rows.json"},
        "no_query": {
            "file_name": "rows.json",
            "columns": {"prompt": "instruction", "response": "output"},
        },
    }
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    defaults = load_vqa_dataset(f"{tmp_path}/dataset_info.json:defaults")[0]
    assert (defaults["texts"][0]["user"], defaults["images"]) == ("Spell\ncat.", [])
    assert (
        load_vqa_dataset(f"{tmp_path}/dataset_info.json:no_query")[0]["texts"][0]["user"] == "Spell"
    )


def test_rows_llamafactory_skips_are_dropped_and_counted(tmp_path, tokenizer):
    """Turns that do not alternate user, reply, a tool's turn, a conversation ending on a
    question: LLaMA-Factory skips the row, mmdp counts it (no_texts); an alpaca row without
    its output is a question without a reply (empty_reply)."""

    def said(*pairs):
        return {"conversations": [{"from": who, "value": text} for who, text in pairs]}

    sharegpt = [
        said(("human", "Hi"), ("human", "Again?"), ("gpt", "Yes.")),
        said(
            ("human", "Weather?"), ("function_call", "{}"), ("observation", "Sun"), ("gpt", "Sun.")
        ),
        said(("human", "Hi"), ("gpt", "Hello."), ("human", "Bye?")),
        said(("gpt", "Hello."), ("human", "Hi")),
        said(("human", "Hi"), ("gpt", "Hello.")),  # the control: used
    ]
    write_json(tmp_path / "chat.json", sharegpt)
    write_json(tmp_path / "alpaca.json", [{"instruction": "Hi", "input": "", "output": None}])
    info = {
        "chat": {"file_name": "chat.json", "formatting": "sharegpt"},
        "alpaca": {"file_name": "alpaca.json"},
    }
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    samples = VQADataset(load_vqa_dataset(f"{tmp_path}/dataset_info.json:chat"), tokenizer)
    assert [samples[k]["drop_reason"] for k in range(5)] == [NO_TEXTS] * 4 + [None]
    alpaca = VQADataset(load_vqa_dataset(f"{tmp_path}/dataset_info.json:alpaca"), tokenizer)
    assert alpaca[0]["drop_reason"] == EMPTY_REPLY


def test_columns_renames_before_the_format_is_told(data, tokenizer, tmp_path):
    """ms-swift's --columns: LLaVA's rows under other names, renamed, are LLaVA's rows; in a
    JSON file (each row renamed) and a parquet file (the table's columns renamed)."""
    llava = [
        {
            "image": "red.png",
            "conversations": [
                {"from": "human", "value": "<image>\nColour?"},
                {"from": "gpt", "value": "Red."},
            ],
        },
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]},
    ]
    renamed = [
        {{"image": "img", "conversations": "conv"}[k]: v for k, v in row.items()} for row in llava
    ]
    plain = load_vqa_dataset(write_json(data / "llava_plain.json", llava))
    columns = {"conv": "conversations", "img": "image"}
    rows = load_vqa_dataset(write_json(data / "llava_renamed.json", renamed), columns=columns)
    assert_same_samples(rows, plain, tokenizer, [None, None])
    pq.write_table(pa.Table.from_pylist(renamed), data / "llava_renamed.parquet")
    from_parquet = load_vqa_dataset(str(data / "llava_renamed.parquet"), columns=columns)
    assert without_source(from_parquet) == without_source(plain)
    streamed = load_vqa_stream(str(data / "llava_renamed.parquet"), columns=columns)
    assert without_source(streamed) == without_source(plain)
    # the flag, as every script that takes --dataset has it
    argv = ["--dataset", str(data / "llava_renamed.json"), "--columns", json.dumps(columns)]
    assert parse_flags(DataSettings, "", argv).load()[:] == rows[:]


def test_bad_columns_are_one_sentence(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        parse_flags(DataSettings, "", ["--columns", "{conv: conversations}"])
    assert exit.value.code == 2 and "argument --columns: not JSON" in capsys.readouterr().err
    llava = write_json(tmp_path / "llava.json", [{"conversations": [], "image": "red.png"}])
    parquet = tmp_path / "llava.parquet"
    pq.write_table(pa.Table.from_pylist([{"conversations": [], "image": "red.png"}]), parquet)
    for path in (llava, str(parquet)):
        with pytest.raises(
            UserError,
            match=r"names the column\(s\) 'conv', which .* does not have \(its columns: conversations, image\)",
        ):
            load_vqa_dataset(path, columns={"conv": "conversations"})
        with pytest.raises(UserError, match="renames 'image' to 'conversations', a column"):
            load_vqa_dataset(path, columns={"image": "conversations"})
    with pytest.raises(UserError, match="a JSON object of old: new column names"):
        load_vqa_dataset(llava, columns=["conv"])
    with pytest.raises(UserError, match="renames two columns to one name"):
        load_vqa_dataset(llava, columns={"a": "image", "b": "image"})


def entry_error(tmp_path, entry: dict, **kwargs) -> str:
    (tmp_path / "dataset_info.json").write_text(
        json.dumps({"mine": entry, "other": {"file_name": "x.json"}})
    )
    with pytest.raises(UserError) as error:
        load_vqa_dataset(f"{tmp_path}/dataset_info.json:mine", **kwargs)
    return str(error.value)


@pytest.mark.parametrize(
    "entry, said",
    [
        ({"file_name": "rows.json", "ranking": True}, r"is a ranking \(preference\) dataset"),
        (
            {
                "file_name": "rows.json",
                "columns": {"prompt": "q", "response": "a", "tools": "tools"},
            },
            "names a tools column: mmdp packs no tool descriptions",
        ),
        (
            {
                "file_name": "rows.json",
                "columns": {"prompt": "q", "response": "a", "audios": "sound"},
            },
            "names a audios column: mmdp reads images and videos, not audio",
        ),
        (
            {
                "file_name": "rows.json",
                "formatting": "sharegpt",
                "columns": {"messages": "m", "role": "role"},
            },
            "columns has 'role', which LLaMA-Factory does not read",
        ),
        (
            {"file_name": "rows.json", "formatting": "openai"},
            "formatting 'openai': mmdp reads alpaca and sharegpt entries",
        ),
        (
            {"file_name": "rows.json", "num_samples": 10},
            "takes num_samples rows at random, which mmdp does not",
        ),
        (
            {"ms_hub_url": "AI-ModelScope/x"},
            r"is a ModelScope dataset \(ms_hub_url\), which mmdp does not read",
        ),
        ({"script_url": "my_script"}, r"is a loading script \(script_url\)"),
        ({"formatting": "sharegpt"}, "names no file_name"),
        ({"file_name": "absent.json"}, "file_name '.*absent.json': no such file or directory"),
        ({"file_name": "rows.csv"}, "holds csv: mmdp reads JSON, JSON Lines or parquet files"),
        (
            {"file_name": "rows.json", "columns": {"prompt": "question", "response": "output"}},
            r"the entry names the column\(s\) 'question', which .*rows.json does not have",
        ),
        (
            {"file_name": "rows.json", "columns": {"prompt": "instruction"}},
            "an alpaca entry names its prompt .* and response columns",
        ),
    ],
)
def test_what_an_entry_holds_that_mmdp_would_read_otherwise_is_one_sentence(tmp_path, entry, said):
    write_json(tmp_path / "rows.json", [{"instruction": "Hi", "output": "Hello."}])
    (tmp_path / "rows.csv").write_text("instruction,output\nHi,Hello.\n")
    message = entry_error(tmp_path, entry)
    assert re.search(said, message), message


def test_a_missing_name_lists_the_datasets(data, tmp_path):
    info = data / "dataset_info.json"
    with pytest.raises(
        UserError,
        match="has no dataset 'nope'; its datasets: renamed, alpaca, alpaca_parquet, parts",
    ):
        load_vqa_dataset(f"{info}:nope")
    for unnamed in (str(info), str(data)):  # the file, or LLaMA-Factory's folder, without a name
        with pytest.raises(
            UserError,
            match=r"describes datasets by name: give one, --dataset .*dataset_info.json:NAME .*its datasets: renamed,",
        ):
            load_vqa_dataset(unnamed)
    with pytest.raises(UserError, match="formatting tells its rows' format"):
        load_vqa_dataset(f"{info}:renamed", format="llava")


def test_a_hub_entry_offline_is_one_sentence(tmp_path, monkeypatch):
    import mmdp.data.hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(
        mmdp.data.hub, "hub_offline_reason", lambda: "cannot connect to huggingface.co"
    )
    said = entry_error(
        tmp_path, {"hf_hub_url": "BUAADreamer/llava-en-zh-300k", "formatting": "sharegpt"}
    )
    assert said.startswith(
        "dataset 'BUAADreamer/llava-en-zh-300k' must be downloaded from the Hugging Face Hub"
    )


def test_a_mixtures_sources_take_an_entry_and_columns(data):
    from mmdp.data.mixture import load_mixture, mixture_from_dict

    renamed = [{"talk": row["messages"], "images": row.get("images", [])} for row in PLAIN[:2]]
    talk = write_json(data / "talk.jsonl", renamed)
    mixture = mixture_from_dict(
        {
            "sources": [
                {"name": "entry", "dataset": f"{data}/dataset_info.json:renamed", "share": 1},
                {"name": "renamed", "dataset": talk, "share": 1, "columns": {"talk": "messages"}},
            ]
        }
    )
    mixed = load_mixture(mixture, num_rows=8).dataset
    plain = load_vqa_dataset(str(data / "plain.jsonl"))
    assert without_source(mixed) == without_source(plain) + without_source(plain.select([0, 1]))
