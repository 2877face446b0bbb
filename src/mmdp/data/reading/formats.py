"""The formats VLM trainers read, each turned into the_cauldron's schema, one row at a time.

Three formats, told apart by their columns (or named: `load_vqa_dataset(..., format=...)`,
`--format`):

    the_cauldron  {"images": [...], "texts": [{"user", "assistant", "source"}, ...]}
    messages      ms-swift's and LLaMA-Factory's: {"messages": [{"role", "content"}, ...],
                  "images": [...], "videos": [...]}, roles system / user / assistant; also
                  spelled as LLaMA-Factory's sharegpt: "conversations" of {"from", "value"},
                  from human / gpt / system, and a top-level "system"; a content may be a list
                  of {"type": "text" | "image" | "video"} items (TRL's and transformers' own form)
    llava         LLaVA's (and ShareGPT4V's, LLaVA-Video's): {"image": "path" or [...],
                  "video": ..., "conversations": [{"from": "human" | "gpt", "value"}, ...]}

What every row becomes (mmdp.data.reading.sources.CONVERSATION_FEATURES, the_cauldron's schema):

    images  [{"bytes", "path"}, ...]   the files in order, undecoded; a path is absolute,
                                       file://, or remote (s3://, gs://, hf://, https://...)
    videos  [{"bytes", "path"}, ...]
    texts   [{"user", "assistant", "source", "system"}, ...]   a turn per user message and its
            reply, the <image> and <video> tags left where the user's text had them (the family
            puts each file there: mmdp.data.conversation); the system prompt on the first turn

Example (a messages row; its file beside it, in /data):

    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Compare <image> and <image>."},
                  {"role": "assistant", "content": "The left is larger."}],
     "images": ["a.png", "s3://bucket/b.png"]}
    -> images: [{"bytes": None, "path": "/data/a.png"}, {"bytes": None, "path": "s3://bucket/b.png"}]
       texts:  [{"user": "Compare <image> and <image>.", "assistant": "The left is larger.",
                 "source": "train.jsonl", "system": "Be brief."}]

A path is absolute, `file://`, `~`, remote, or relative: to `image_root` if given (a folder or a
remote prefix, LLaVA's `--image_folder`), else to the folder of the file that names it. A
`data:` URI holds its bytes.

A conversation becomes (user, reply) turns in order; nothing is dropped here, so that every row
is counted where rows are built: a user message without a reply becomes a turn with none
(`empty_reply`), a reply without a question a turn with an empty one (as a null question in
the_cauldron), and a role mmdp does not know (a tool's) leaves the row without turns
(`no_texts`). Audio (an "audio" item, or an `audios` column without tags: ms-swift's) becomes an
<audio> tag in the user's text, so that the row is counted (`audio_refused`).
"""

import base64
import json
import re
from collections.abc import Iterator

from mmdp.data.files import is_remote, local_path
from mmdp.errors import UserError

FORMATS = ("the_cauldron", "messages", "llava")
ROLES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "system": "system",
}
DATA_URI = re.compile(r"data:[^;,]*;base64,")


def detect_format(columns) -> str:
    """The format of rows with these columns (a dataset's, or a JSON row's keys).

    >>> detect_format({"id", "image", "conversations"}), detect_format({"messages", "images"})
    ('llava', 'messages')
    """
    columns = set(columns)
    if "texts" in columns:
        return "the_cauldron"
    if "messages" in columns or "conversations" in columns:
        media = {"image", "video"} & columns and not {"images", "videos"} & columns
        return "llava" if media else "messages"
    raise UserError(
        f"rows with the columns {', '.join(sorted(columns)) or '(none)'} are in no format mmdp "
        "reads: the_cauldron (images, texts), messages (messages or conversations, with images "
        "and videos) or llava (image, conversations)"
    )


def check_format(format: str | None) -> None:
    if format is not None and format not in FORMATS:
        raise UserError(f"format {format!r}: mmdp reads {', '.join(FORMATS)}")


def resolve(path: str, base: str | None) -> str:
    """A file's path as mmdp opens it: relative paths joined to `base` (a folder or a remote
    prefix); a relative path with no base is a UserError.

    >>> resolve("coco/1.jpg", "s3://bucket/images/"), resolve("a.png", "/data")
    ('s3://bucket/images/coco/1.jpg', '/data/a.png')
    >>> resolve("file:///data/a.png", "/other"), resolve("https://x.org/a.png", "/data")
    ('/data/a.png', 'https://x.org/a.png')
    """
    if is_remote(path):
        return path
    path = path.removeprefix("file://")
    if path.startswith(("/", "~")):
        return local_path(path)
    if base is None:
        raise UserError(
            f"the file {path!r} is named relative to a folder mmdp does not know (the dataset "
            "is not a local file); give the folder: --image-root DIR (image_root=DIR)"
        )
    if is_remote(base):
        return base.rstrip("/") + "/" + path
    return local_path(f"{base.rstrip('/')}/{path}")


def cell(file, base: str | None) -> dict:
    """A {"bytes", "path"} cell of one image or video: a path, a data: URI, or a cell already."""
    if isinstance(file, dict):
        if file.get("bytes") is not None or not file.get("path"):
            return {"bytes": file.get("bytes"), "path": file.get("path")}
        file = file["path"]
    if not isinstance(file, str):
        return {"bytes": None, "path": None}  # a null in the list: undecodable when built
    if DATA_URI.match(file):
        return {"bytes": base64.b64decode(file[DATA_URI.match(file).end() :]), "path": None}
    return {"bytes": None, "path": resolve(file, base)}


def as_list(value) -> list:
    """A file list, as rows give one: a list, one value, or nothing."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def to_cauldron(row: dict, format: str, base: str | None, source: str | None) -> dict:
    """One row of `format` in the_cauldron's schema (see the module docstring)."""
    if format == "the_cauldron":
        texts = [
            {key: (turn or {}).get(key) for key in ("user", "assistant", "source", "system")}
            for turn in row.get("texts") or []
        ]
        images, videos = row.get("images"), row.get("videos")
    else:
        messages = row.get("messages") or row.get("conversations") or []
        inline_images, inline_videos = [], []
        texts = turns_of(messages, row.get("system"), source, inline_images, inline_videos)
        key = "image" if format == "llava" else "images"
        images = as_list(row.get(key)) + inline_images
        videos = as_list(row.get(key.replace("image", "video"))) + inline_videos
    audios = len(as_list(row.get("audios")))
    if audios and texts and not any("<audio>" in (turn["user"] or "") for turn in texts):
        texts[0] = {**texts[0], "user": "<audio>" * audios + (texts[0]["user"] or "")}
    return {
        "images": [cell(file, base) for file in as_list(images)],
        "videos": [cell(file, base) for file in as_list(videos)],
        "texts": texts,
    }


def turns_of(messages, system, source, images: list, videos: list) -> list[dict]:
    """(user, reply) turns of a conversation, in order; the files a content names inline are
    appended to `images` and `videos`."""
    turns = []
    for k, message in enumerate(messages or []):
        message = message or {}
        role = ROLES.get(message.get("role", message.get("from")))
        text = content_text(message.get("content", message.get("value")), images, videos)
        if role == "system" and k == 0 and system is None:
            system = text
        elif role == "user":
            turns.append({"user": text, "assistant": None})
        elif role == "assistant" and turns and turns[-1]["assistant"] is None:
            turns[-1]["assistant"] = text
        elif role == "assistant":  # a reply with no question before it
            turns.append({"user": None, "assistant": text})
        else:  # a role mmdp does not know, or a system prompt in the middle
            return []
    return [
        {**turn, "source": source, "system": system if first else None}
        for first, turn in zip([True] + [False] * len(turns), turns)
    ]


def content_text(content, images: list, videos: list) -> str | None:
    """A message's content as text with tags: a string as it is; a list of items in order, an
    image or video item as its tag (its file, if the item names one, appended to the files)."""
    if content is None or isinstance(content, str):
        return content
    pieces = []
    for item in content:
        kind = (item or {}).get("type")
        if kind == "text":
            pieces.append(item.get("text") or "")
        elif kind in ("image", "video"):
            pieces.append(f"<{kind}>")
            named = next((item[key] for key in (kind, "url", "path") if item.get(key)), None)
            if named is not None:
                (images if kind == "image" else videos).append(named)
        elif kind == "audio":
            pieces.append("<audio>")
    return "".join(pieces)


def convert_batch(
    batch: dict, format: str, base: str | None, source: str | None, entry=None
) -> dict:
    """datasets.map's function: a batch of rows of `format` in the_cauldron's schema (a
    LLaMA-Factory `entry`'s rows first made messages rows: mmdp.data.reading.column_maps)."""
    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    if entry is not None:
        rows = [entry.as_messages(row) for row in rows]
    converted = [to_cauldron(row, format, base, source) for row in rows]
    return {key: [row[key] for row in converted] for key in ("images", "videos", "texts")}


def json_rows(
    files: list[str],
    format: str | None,
    image_root: str | None,
    stamps=None,
    renames: dict | None = None,
    entry=None,
) -> Iterator[dict]:
    """Every row of JSON (a list of rows) and JSON Lines files, local or remote, in the_cauldron's
    schema: each row's format its own columns' (or `format`), its relative paths joined to
    `image_root` or to its file's folder. Its columns are renamed first (`renames`, ms-swift's
    --columns), a LLaMA-Factory `entry`'s rows made messages rows (mmdp.data.reading.column_maps);
    a column either names that no row has is one sentence, once every row is read. (`stamps`:
    what the cache of the rows is keyed by.)"""
    import fsspec

    from mmdp.data.reading.column_maps import check_named, renamed

    renames = renames or {}
    seen = set()  # the columns of the rows, when a map names some
    for name in files:
        folder, _, source = name.rpartition("/")
        base = image_root or folder or "."
        with fsspec.open(name, "rt", encoding="utf-8") as file:
            first = None  # the format of the file's first row: a file in no format is refused
            for row in read_json(file, name):
                if not isinstance(row, dict):
                    raise UserError(f"{name}: a row is {type(row).__name__}, not an object")
                if renames or entry is not None:
                    seen.update(row)
                    row = renamed(row, renames, name) if renames else row
                    row = entry.as_messages(row) if entry is not None else row
                if format is None and first is None:
                    first = detect_format(row)
                yield to_cauldron(row, format or row_format(row, first), base, source)
    where = (
        files[0] if len(files) == 1 else f"the {len(files)} files of {files[0].rpartition('/')[0]}"
    )
    if renames:
        check_named(renames, seen, where)
    if entry is not None:
        check_named(entry.named_columns(), {renames.get(c, c) for c in seen}, where, "the entry")


def row_format(row: dict, first: str) -> str:
    """A JSON row's own format (a LLaVA file's text-only rows have no "image"); a row in none is
    read in its file's first row's format (it then has no turns: counted as no_texts)."""
    try:
        return detect_format(row)
    except UserError:
        return first


def read_json(file, name: str):
    """The rows of an open JSON file (one list of rows) or JSON Lines file (a row a line)."""
    if name.endswith(".jsonl"):
        for number, line in enumerate(file, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as error:
                    raise UserError(f"{name}, line {number}: not JSON ({error})") from None
        return
    try:
        rows = json.load(file)
    except json.JSONDecodeError as error:
        raise UserError(f"{name}: not JSON ({error})") from None
    if not isinstance(rows, list):
        raise UserError(
            f"{name}: a JSON file of rows holds a list of them, not a {type(rows).__name__}"
        )
    yield from rows
