"""What the README and docs/ quote, read back so that tests can hold it to the code.

A quoted output is a fence with no language right after a ```bash fence: the output of the first
`uv run` command of that bash block. Writing one, four conventions:

- a number that varies by machine (seconds, rates) is written with a `~` before it: `~10.8 s`;
- a run of spaces reads as one, so a table keeps its columns where a `~` number is wider or
  narrower on another machine (write the `~` in place of a space to keep the quote aligned);
- a line `...` stands for any number of lines left out;
- a block may start and end anywhere in the output: each stretch between `...` lines must appear
  in the run's output, line for line, in order.

A test that runs a quoted command calls `check_output(command, argv, out)`. When the run is the
quoted command itself (give or take --out-dir, --metrics-json and --save-batch, whose values the
check reads as the docs' own), every line must be the same but the `~` numbers: an exact check.
When the run is smaller or otherwise different (the default suite runs stage 5 on 400 rows, not
2,000), the check is of the template: every number and every settings value may differ, the
words, names, keys and line order may not. Either way the failure names the doc, its line and the
differing lines, and says how to update the block.

Every quoted output is listed in CHECKED (which test checks it) or UNCHECKED (why none does):
tests/test_docs.py fails on a block in neither, so a new block cannot go unchecked unnoticed.
"""

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)\s*$")
SKIP = "..."
NUMBER = re.compile(r"\d(?:[\d,]*\d)?(?:\.\d+)?(?:e[+-]?\d+)?")  # 2,000 / 98.8 / 4e-08
VARYING = re.compile(r"~(" + NUMBER.pattern + ")")
ANY_NUMBER = "\x00"  # what a ~number becomes while comparing
HASH = re.compile(r"\b[0-9a-f]{12,}\b")  # a cache key: its rows' fingerprint
# Flags that only say where a run writes: a run given them is still the quoted command. Each
# flag's setting (in a `settings:` line) and the line it adds to the output, if any.
OUTPUT_FLAGS = {
    "--out-dir": ("out_dir", None),
    "--metrics-json": ("metrics_json", "Wrote the epoch report to "),
    "--save-batch": ("save_batch", "Saved the first batch to "),
}

# Which test checks each quoted output (its command, as quoted), exactly or as a template.
CHECKED = {
    "uv run 01_check_dataset.py --seed 5": "test_stage_scripts.py::test_stage1 (exact)",
    "uv run 02_naive_pad_dataloader.py": "test_stage_scripts.py (template; exact: -m slow)",
    "uv run 03_constrained_pad_dataloader.py": "test_stage_scripts.py (template; exact: -m slow)",
    "uv run 03_constrained_pad_dataloader.py --group-by modality_length": (
        "test_stage_scripts.py (template; exact: -m slow)"
    ),
    "uv run 04_knapsack_toy.py": "test_stage_scripts.py::test_stage4 (exact)",
    "uv run 05_knapsack_multimodal.py": "test_stage_scripts.py (template; exact: -m slow)",
    "uv run examples/pack_mixture.py --mixture examples/mixture.json": (
        "test_stage_scripts.py (exact: -m slow)"
    ),
    "uv run torchrun --standalone --nproc_per_node 2 05_knapsack_multimodal.py --metrics-json "
    "/tmp/05.json": "test_stage_scripts.py (template: -m slow)",
    "uv run torchrun --standalone --nproc_per_node 2 03_constrained_pad_dataloader.py --group-by "
    "modality_length": "test_stage_scripts.py (template: -m slow)",
    "uv run -m mmdp.prepare --out /tmp/prepared/synthetic": "test_prepared.py (template)",
    "uv run examples/pack_prepared.py --prepared /tmp/prepared/synthetic": (
        "test_prepared.py (template: -m slow)"
    ),
    "uv run examples/pack_prepared.py --prepared /tmp/prepared/synthetic --max-length 256": (
        "test_prepared.py (template)"
    ),
    "uv run 01_check_dataset.py --dataset train.jsonl --row 0": (
        "test_formats.py::test_format_stage1_shows_a_users_row_with_each_images_place (exact)"
    ),
    "uv run 05_knapsack_multimodal.py --dataset train.jsonl --model qwen2_5_vl": (
        "test_formats.py::test_format_stage5_packs_a_users_rows_and_counts_every_drop_by_reason "
        "(template: -m slow)"
    ),
    "uv run 02_naive_pad_dataloader.py --dataset HuggingFaceM4/the_cauldron --subset ai2d": (
        "test_stage_scripts.py (exact, no name resolves)"
    ),
    # the commands of the figures (tools/figures.py --check: tests/test_figures.py, -m slow)
    "uv run 05_knapsack_multimodal.py --model qwen2_5_vl": "test_figures.py (exact: -m slow)",
    "uv run 06_packing_pays_off.py": "test_figures.py (exact: -m slow)",
}
# Quoted outputs no test runs, and why.
UNCHECKED = {
    "uv run --extra s3 moto_server -p 5077 &": "an S3 server and a torchrun job; "
    "test_prepared.py reads the same prepared dataset from a moto server",
    "uv run torchrun --standalone --nproc_per_node 2 examples/pack_streaming.py": (
        "2 ranks x 2 workers over 2,000 rows; test_streaming.py runs examples/pack_streaming.py "
        "under torchrun on unequal shards of 152 rows (-m slow)"
    ),
    "uv run torchrun --nproc-per-node 2 examples/trainer.py --model qwen3_vl_moe --lora "
    "--videos 24 --num-rows 120 --num-train-epochs 3 --grad-accum 16 --eval-ratio 0.1 "
    "--output-dir /tmp/seed --log-samples /tmp/seed/samples.jsonl": (
        "a 6.5-minute torchrun run of Qwen3-VL-MoE; test_seed_run.py runs the same flags "
        "(tests/torchrun_seed.py) and checks its log and eval split (-m slow)"
    ),
}


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence, from 1
    language: str
    lines: tuple[str, ...]
    command: str | None = None  # an output block's: the bash block's first `uv run`

    def where(self, line: int | None = None) -> str:
        doc = self.doc.relative_to(ROOT) if self.doc.is_relative_to(ROOT) else self.doc
        return f"{doc}:{self.line if line is None else line}"


def blocks(doc: Path) -> list[Block]:
    """Every fenced block of a markdown file; an output block knows its command."""
    found, current, previous_end = [], None, None
    text = doc.read_text().splitlines()
    for number, line in enumerate(text, 1):
        fence = FENCE.match(line)
        if not fence:
            if current is not None:
                current[2].append(line.rstrip())
            continue
        if current is None:
            current = (number, fence[1], [])
            continue
        start, language, lines = current
        command = None
        if not language and found and previous_end == start - 1 and found[-1].language == "bash":
            command = first_command(found[-1].lines)
        found.append(Block(doc, start, language, tuple(lines), command))
        current, previous_end = None, number
    return found


def first_command(lines) -> str | None:
    """The first `uv run ...` of a bash block, its continuation lines joined, comment dropped."""
    text = "\n".join(lines).replace("\\\n", " ")
    for line in text.splitlines():
        line = line.split(" # ")[0].split("  #")[0].strip()
        if line.startswith("uv run "):
            return " ".join(line.split())
    return None


def output_blocks() -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc) if b.command is not None]


def script_words(command: str) -> list[str]:
    """The words from the script (or `-m module`) on: what the script's parser sees, and it."""
    words = shlex.split(command)
    for i, word in enumerate(words):
        if word.endswith(".py") or (word == "-m" and words[i + 1].startswith("mmdp")):
            return words[i:]
    raise ValueError(f"no script in {command!r}")


def flag_values(words: list[str]) -> dict[str, str | None]:
    flags, i = {}, 0
    while i < len(words):
        if words[i].startswith("--"):
            has_value = i + 1 < len(words) and not words[i + 1].startswith("--")
            flags[words[i]] = words[i + 1] if has_value else None
            i += 2 if has_value else 1
        else:
            i += 1
    return flags


def is_the_quoted_run(command: str, argv: list[str]) -> tuple[bool, set[str]]:
    """(whether argv, the script and its arguments, runs `command` itself; the output-only flags
    it gives otherwise than the quoted command)."""
    words = script_words(command)
    script = words[:2] if words[0] == "-m" else words[:1]
    quoted, ran = flag_values(words), flag_values(list(argv))
    extra = {flag for flag in ran if quoted.get(flag, object()) != ran[flag]}
    same = list(argv[: len(script)]) == script and set(quoted) <= set(ran)
    return same and extra <= set(OUTPUT_FLAGS), {flag for flag in extra if flag in OUTPUT_FLAGS}


def normalise(line: str, *, template: bool, masked_settings: set[str]) -> str:
    line = VARYING.sub(ANY_NUMBER, line)
    if line.startswith("settings: "):
        pairs = [pair.split("=", 1) for pair in line[len("settings: ") :].split(", ")]
        line = "settings: " + ", ".join(
            f"{key}=" + ("*" if template or key in masked_settings else value)
            for key, value in pairs
        )
    if template:
        line = HASH.sub("*", line)
        line = NUMBER.sub("#", line).replace(ANY_NUMBER, "#")
    return " ".join(line.split())


def matches(quoted: str, printed: str) -> bool:
    """A quoted line (normalised: ANY_NUMBER for a varying number) against a printed one."""
    if ANY_NUMBER not in quoted:
        return quoted == printed
    pattern = f"(?:{NUMBER.pattern})".join(map(re.escape, quoted.split(ANY_NUMBER)))
    return re.fullmatch(pattern, printed) is not None


def compare(block: Block, out: str, *, template: bool, masked_settings: set[str]) -> list[str]:
    """What differs: [] when every stretch of the block appears in `out`, in order."""
    norm = lambda line: normalise(line, template=template, masked_settings=masked_settings)  # noqa: E731
    printed = [norm(line.rstrip()) for line in out.splitlines()]
    stretches, stretch = [], []
    for offset, line in enumerate(block.lines):
        if line.strip() == SKIP:
            stretches.append(stretch)
            stretch = []
        else:
            stretch.append((block.line + 1 + offset, norm(line)))
    stretches.append(stretch)
    at = 0
    for stretch in filter(None, stretches):
        found = next(
            (
                start
                for start in range(at, len(printed) - len(stretch) + 1)
                if all(matches(q, printed[start + i]) for i, (_, q) in enumerate(stretch))
            ),
            None,
        )
        if found is None:
            return closest_difference(block, stretch, printed, at)
        at = found + len(stretch)
    return []


def closest_difference(block, stretch, printed, at) -> list[str]:
    """The stretch's lines against the printed lines where most of them agree."""
    best, _ = best_window([quoted for _, quoted in stretch], printed, at)
    window = printed[best : best + len(stretch)] + [""] * len(stretch)
    return [
        f"  {block.where(line)}\n    quoted:  {quoted}\n    printed: {got}"
        for (line, quoted), got in zip(stretch, window)
        if not matches(quoted, got)
    ]


def as_quoted(
    command: str, argv: list[str], out: str, paths: dict[str, str] | None = None
) -> tuple[str, bool, set[str]]:
    """A run's output as the docs write it (`paths`: printed paths to read as the docs write
    them, a test's folder as `assets`...; the run's cache as ~/.cache/mmdp), whether the run is
    the quoted command itself (an exact check), and the settings its output-only flags mask."""
    cache = os.environ.get("MMDP_CACHE", os.path.expanduser("~/.cache/mmdp"))  # config's default
    replacements = {cache: "~/.cache/mmdp", **(paths or {})}
    for path, shown in sorted(replacements.items(), key=lambda item: -len(item[0])):
        out = out.replace(path, shown)
    # what only a run on an empty cache prints: the docs quote a run after stage 1's
    out = re.sub(r"(?m)^Generating the synthetic .* \(once\)\n", "", out)
    # a cache hit says it loaded the weights, a fresh run that it weighed them: the same fact
    out = re.sub(
        r"Weighed ([\d,]+) of \1 rows here in (\S+) s",
        r"Loaded the weights of \1 rows in \2 s",
        out,
    )
    exact, output_flags = is_the_quoted_run(command, argv)
    masked = {OUTPUT_FLAGS[flag][0] for flag in output_flags}
    quoted_flags = flag_values(script_words(command))
    added = tuple(  # the lines a flag the quoted command lacks adds
        OUTPUT_FLAGS[flag][1]
        for flag in output_flags
        if OUTPUT_FLAGS[flag][1] and flag not in quoted_flags
    )
    out = "\n".join(line for line in out.splitlines() if not (added and line.startswith(added)))
    return out, exact, masked


def quoted_blocks(command: str) -> list[Block]:
    quoted = [b for b in output_blocks() if b.command == command]
    assert quoted, f"no doc quotes the output of {command!r} any more: drop it from CHECKED"
    return quoted


def check_output(
    command: str, argv: list[str], out: str, *, paths: dict[str, str] | None = None
) -> str:
    """Assert that every output block quoted for `command` is what this run printed (`out`;
    `argv`: the script and its arguments, as run). `paths`: printed paths to read as the docs
    write them (a test's folder as `assets`...); the run's cache is read as ~/.cache/mmdp.
    Returns "exact" or "template": how it was checked."""
    assert command in CHECKED, f"{command!r}: add it to tests/doc_blocks.py CHECKED"
    quoted = quoted_blocks(command)
    out, exact, masked = as_quoted(command, argv, out, paths)
    wrong = []
    for block in quoted:
        differences = compare(block, out, template=not exact, masked_settings=masked)
        if differences:
            wrong.append(f"{block.where()} quotes `{command}`:\n" + "\n".join(differences))
    how = "exact" if exact else "template (numbers and settings values aside)"
    assert not wrong, (
        f"the docs' quoted output differs from this run's ({how} check):\n"
        + "\n".join(wrong)
        + f"\nUpdate the block from a fresh `{command}` (a number that varies by machine: write "
        "it as ~12.3; a line of ... skips lines): tests/doc_blocks.py explains the conventions."
    )
    return "exact" if exact else "template"


def refresh_output(
    command: str, argv: list[str], out: str, *, paths: dict[str, str] | None = None
) -> list[str]:
    """Rewrite, in the docs, each quoted line of `command`'s output that this run (the quoted
    command itself) printed otherwise, keeping the `~` marks and `...` lines. A stretch between
    `...` lines stands for the printed lines where most of its lines agree as a template does
    (numbers aside); a stretch agreeing nowhere is left alone. Returns what changed,
    "README.md:405\n  was: ...\n  now: ...", and a line for each stretch left for a person."""
    out, exact, masked = as_quoted(command, argv, out, paths)
    assert exact, f"{argv} is not the quoted run of {command!r}: its output cannot replace it"
    raw = [line.rstrip() for line in out.splitlines()]
    changes = []
    for block in quoted_blocks(command):
        text = block.doc.read_text().split("\n")
        at, stretches = 0, [[]]
        for offset, line in enumerate(block.lines):
            if line.strip() == SKIP:
                stretches.append([])
            else:
                stretches[-1].append((block.line + 1 + offset, line))
        for stretch in filter(None, stretches):
            lines = [line for _, line in stretch]
            start, agree = place(lines, raw, at, masked)
            if agree < len(lines) / 2:
                changes.append(
                    f"{block.where(stretch[0][0])}: these {len(lines)} quoted lines are nowhere "
                    "in the output, numbers aside: update them by hand"
                )
                continue
            exact_lines = [
                normalise(line, template=False, masked_settings=masked) for line in lines
            ]
            for (number, line), quoted, printed in zip(stretch, exact_lines, raw[start:]):
                if not matches(quoted, normalise(printed, template=False, masked_settings=masked)):
                    text[number - 1] = marked_as(line, printed)
                    changes.append(
                        f"{block.where(number)}\n  was: {line}\n  now: {text[number - 1]}"
                    )
            at = start + len(lines)
        if text != block.doc.read_text().split("\n"):
            block.doc.write_text("\n".join(text))
    return changes


def place(lines: list[str], raw: list[str], at: int, masked: set[str]) -> tuple[int, int]:
    """Where in the printed `raw` lines, from `at` on, a quoted stretch stands: its exact place,
    else where most of its lines agree as templates; and how many agree there."""
    exact = [normalise(line, template=False, masked_settings=masked) for line in raw]
    quoted = [normalise(line, template=False, masked_settings=masked) for line in lines]
    start, agree = best_window(quoted, exact, at)
    if agree == len(lines):
        return start, agree
    template = [normalise(line, template=True, masked_settings=masked) for line in raw]
    quoted = [normalise(line, template=True, masked_settings=masked) for line in lines]
    start, agree = best_window(quoted, template, at)
    return start, agree if start + len(lines) <= len(raw) else 0


def best_window(quoted: list[str], printed: list[str], at: int) -> tuple[int, int]:
    """(where in `printed`, from `at` on, the most of the `quoted` lines agree; how many do)."""
    best, best_score = at, -1
    for start in range(at, max(at + 1, len(printed) - len(quoted) + 1)):
        window = printed[start : start + len(quoted)]
        score = sum(matches(q, p) for q, p in zip(quoted, window))
        if score > best_score:
            best, best_score = start, score
    return best, best_score


def marked_as(quoted: str, printed: str) -> str:
    """`printed`, with a `~` before each number that `quoted` marks as varying (the same place:
    the k-th number of the line); in place of a space where two stand before it, so that a
    table's columns stay aligned.

    >>> marked_as("rate   ~1,100 packs/s, 4 packs", "rate  12,345 packs/s, 5 packs")
    'rate ~12,345 packs/s, 5 packs'
    """
    marked = {i for i, m in enumerate(NUMBER.finditer(quoted)) if quoted[: m.start()].endswith("~")}
    pieces, end = [], 0
    for i, m in enumerate(NUMBER.finditer(printed)):
        before = printed[end : m.start()]
        if i in marked and not before.endswith("~"):
            before = (before[:-1] if before.endswith("  ") else before) + "~"
        pieces += [before, m[0]]
        end = m.end()
    return "".join(pieces) + printed[end:]


# Tables ----------------------------------------------------------------------------------------

MANUAL = ROOT / "docs" / "use-in-your-trainer.md"
REAL_VLMS = ROOT / "docs" / "real-vlms.md"
CODE = re.compile(r"`([^`]+)`")


def table(doc: Path, header: str) -> list[list[str]]:
    """The rows (cells, stripped) of the table whose header line starts with `header`."""
    lines = doc.read_text().split("\n" + header, 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines]


def names(cell: str) -> list[str]:
    """The names a cell writes as code, without what follows them (`pixel_values [N, 3]`)."""
    return [re.split(r"[\s\[(]", name, maxsplit=1)[0] for name in CODE.findall(cell)]


def quoted_drop_reasons() -> list[str]:
    """The reasons docs/use-in-your-trainer.md's bad-input table counts (not `converted`)."""
    rows = table(MANUAL, "| Row | Outcome | Reason counted |")
    return [name for row in rows for name in names(row[2]) if name != "converted"]


def contract_table() -> dict[str, str]:
    """docs/use-in-your-trainer.md's batch contract: each key and what the table says of it."""
    rows = table(MANUAL, "| Key | Shape | What |")
    return {key: row[2] for row in rows for key in names(row[0])}


def contract_keys(*, every_batch: bool) -> set[str]:
    """The contract's keys; with every_batch, those every packed batch carries (a key only some
    batches carry says so first: "streamed batches only: ...")."""
    return {
        key
        for key, what in contract_table().items()
        if not (every_batch and re.match(r"[^:]* only:", what))
    }


def family_keys(family: str) -> set[str]:
    """The keys docs/real-vlms.md's table says a family's packed batch adds: the names in its
    "vision inputs" cell before any `;` (after it: what model_inputs adds)."""
    rows = table(REAL_VLMS, "| family (`--model`) |")
    cells = {names(row[0])[0]: row[2] for row in rows}
    return set(names(cells[family].split(";")[0]))


def quoted_batch_keys(family: str) -> set[str]:
    """Every key the docs say a planned batch of `family` ("tiny": TinyVLM) carries."""
    real = {"model_family", "model_settings"} if family != "tiny" else set()
    return contract_keys(every_batch=True) | family_keys(family) | real


# docs/real-vlms.md's names for the families whose default budgets it lists
BUDGET_NAMES = {
    "Qwen": ("qwen2_5_vl", "qwen3_vl"),
    "LLaVA-OneVision": ("llava_onevision",),
    "Gemma 3": ("gemma3",),
    "SmolVLM": ("smolvlm",),
}


def quoted_default_budgets() -> dict[str, tuple[int, int]]:
    """(max_length, max_patches) per family, as docs/real-vlms.md lists them: "Default budgets
    per family (...): Qwen 2,048 / 8,192; LLaVA-OneVision 10,240 / 26,973 (...); ..."."""
    text = " ".join(REAL_VLMS.read_text().split())
    listed = text.split("Default budgets per family", 1)[1].split(":", 1)[1].split(". ")[0]
    budgets = {}
    for name, families in BUDGET_NAMES.items():
        found = re.search(rf"{re.escape(name)} ([\d,]+) / ([\d,]+)", listed)
        for family in families:
            budgets[family] = tuple(int(n.replace(",", "")) for n in found.groups())
    return budgets
