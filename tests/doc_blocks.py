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
So is every quoted command line: what it runs is in RUN (the test that runs it at some size), or
the command is in NOT_RUN (why no test runs it: the network, a GPU, a server, hours).
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
    "uv run examples/group_by_length.py": "test_stage_scripts.py (template; exact: -m slow)",
    "uv run 04_knapsack_toy.py": "test_stage_scripts.py::test_stage4 (exact)",
    "uv run 05_knapsack_multimodal.py": "test_stage_scripts.py (template; exact: -m slow)",
    "uv run examples/pack_mixture.py --mixture examples/mixture.json": (
        "test_stage_scripts.py (exact: -m slow)"
    ),
    "uv run torchrun --standalone --nproc_per_node 2 examples/pack_planned.py --metrics-json "
    "/tmp/05.json": "test_stage_scripts.py (template: -m slow)",
    "uv run torchrun --standalone --nproc_per_node 2 examples/group_by_length.py": (
        "test_stage_scripts.py (template: -m slow)"
    ),
    "uv run -m mmdp.prepare --out /tmp/prepared/synthetic": "test_prepared.py (template)",
    "uv run --extra ray -m mmdp.prepare --engine ray --out /tmp/prepared/ray": (
        "test_prepare_on_ray.py (template: -m slow)"
    ),
    "uv run examples/pack_prepared.py --prepared /tmp/prepared/synthetic": (
        "test_prepared.py (template: -m slow)"
    ),
    "uv run examples/pack_prepared.py --prepared /tmp/prepared/synthetic --max-length 256": (
        "test_prepared.py (template)"
    ),
    "uv run 01_check_dataset.py --dataset train.jsonl --row 0": (
        "test_formats.py::test_format_stage1_shows_a_users_row_with_each_images_place (exact)"
    ),
    "uv run examples/pack_planned.py --dataset train.jsonl --model qwen2_5_vl": (
        "test_formats.py::test_format_the_planned_loader_packs_a_users_rows_and_counts_every_"
        "drop_by_reason (template: -m slow)"
    ),
    "uv run 02_naive_pad_dataloader.py --dataset HuggingFaceM4/the_cauldron --subset ai2d": (
        "test_stage_scripts.py (exact, no name resolves)"
    ),
    # the commands of the figures (tools/figures.py --check: tests/test_figures.py, -m slow)
    "uv run examples/pack_planned.py --model qwen2_5_vl": "test_figures.py (exact: -m slow)",
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

# Quoted commands -------------------------------------------------------------------------------
# Every command line the README and docs/ quote: each line of a ```bash block (a `\` continuation
# joined to it, a `# comment` dropped) and each inline code span that starts with a launcher
# (`uv`, `python`, `torchrun`, `bash`, `pip`, or an environment setting before one of them);
# `uv run` or `torchrun` alone, or before `...`, names the launcher, not a command. A command is
# covered (tests/test_docs.py) when its whole text is in NOT_RUN or RUN, or else when what it runs
# (`target`: the script, `-m module` or tool after the launcher and its options, with `torchrun `
# before it when torchrun launches it) is in RUN. A command that needs what a test cannot have
# (NEEDS: a Hub name, an s3:// bucket, a GPU) is covered by its whole text only: the smallest run
# of its script runs none of that.

# What is run (a target, or a whole command), and the test that runs it at some size: FILE::TEST
# (tests/test_bench_and_examples.py::test_smallest_run_ends_on_its_figure: the script's row in
# SMOKE_RUNS), then what the test changes, if anything.
SMOKE = "tests/test_bench_and_examples.py::test_smallest_run_ends_on_its_figure"
STAGES = "tests/test_stage_scripts.py::"
RUN = {
    "bench/bench_train_step.py": "tests/test_bench_train_step.py::"
    "test_the_gpu_preset_runs_on_a_cpu_at_a_small_size (-m slow)",
    "tools/figures.py": "tests/test_figures.py::"
    "test_the_committed_figures_and_quoted_outputs_are_what_a_fresh_run_makes (-m slow)",
    "01_check_dataset.py": STAGES + "test_stage1_saves_the_sample_figure",
    "02_naive_pad_dataloader.py": (
        STAGES + "test_padding_stages_write_figure_and_consistent_metrics"
    ),
    "03_constrained_pad_dataloader.py": (
        STAGES + "test_padding_stages_write_figure_and_consistent_metrics"
    ),
    "04_knapsack_toy.py": STAGES + "test_stage4_prints_the_blogs_packs_and_saves_both_figures",
    "05_knapsack_multimodal.py": (
        STAGES + "test_stage5_packs_with_the_blogs_dataset_and_checks_it_against_packed_dataset"
    ),
    "06_packing_pays_off.py": (
        "tests/test_model_and_strategies.py::test_stage6_runs_and_reports (-m slow)"
    ),
    "examples/pack_planned.py": SMOKE,
    "torchrun examples/pack_planned.py": (
        STAGES + "test_the_planned_loader_under_torchrun_two_ranks_two_workers (-m slow)"
    ),
    "uv run 02_naive_pad_dataloader.py --dataset HuggingFaceM4/the_cauldron --subset ai2d": (
        STAGES + "test_without_a_network_a_hub_dataset_is_the_sentence_the_docs_quote "
        "(no name resolves: the sentence it ends on)"
    ),
    "-m mmdp.prepare": (
        "tests/test_prepared.py::test_pack_prepared_with_another_max_length_exits_2_with_one_sentence"
    ),
    "torchrun -m mmdp.check_ddp": (
        "tests/test_ddp.py::test_packed_ddp_matches_one_process_only_with_tokens_counted_over_all"
        "_ranks (-m slow; its step, in tests/torchrun_trainers.py's launch)"
    ),
    "bench/bench_bad_rows.py": SMOKE,
    "bench/bench_prepare.py": SMOKE,
    "bench/bench_decode_floor.py": SMOKE,
    "bench/bench_decoders.py": SMOKE,
    "bench/bench_families.py": SMOKE,
    "bench/bench_huge_pages.py": SMOKE,
    "bench/bench_jpeg_draft.py": SMOKE,
    "bench/bench_loader_memory.py": SMOKE,
    "bench/bench_loss.py": SMOKE,
    "bench/bench_packing.py": SMOKE,
    "bench/bench_remote.py": SMOKE,
    "bench/bench_scale.py": SMOKE,
    "bench/bench_streaming.py": SMOKE,
    "bench/bench_worker_profile.py": SMOKE,
    "examples/group_by_length.py": SMOKE,
    "torchrun examples/group_by_length.py": (
        STAGES + "test_grouped_under_torchrun_two_ranks (-m slow)"
    ),
    "examples/pack_mixture.py": SMOKE,
    "examples/pack_prepared.py": SMOKE,
    "examples/pack_streaming.py": SMOKE,
    "torchrun examples/pack_streaming.py": (
        "tests/test_streaming.py::test_pack_streaming_under_torchrun_unequal_shards (-m slow)"
    ),
    "torchrun examples/trainer.py": (
        "tests/test_seed_run.py::test_the_seed_users_command_trains_every_row_3_times_with_videos"
        "_and_reports_eval_loss (-m slow; the example's main under tests/torchrun_seed.py)"
    ),
    "torchrun examples/torchrun.py": (
        "tests/test_trainers.py::test_each_way_trains_every_planned_sample_once_per_epoch_and"
        "_resumes_exactly (-m slow; the example's main under tests/torchrun_checks.py)"
    ),
    "torchrun tests/torchrun_matrix.py": (
        "tests/test_trainer_matrix.py::test_every_family_on_every_path_under_torchrun (-m slow)"
    ),
    "pytest": ".ci/run (the suite itself: the default suite, then -m slow)",
    'python -c "import mmdp; print(mmdp.__all__)"': (
        "tests/test_docs.py::test_every_quoted_python_c_runs"
    ),
}
# Commands no test runs, and why: the network, a GPU, a server, minutes of a user's machine.
S3 = "a user's S3 bucket"
INSTALL = "an install: the network (uv.lock's packages)"
RAY_CLUSTER = "a Ray cluster of several machines"
NOT_RUN = {
    "uv run examples/pack_planned.py --processor Qwen/Qwen2.5-VL-7B-Instruct": (
        "the network: the Hub's processor (the offline one, `--model qwen2_5_vl`, is run)"
    ),
    "PYTHONPATH=src python3 bench/bench_loss.py --device cuda": "a GPU; the smoke run is on CPU",
    "PYTHONPATH=src python3 tools/check_hybrid_kernels.py": (
        "a GPU with flash-linear-attention; on a CPU it says so and exits (test_qwen3_5.py)"
    ),
    "uv run --extra s3 05_knapsack_multimodal.py --dataset s3://bucket/train.jsonl --model "
    "qwen3_vl": S3 + "; tests/test_remote.py reads a user's rows from a moto server",
    "uv run --extra s3 05_knapsack_multimodal.py --dataset llava.json --image-root "
    "s3://bucket/coco --model llava_onevision": (
        S3 + "; tests/test_remote.py reads a user's images from a moto server"
    ),
    "uv run --extra s3 moto_server -p 5077 &": "a server on a fixed port, for the three lines "
    "after it; tests/test_prepared.py starts one in the test's process",
    "export AWS_ENDPOINT_URL=http://127.0.0.1:5077 AWS_ACCESS_KEY_ID=testing "
    "AWS_SECRET_ACCESS_KEY=testing": "the moto server's address: tests/test_prepared.py's "
    "s3_bucket fixture sets the same",
    "uv run --extra s3 -m mmdp.prepare --out s3://my-bucket/prepared/synthetic --pretokenize": (
        "a server; tests/test_prepared.py::test_two_ranks_read_from_an_s3_server_weigh_nothing_"
        "and_get_the_batches_of_a_path prepares to a moto server (-m slow)"
    ),
    "uv run --extra s3 torchrun --standalone --nproc_per_node 2 examples/pack_prepared.py "
    "--prepared s3://my-bucket/prepared/synthetic --metrics-json /tmp/05-prepared.json": (
        "a server; the same test reads it on 2 ranks with tests/train_from_prepared.py (-m slow)"
    ),
    "ray start --head --port 6379": RAY_CLUSTER,
    "ray start --address HEAD_IP:6379": RAY_CLUSTER,
    "ray job submit --address http://HEAD_IP:8265 --working-dir . -- uv run --extra ray --extra "
    "s3 -m mmdp.prepare --engine ray --dataset /shared/rows --image-root s3://my-bucket/images "
    "--model qwen2_5_vl --num-rows 100000000 --out s3://my-bucket/prepared/rows": (
        RAY_CLUSTER + "; tests/test_prepare_on_ray.py prepares on a local instance of 2 CPUs, "
        "from files on a disk and on a moto S3 server (-m slow)"
    ),
    "ray job logs --address http://HEAD_IP:8265 --follow JOB_ID": RAY_CLUSTER,
    "uv sync --extra ray --extra s3": INSTALL,
    "uv run tools/image_costs.py": "a minute of every real family's processor, for numbers "
    "docs/real-vlms.md quotes; tests/test_families.py holds its default budgets to the code",
    "bash .ci/run": "CI itself: 9-16 min on 2 cores, the suite and the slow group (`pytest`: run)",
    'd=$(mktemp -d) && git clone -q . "$d" && (cd "$d" && time bash .ci/run)': (
        "CI on a fresh clone: 9-16 min on 2 cores"
    ),
    "uv sync --locked --compile-bytecode": INSTALL + "; .ci/run's first step",
    "uv sync --extra video": INSTALL,
    "uv sync --extra NAME": INSTALL,
    "uv sync --extra s3": INSTALL,
    "pip install '.[video]'": INSTALL,
    "pip install '.[NAME]'": INSTALL,
    "pip install 'mmdp[s3]'": INSTALL,
    'python3 -c "while True: pass"': "a busy core that never ends: the load a benchmark ran under",
}
# What only a command's whole text can cover: a Hub name (Org/name), an s3:// bucket, a GPU.
NEEDS = re.compile(r"(?<![\w./:-])[A-Z][\w-]*/[\w.-]+|s3://|\bcuda\b")
LAUNCHER = re.compile(r"^(?:[A-Z_]+=\S* )*(?:uv|python3?|torchrun|bash|pip)\b")
UV_OPTIONS_WITH_VALUE = {"--extra", "--group", "--with", "--python", "--project"}
TORCHRUN_OPTIONS_WITH_VALUE = {"--nproc_per_node", "--nproc-per-node", "--nnodes", "--node_rank"}


def one_line(command: str) -> str:
    """A command as the tables write it: `# comment` dropped, spaces collapsed."""
    return " ".join(command.split(" # ")[0].split("  #")[0].split())


def quoted_commands(doc: Path) -> list[tuple[int, str]]:
    """(line, command) of every command line the doc quotes (see above)."""
    found = []
    for block in blocks(doc):
        if block.language != "bash":
            continue
        start, pending = None, ""
        for offset, line in enumerate(block.lines):
            if not pending:
                start = block.line + 1 + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            command = one_line(pending + line)
            pending = ""
            if command and not command.startswith("#"):
                found.append((start, command))
    text = re.sub(r"```.*?```", lambda m: "\n" * m[0].count("\n"), doc.read_text(), flags=re.S)
    for number, line in enumerate(text.splitlines(), 1):
        for span in re.findall(r"`([^`]+)`", line):
            if LAUNCHER.match(span) and target_or_launcher(span) != "launcher":
                found.append((number, one_line(span)))
    return sorted(found)


def target_or_launcher(command: str) -> str | None:
    """What a command runs: a script (`bench/bench_scale.py`), `-m module`, or a tool (`pytest`),
    with `torchrun ` before it when torchrun launches it; "launcher" when it names no more than
    the launcher; None when it runs nothing of these (pip, uv sync, a shell line)."""
    words = command.split()
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]
    if len(words) == 1 and LAUNCHER.match(words[0]):
        return "launcher"
    torchrun = ""
    if words[:2] == ["uv", "run"]:
        words = words[2:]
        while words and words[0].startswith("-") and words[0] != "-m":
            words = words[2:] if words[0] in UV_OPTIONS_WITH_VALUE else words[1:]
    elif words[:1] in (["python"], ["python3"], ["bash"]):
        words = words[1:]
    elif words[:1] != ["torchrun"]:
        return None
    if words[:1] == ["torchrun"]:
        torchrun, words = "torchrun ", words[1:]
        while words and words[0].startswith("--"):
            words = words[2:] if words[0] in TORCHRUN_OPTIONS_WITH_VALUE else words[1:]
    if not words or words[0] == "...":
        return "launcher"
    if words[0] == "-m":
        return f"{torchrun}-m {words[1]}" if len(words) > 1 else "launcher"
    if words[0] == "-c":
        return None
    return torchrun + words[0]


def uncovered(commands: list[tuple[str, str]]) -> list[str]:
    """Of (where, command) pairs, those neither table covers, each with what to add."""
    wrong = []
    for where, command in commands:
        if command in NOT_RUN or command in RUN:
            continue
        target = target_or_launcher(command)
        if NEEDS.search(command):
            needs = NEEDS.search(command)[0]
            wrong.append(
                f"{where}: `{command}` needs {needs!r}, which its script's smallest run lacks: "
                "add the command, whole, to tests/doc_blocks.py NOT_RUN with the reason (or to "
                "RUN with the test that runs it)"
            )
        elif target is None or target not in RUN:
            add = f"{target!r} to RUN with the test that runs it, or " if target else ""
            wrong.append(
                f"{where}: `{command}` is run by no test: add {add}the command, whole, to "
                "tests/doc_blocks.py NOT_RUN with the reason (network, GPU, hours, a server...)"
            )
    return wrong


def every_quoted_command() -> list[tuple[str, str]]:
    """(doc:line, command) of every command the README and docs/ quote."""
    return [
        (f"{doc.relative_to(ROOT)}:{line}", command)
        for doc in DOCS
        for line, command in quoted_commands(doc)
    ]


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
    "Qwen": ("qwen2_5_vl", "qwen3_vl", "qwen3_5"),
    "LLaVA-OneVision": ("llava_onevision",),
    "Gemma 3": ("gemma3",),
    "SmolVLM": ("smolvlm",),
    "Gemma 4": ("gemma4",),
    "InternVL": ("internvl",),
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
