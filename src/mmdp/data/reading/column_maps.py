"""Column maps: rows whose columns are named otherwise, read as mmdp's formats, in the two
spellings the trainers' users have already written.

    --columns '{"conv": "conversations"}'   ms-swift's: columns renamed (old: new) before the
                                            format is told (load_vqa_dataset(columns=...))
    --dataset data/dataset_info.json:NAME   LLaMA-Factory's entry NAME in its dataset_info.json
                                            (load_vqa_dataset("data/dataset_info.json",
                                            name="NAME")): its file, formatting, columns, tags

An entry is read as LLaMA-Factory reads it (its DatasetAttr and converters, data/parser.py and
data/converter.py): each row becomes a messages row (mmdp.data.reading.formats), then the_cauldron's.

- `file_name`: a file or a folder (its files) beside dataset_info.json: JSON, JSON Lines or
  parquet. `hf_hub_url` (with `subset`, `split`, `folder`): a Hub dataset (online);
  `cloud_file_name`: a remote file (s3://...).
- `formatting` "sharegpt": the `messages` column (default "conversations") holds messages whose
  role is `role_tag`'s value (default "from") and text `content_tag`'s ("value"); `user_tag`
  ("human"), `assistant_tag` ("gpt") and `system_tag` ("system", a first message only) tell the
  roles. A row whose turns do not alternate user, reply (ending on a reply) is one
  LLaMA-Factory skips: it is counted as no_texts. A tool's turn (`observation_tag`,
  `function_tag`) is a role mmdp does not know: no_texts too.
- `formatting` "alpaca" (the default): the user's text is `prompt` ("instruction") and `query`
  ("input") joined by a newline, the reply `response` ("output"), earlier turns `history` (a
  list of [question, reply] pairs).
- `system`, `images`, `videos`: read only when `columns` names them. As LLaMA-Factory does,
  `columns` given is the whole list: a column it does not name is not read (so with `columns`,
  an alpaca entry names its `prompt`...), and likewise `tags`.
- Relative file paths are under `--image-root` if given, else beside dataset_info.json
  (LLaMA-Factory's `media_dir`, which defaults to its `dataset_dir`).

Example (the rows in the_cauldron's schema are those of the sharegpt file as mmdp reads it):

    "mllm_demo": {"file_name": "mllm_demo.json", "formatting": "sharegpt",
                  "columns": {"messages": "messages", "images": "images"},
                  "tags": {"role_tag": "role", "content_tag": "content",
                           "user_tag": "user", "assistant_tag": "assistant"}}

What an entry holds that mmdp cannot train on as LLaMA-Factory would (preference pairs, a
tools column, audio, num_samples' random subset, a ModelScope dataset or a loading script) is
refused in one sentence, never read otherwise.
"""

import dataclasses
import json
from pathlib import Path

from mmdp.errors import UserError

INFO_FILE = "dataset_info.json"  # LLaMA-Factory's name for it (DATA_CONFIG)
FORMATTINGS = ("alpaca", "sharegpt")
# LLaMA-Factory's column and tag keys, and the ones mmdp refuses (with why)
COLUMN_KEYS = ("prompt", "query", "response", "history", "messages", "system", "images", "videos")
TAG_KEYS = (
    "role_tag",
    "content_tag",
    "user_tag",
    "assistant_tag",
    "observation_tag",
    "function_tag",
    "system_tag",
)
REFUSED_COLUMNS = {
    "tools": "mmdp packs no tool descriptions (LLaMA-Factory puts them in the system prompt)",
    "audios": "mmdp reads images and videos, not audio",
    "chosen": "mmdp packs supervised conversations, not preference pairs",
    "rejected": "mmdp packs supervised conversations, not preference pairs",
    "kto_tag": "mmdp packs supervised conversations, not KTO labels",
}
# Where an entry's rows are, in the order LLaMA-Factory looks (parser.get_dataset_list)
LOCATION_KEYS = (
    "hf_hub_url",
    "ms_hub_url",
    "om_hub_url",
    "script_url",
    "cloud_file_name",
    "file_name",
)


@dataclasses.dataclass(frozen=True)
class Entry:
    """A LLaMA-Factory dataset entry's columns and tags, resolved as its DatasetAttr resolves
    them: the defaults, or, when the entry gives `columns` (`tags`), exactly those it names."""

    formatting: str = "alpaca"
    # alpaca
    prompt: str | None = "instruction"
    query: str | None = "input"
    response: str | None = "output"
    history: str | None = None
    # sharegpt
    messages: str | None = "conversations"
    role_tag: str | None = "from"
    content_tag: str | None = "value"
    user_tag: str | None = "human"
    assistant_tag: str | None = "gpt"
    observation_tag: str | None = "observation"
    function_tag: str | None = "function_call"
    system_tag: str | None = "system"
    # both
    system: str | None = None
    images: str | None = None
    videos: str | None = None

    def named_columns(self) -> set[str]:
        """The columns the entry reads: each must be a column of its rows."""
        keys = ("messages",) if self.formatting == "sharegpt" else COLUMN_KEYS[:4]
        keys += ("system", "images", "videos")
        return {getattr(self, key) for key in keys} - {None}

    def as_messages(self, row: dict) -> dict:
        """One row of the entry as a messages row (mmdp.data.reading.formats).

        >>> Entry().as_messages({"instruction": "Name it.", "input": "<image>", "output": "A cat."})
        {'messages': [{'role': 'user', 'content': 'Name it.\\n<image>'}, {'role': 'assistant', 'content': 'A cat.'}], 'system': None, 'images': None, 'videos': None}
        """
        if self.formatting == "sharegpt":
            messages, system = self.sharegpt_turns(row)
        else:
            messages, system = self.alpaca_turns(row), self.column(row, self.system)
        return {
            "messages": messages,
            "system": system or None,  # "" is no system prompt: the template's own
            "images": self.column(row, self.images),
            "videos": self.column(row, self.videos),
        }

    @staticmethod
    def column(row: dict, name: str | None):
        return row.get(name) if name else None

    def alpaca_turns(self, row: dict) -> list[dict]:
        """history's pairs, then prompt and query joined by a newline, and the response (a
        row without a string response is LLaMA-Factory's unsupervised one: a question with no
        reply, counted as empty_reply)."""
        messages = []
        history = self.column(row, self.history)
        for pair in history if isinstance(history, list) else []:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                return []  # not [question, reply] pairs: no turns, counted as no_texts
            messages += [
                {"role": "user", "content": pair[0]},
                {"role": "assistant", "content": pair[1]},
            ]
        query = [row.get(name) for name in (self.prompt, self.query) if name and row.get(name)]
        messages.append({"role": "user", "content": "\n".join(query)})
        response = self.column(row, self.response)
        if isinstance(response, str):
            messages.append({"role": "assistant", "content": response})
        return messages

    def sharegpt_turns(self, row: dict) -> tuple[list[dict], str | None]:
        """(the messages, the system prompt): a first message of system_tag is the system
        prompt, else the system column; the rest must alternate user (or a tool's
        observation), reply (or function call), ending on a reply, or the row has no turns."""
        messages = [m if isinstance(m, dict) else {} for m in self.column(row, self.messages) or []]
        roles = {
            self.user_tag: "user",
            self.assistant_tag: "assistant",
            self.observation_tag: "observation",  # a tool's turn: a role mmdp does not know
            self.function_tag: "function_call",
            self.system_tag: "system",
        }
        roles.pop(None, None)
        if self.system_tag and messages and messages[0].get(self.role_tag) == self.system_tag:
            system, messages = messages[0].get(self.content_tag), messages[1:]
        else:
            system = self.column(row, self.system)
        asks = {self.user_tag, self.observation_tag} - {None}
        answers = {self.assistant_tag, self.function_tag} - {None}
        said = [message.get(self.role_tag) for message in messages]
        if len(said) % 2 or any(role not in (asks, answers)[k % 2] for k, role in enumerate(said)):
            return [], system  # LLaMA-Factory skips the row: no turns, counted as no_texts
        turns = [
            {"role": roles[role], "content": message.get(self.content_tag)}
            for role, message in zip(said, messages)
        ]
        return turns, system


@dataclasses.dataclass(frozen=True)
class Location:
    """Where an entry's rows are: local files (`files`, all JSON or all parquet), a remote
    file (`url`), or a Hub dataset (`hub`, with its subset, split and folder)."""

    files: tuple[str, ...] = ()
    url: str | None = None
    hub: str | None = None
    subset: str | None = None
    split: str = "train"
    folder: str | None = None


def entry_spec(dataset: str, name: str | None) -> tuple[str, str | None] | None:
    """(the dataset_info.json, the entry's name) when `dataset` names an entry: "FILE.json:NAME",
    a file named dataset_info.json (its entry named by `name`), or any .json file with `name`;
    None otherwise.

    >>> entry_spec("data/dataset_info.json:mllm_demo", None), entry_spec("train.json", None)
    (('data/dataset_info.json', 'mllm_demo'), None)
    >>> entry_spec("s3://bucket/dataset_info.json", "demo")
    ('s3://bucket/dataset_info.json', 'demo')
    """
    path, colon, after = dataset.rpartition(":")
    if colon and path.endswith(".json") and after and "/" not in after:
        if name is not None and name != after:
            raise UserError(f"dataset {dataset!r} names the entry {after!r}, and name= {name!r}")
        return path, after
    if name is not None or dataset.rsplit("/", 1)[-1] == INFO_FILE:
        if not dataset.endswith(".json"):
            raise UserError(
                f"name={name!r} names an entry of LLaMA-Factory's {INFO_FILE}; "
                f"{dataset!r} is not a .json file"
            )
        return dataset, name
    return None


def read_info(path: str) -> dict:
    """A dataset_info.json's entries (local or remote), or one sentence."""
    import fsspec

    try:
        with fsspec.open(path, "rt", encoding="utf-8") as file:
            info = json.load(file)
    except FileNotFoundError:
        raise UserError(f"dataset {path!r}: no such file") from None
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: not JSON ({error})") from None
    if not isinstance(info, dict):
        raise UserError(f"{path}: LLaMA-Factory's {INFO_FILE} holds an object of entries")
    return info


def looks_like_entries(path: Path) -> bool:
    """Whether a local JSON file holds LLaMA-Factory's entries (a save_to_disk folder's
    dataset_info.json describes a table: its values are not entries naming where rows are)."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(info, dict)
        and bool(info)
        and all(isinstance(v, dict) and set(LOCATION_KEYS) & set(v) for v in info.values())
    )


def read_entry(path: str, name: str | None) -> tuple[Entry, Location]:
    """The entry `name` of the dataset_info.json at `path`: how to read its rows, and where
    they are (a relative file_name is beside the file)."""
    info = read_info(path)
    names = ", ".join(info) or "(none)"
    if name is None:
        raise UserError(
            f"{path} describes datasets by name: give one, --dataset {path}:NAME "
            f"(name= in Python); its datasets: {names}"
        )
    if name not in info:
        raise UserError(f"{path} has no dataset {name!r}; its datasets: {names}")
    spec = info[name]
    where = f"dataset {name!r} of {path}"
    if not isinstance(spec, dict):
        raise UserError(f"{where} is a {type(spec).__name__}, not an object")
    return entry_of(spec, where), location_of(spec, path.rpartition("/")[0] or ".", where)


def entry_of(spec: dict, where: str) -> Entry:
    """An entry's columns and tags (LLaMA-Factory's DatasetAttr.join), or one sentence for what
    mmdp would not read as LLaMA-Factory does."""
    if spec.get("ranking"):
        raise UserError(f"{where} is a ranking (preference) dataset; {REFUSED_COLUMNS['chosen']}")
    if spec.get("num_samples") is not None:
        raise UserError(
            f"{where} takes num_samples rows at random, which mmdp does not; remove it "
            "(--num-rows N reads the first N rows)"
        )
    formatting = spec.get("formatting", "alpaca")
    if formatting not in FORMATTINGS:
        raise UserError(
            f"{where} has formatting {formatting!r}: mmdp reads {' and '.join(FORMATTINGS)} "
            "entries (a file of role/content messages it reads as it is: --dataset FILE)"
        )
    fields = {"formatting": formatting}
    for group, keys in (("columns", COLUMN_KEYS), ("tags", TAG_KEYS)):
        given = spec.get(group)
        if given is None:
            continue
        if not isinstance(given, dict):
            raise UserError(f"{where}: {group} is a {type(given).__name__}, not an object")
        for key, value in given.items():
            if key in REFUSED_COLUMNS and value is not None:
                raise UserError(f"{where} names a {key} column: {REFUSED_COLUMNS[key]}")
            if key not in keys and key not in REFUSED_COLUMNS:
                raise UserError(
                    f"{where}: {group} has {key!r}, which LLaMA-Factory does not read "
                    f"(it reads {', '.join(keys)})"
                )
            if value is not None and not isinstance(value, str):
                raise UserError(f"{where}: {group}' {key} is {value!r}, not a name")
        # as LLaMA-Factory's DatasetAttr.join: given, the group is the whole list
        fields.update({key: given.get(key) for key in keys})
    entry = Entry(**fields)
    if formatting == "sharegpt" and not (entry.messages and entry.role_tag and entry.content_tag):
        raise UserError(
            f"{where}: a sharegpt entry names its messages column, role and content tags"
        )
    if formatting == "alpaca" and not ((entry.prompt or entry.query) and entry.response):
        raise UserError(
            f"{where}: an alpaca entry names its prompt (or query) and response columns"
        )
    return entry


def location_of(spec: dict, folder: str, where: str) -> Location:
    """Where an entry's rows are, looked for as LLaMA-Factory looks (a Hub URL first)."""
    if "hf_hub_url" in spec:
        return Location(
            hub=spec["hf_hub_url"],
            subset=spec.get("subset"),
            split=spec.get("split") or "train",
            folder=spec.get("folder"),
        )
    for key, what in (
        ("ms_hub_url", "a ModelScope dataset"),
        ("om_hub_url", "a Modelers dataset"),
        ("script_url", "a loading script"),
    ):
        if key in spec:
            raise UserError(
                f"{where} is {what} ({key}), which mmdp does not read; download its files and "
                "name them in file_name"
            )
    if "cloud_file_name" in spec:
        return Location(url=spec["cloud_file_name"])
    if "file_name" not in spec:
        raise UserError(f"{where} names no file_name (nor hf_hub_url, cloud_file_name)")
    from mmdp.data.files import is_remote

    if is_remote(folder):
        return Location(url=f"{folder}/{spec['file_name']}")
    return Location(files=data_files(Path(folder) / spec["file_name"], where))


def data_files(path: Path, where: str) -> tuple[str, ...]:
    """An entry's file, or a folder's files (not its subfolders', as LLaMA-Factory): all JSON
    and JSON Lines, or all parquet."""
    path = path.expanduser().resolve()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    elif path.is_file():
        files = [path]
    else:
        raise UserError(f"{where}: file_name {str(path)!r}: no such file or directory")
    kinds = {"json" if p.suffix in (".json", ".jsonl") else p.suffix.lstrip(".") for p in files}
    if kinds - {"json", "parquet"} or len(kinds) != 1:
        raise UserError(
            f"{where}: file_name {str(path)!r} holds {', '.join(sorted(kinds)) or 'no files'}: "
            "mmdp reads JSON, JSON Lines or parquet files (one kind)"
        )
    return tuple(map(str, files))


# ms-swift's --columns -----------------------------------------------------------------------


def renames_of(columns) -> dict[str, str]:
    """`columns` (ms-swift's --columns: {"old": "new"}, or its JSON) as a checked dict.

    >>> renames_of('{"conv": "conversations", "img": "image"}')
    {'conv': 'conversations', 'img': 'image'}
    """
    if columns is None:
        return {}
    if isinstance(columns, str):
        try:
            columns = json.loads(columns)
        except json.JSONDecodeError as error:
            raise UserError(f"--columns {columns!r}: not JSON ({error})") from None
    if not isinstance(columns, dict) or not all(
        isinstance(old, str) and isinstance(new, str) for old, new in columns.items()
    ):
        raise UserError(
            f"--columns {columns!r}: a JSON object of old: new column names, e.g. "
            '\'{"conv": "conversations"}\''
        )
    if len(set(columns.values())) < len(columns):
        raise UserError(f"--columns {columns!r} renames two columns to one name")
    return dict(columns)


def renamed(row: dict, renames: dict[str, str], where: str) -> dict:
    """A row with its columns renamed (old: new); a new name the row has already, unless it
    is renamed away too, is one sentence.

    >>> renamed({"conv": [], "img": "a.png"}, {"conv": "conversations", "img": "image"}, "rows")
    {'conversations': [], 'image': 'a.png'}
    """
    for old, new in renames.items():
        if old in row and new in row and new not in renames:
            raise UserError(f"--columns renames {old!r} to {new!r}, a column {where} has already")
    kept = {key: value for key, value in row.items() if key not in renames}
    return {**kept, **{new: row[old] for old, new in renames.items() if old in row}}


def check_named(named, columns, where: str, by: str = "--columns") -> None:
    """One sentence when a column the map names is none of the rows' `columns`."""
    missing = sorted(set(named) - set(columns))
    if missing:
        raise UserError(
            f"{by} names the column(s) {', '.join(map(repr, missing))}, which {where} does not "
            f"have (its columns: {', '.join(sorted(columns)) or 'none'})"
        )
