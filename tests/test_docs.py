"""The README and docs/ stay true to the repository: every relative link and anchor resolves;
every `uv run SCRIPT --flag` they quote names a script that exists and flags its parser defines;
every quoted output is checked by a test, and every quoted command run by one at some size or
listed as not run, with the reason (tests/doc_blocks.py); the tables of drop reasons and
batch keys list exactly what the code has; every repository path named in the docs, the
docstrings and the comments exists; every Python snippet compiles and imports what exists (and,
with -m slow, runs), unless marked `<!-- fragment -->`. Read statically, this costs about a
second. `uv run pytest -k docs` runs these and every test that holds a doc to a run."""

import ast
import functools
import re
from pathlib import Path

import pytest
from doc_blocks import (
    CHECKED,
    DOCS,
    NOT_RUN,
    ROOT,
    RUN,
    SMOKE,
    UNCHECKED,
    blocks,
    contract_keys,
    every_quoted_command,
    output_blocks,
    quoted_commands,
    quoted_drop_reasons,
    target_or_launcher,
    uncovered,
)

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
UV_RUN = re.compile(r"uv run ([^`\n]*)")
UV_OPTIONS_WITH_VALUE = {"--extra", "--group", "--with", "--python", "--project"}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(doc):
    broken = []
    for target in links(doc):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...: not ours to check offline
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{doc.name}: {broken}"


def commands(doc: Path) -> list[str]:
    """Every `uv run ...` the document quotes, its continuation lines joined."""
    text = doc.read_text().replace("\\\n", " ")
    return [m.strip() for m in UV_RUN.findall(text)]


def script_and_flags(command: str) -> tuple[str | None, list[str]]:
    """The script (a path ending in .py, or a `-m` module) and the flags given to it."""
    words = command.split()
    i = 0
    while i < len(words) and words[i].startswith("-"):  # uv's own options
        i += 2 if words[i] in UV_OPTIONS_WITH_VALUE else 1
    for j in range(i, len(words)):
        if words[j].endswith(".py"):
            script, rest = words[j], words[j + 1 :]
            break
        if words[j] == "-m" and j + 1 < len(words) and words[j + 1].startswith("mmdp"):
            script, rest = "src/" + words[j + 1].replace(".", "/") + ".py", words[j + 2 :]
            break
    else:
        return None, []  # pytest, ruff, ...: not our parser
    flags = [w.split("=")[0] for w in rest if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", w)]
    return script, flags


def module_path(module: str) -> Path:
    path = ROOT / "src" / Path(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@functools.cache
def parser_flags(script: Path) -> set[str]:
    """The flags of every add_argument call in the script, and in the mmdp functions it calls
    (followed into the functions those call), and of the settings dataclasses it hands
    mmdp.flags (parse_flags, add_flags): what its parser can define, read statically."""
    return {"--help"} | flags_in(parsed(script), script, set())


def imports_of(path: Path) -> dict[str, Path]:
    """Each name the module imports from mmdp (at any depth: a function's own imports too), and
    the file that defines it; a name on mmdp's lazy face, its module's file."""
    imported = {}
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmdp"):
            for alias in node.names:
                imported[alias.asname or alias.name] = module_path(node.module)
    return imported


@functools.cache
def face_modules(face: Path) -> dict[str, Path]:
    """A lazy face's names (mmdp/_lazy.py: lazy_face(__name__, {module: [names]})), by module."""
    calls = [n for n in ast.walk(parsed(face)) if isinstance(n, ast.Call) and len(n.args) == 2]
    table = next((c.args[1] for c in calls if isinstance(c.args[1], ast.Dict)), None)
    if table is None:
        return {}
    return {
        name.value: module_path(module.value)
        for module, names in zip(table.keys, table.values)
        for name in names.elts
    }


def class_def(name: str, path: Path) -> tuple[Path, ast.ClassDef] | None:
    """The class `name` as the module at `path` has it: its own, or where it imports it from."""
    for node in parsed(path).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return path, node
    where = imports_of(path).get(name)
    if where is None or not where.exists():
        return None
    return class_def(name, face_modules(where).get(name, where))


def settings_flags(name: str, path: Path, only=None) -> set[str]:
    """The flags mmdp.flags makes of the settings dataclass `name` (in or imported into `path`):
    one a field, and a dataclass field's own fields' (those its setting(flags=...) names)."""
    found = class_def(name, path)
    if found is None:
        return set()
    where, cls = found
    flags = set()
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign):
            continue
        field, kind = node.target.id, ast.unparse(node.annotation)
        keywords = {k.arg: k.value for k in getattr(node.value, "keywords", [])}
        selected = ast.literal_eval(keywords["flags"]) if "flags" in keywords else None
        if kind.isidentifier() and class_def(kind, where) is not None:
            flags |= settings_flags(kind, where, selected)
        elif only is None or field in only:
            flags.add("--" + field.replace("_", "-"))
    return flags


def flags_in(body: ast.AST, path: Path, seen: set) -> set[str]:
    tree = parsed(path)
    local = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    imported = imports_of(path)
    adders = {"add_argument"} | {  # `add = parser.add_argument` and then add("--flag", ...)
        target.id
        for node in ast.walk(body)
        if isinstance(node, ast.Assign) and getattr(node.value, "attr", None) == "add_argument"
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    flags = set()
    for node in ast.walk(body):
        if not isinstance(node, ast.Call):
            continue
        called = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
        settings = {"parse_flags": 0, "add_flags": 1}.get(called)
        if settings is not None and isinstance(node.args[settings], (ast.Name, ast.Attribute)):
            flags |= settings_flags(ast.unparse(node.args[settings]).split(".")[-1], path)
        elif called in adders:
            names = [a.value for a in node.args if isinstance(a, ast.Constant)]
            names = [n for n in names if isinstance(n, str) and n.startswith("--")]
            flags |= set(names)
            if any("BooleanOptionalAction" in ast.unparse(k.value) for k in node.keywords):
                flags |= {"--no-" + n[2:] for n in names}
        elif (path, called) not in seen and (called in local or called in imported):
            seen.add((path, called))
            if called in local:
                flags |= flags_in(local[called], path, seen)
            elif imported[called].exists():
                where = imported[called]
                functions = {
                    n.name: n for n in parsed(where).body if isinstance(n, ast.FunctionDef)
                }
                if called in functions:
                    flags |= flags_in(functions[called], where, seen)
    return flags


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_quoted_command_runs_a_script_with_the_flags_it_names(doc):
    wrong = []
    for command in commands(doc):
        script, flags = script_and_flags(command)
        if script is None:
            continue
        path = ROOT / script
        if not path.exists():
            wrong.append(f"uv run {command}: no {script}")
            continue
        unknown = sorted(set(flags) - parser_flags(path))
        if unknown:
            wrong.append(f"uv run {command}: {script} has no {', '.join(unknown)}")
    assert not wrong, "\n".join(wrong)


def test_the_checks_catch_a_wrong_flag_and_a_broken_anchor(tmp_path):
    """Negative control: a made-up flag and a made-up heading are both reported."""
    script, flags = script_and_flags("05_knapsack_multimodal.py --max-length 512 --no-such-flag")
    assert script == "05_knapsack_multimodal.py"
    assert "--max-length" in parser_flags(ROOT / script)
    assert "--no-such-flag" not in parser_flags(ROOT / script)
    doc = tmp_path / "doc.md"
    doc.write_text("# A heading\n[here](#a-heading) [there](#no-heading)\n")
    assert [t for t in links(doc) if t[1:] not in anchors(doc)] == ["#no-heading"]


def one_word_table() -> list[tuple[str, str]]:
    """The glossary's table of names (docs/glossary.md): (idea, what mmdp calls it)."""
    text = (ROOT / "docs" / "glossary.md").read_text()
    table = text.split("| Idea | mmdp | The blog |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split(" | ") for line in table.strip().splitlines()[1:]]
    return [(cells[0].lstrip("| "), cells[1]) for cells in rows]


STAGE_SCRIPTS = {int(p.name[:2]): p for p in ROOT.glob("0[1-6]_*.py")}
SOURCE = "\n".join(p.read_text() for p in (ROOT / "src").rglob("*.py"))


def test_the_glossarys_names_are_the_codes_names():
    """Each flag in the glossary's one-word table is a flag of the stages it names (of some stage if
    it names none), and each other name in it is a word of the package's code."""
    wrong = []
    for idea, names in one_word_table():
        for part in names.split(" / "):
            stages = re.search(r"\(stages? ([\d, ]+)\)", part)
            numbers = (
                [int(n) for n in re.findall(r"\d", stages[1])] if stages else list(STAGE_SCRIPTS)
            )
            for name in re.findall(r"`([^`]+)`", part):
                if name.startswith("--"):
                    flag = name.split()[0]
                    having = [n for n in numbers if flag in parser_flags(STAGE_SCRIPTS[n])]
                    if not having or (stages and having != numbers):
                        wrong.append(f"{idea}: {flag} is a flag of stages {having}, not {numbers}")
                else:
                    word = re.sub(r"\(.*", "", name.split(".")[-1])
                    if not re.search(rf"\b{re.escape(word)}\b", SOURCE):
                        wrong.append(f"{idea}: {name} is not in src/")
    assert not wrong, "\n".join(wrong)


# Quoted outputs and tables ---------------------------------------------------------------------


def test_every_quoted_output_is_checked_by_a_test_or_says_why():
    quoted = {block.command: block.where() for block in output_blocks()}
    unknown = {command: where for command, where in quoted.items() if command not in CHECKED}
    unknown = {command: where for command, where in unknown.items() if command not in UNCHECKED}
    assert not unknown, (
        "quoted outputs no test checks: add a check_output call (tests/doc_blocks.py) to the "
        f"test that runs each, and the command to CHECKED, or say why not in UNCHECKED: {unknown}"
    )
    stale = (set(CHECKED) | set(UNCHECKED)) - set(quoted)
    assert not stale, f"no doc quotes these outputs any more: {stale}"


# Quoted commands: run by a test at some size, or not run and why ------------------------------


def test_every_quoted_command_is_run_by_a_test_or_says_why_not():
    wrong = uncovered(every_quoted_command())
    assert not wrong, "\n".join(wrong)


def test_every_entry_of_run_and_not_run_is_still_quoted():
    quoted = every_quoted_command()
    commands = {command for _, command in quoted}
    targets = {target_or_launcher(command) for command in commands}
    stale = [f"NOT_RUN: {c!r}" for c in NOT_RUN if c not in commands]
    stale += [f"RUN: {key!r}" for key in RUN if key not in commands and key not in targets]
    assert not stale, (
        "no doc quotes these any more (as a whole command, or a command running it): drop them "
        "from tests/doc_blocks.py\n" + "\n".join(stale)
    )


def test_every_test_run_names_exists():
    """Each RUN value is FILE::TEST (or a file) that exists; a SMOKE value's script has its row
    in tests/test_bench_and_examples.py's SMOKE_RUNS."""
    from test_bench_and_examples import SMOKE_RUNS

    smoke = {run.script for run in SMOKE_RUNS}
    wrong = []
    for key, value in RUN.items():
        path, _, test = value.split()[0].partition("::")
        if not (ROOT / path).is_file():
            wrong.append(f"{key}: no {path}")
        elif test and not re.search(rf"^def {test}\(", (ROOT / path).read_text(), flags=re.M):
            wrong.append(f"{key}: {path} has no test {test}")
        elif value == SMOKE and key.removeprefix("torchrun ") not in smoke:
            wrong.append(f"{key}: not in SMOKE_RUNS")
    assert not wrong, "tests/doc_blocks.py RUN:\n" + "\n".join(wrong)


def test_every_quoted_pytest_marker_is_registered():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    markers = {m.split(":")[0] for m in config["tool"]["pytest"]["ini_options"]["markers"]}
    named = {
        (where, marker)
        for where, command in every_quoted_command()
        if target_or_launcher(command) == "pytest"
        for marker in re.findall(r" -m (\w+)", command)
    }
    assert not [n for n in named if n[1] not in markers], f"markers {markers}, quoted {named}"


def test_every_quoted_python_c_runs(capsys):
    """`python -c CODE` as quoted, in this process: it prints what it says it prints."""
    runs = {c for _, c in every_quoted_command() if c in RUN and c.startswith("python -c ")}
    assert runs
    for command in runs:
        exec(command.removeprefix("python -c ").strip('"'), {})
        import mmdp

        assert capsys.readouterr().out.strip() == str(mmdp.__all__)


def test_the_command_check_catches_an_unlisted_command_and_a_hub_name(tmp_path):
    """Negative control: in a made-up doc, a script no test runs, a covered script given a Hub
    name, and an install are reported; a covered script, a launcher alone and a listed command
    are not."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        "Run `uv run 07_no_such_stage.py --rows 10` with `uv run` or `torchrun`.\n"
        "```bash\n"
        "uv run 05_knapsack_multimodal.py --num-rows 400   # covered: its script\n"
        "uv run 05_knapsack_multimodal.py \\\n    --processor Org/model   # the network\n"
        "pip install something\n"
        "bash .ci/run\n"
        "```\n"
    )
    quoted = [(f"doc.md:{line}", command) for line, command in quoted_commands(doc)]
    assert [c for _, c in quoted] == [
        "uv run 07_no_such_stage.py --rows 10",
        "uv run 05_knapsack_multimodal.py --num-rows 400",
        "uv run 05_knapsack_multimodal.py --processor Org/model",
        "pip install something",
        "bash .ci/run",
    ]
    wrong = uncovered(quoted)
    assert [w.split(":")[1] for w in wrong] == ["1", "4", "6"]  # where each command starts
    assert "'07_no_such_stage.py' to RUN" in wrong[0] and "'Org/model'" in wrong[1]


def test_the_bad_input_table_lists_every_drop_reason_once():
    from mmdp.drop_reasons import REASONS

    quoted, reasons = quoted_drop_reasons(), [reason for reason in REASONS if reason]
    assert len(quoted) == len(set(quoted)), f"a reason twice: {quoted}"
    assert set(quoted) == set(reasons), (
        "docs/use-in-your-trainer.md, Bad input: the table's reasons differ from "
        f"mmdp.drop_reasons; missing: {sorted(set(reasons) - set(quoted))}, not a reason: "
        f"{sorted(set(quoted) - set(reasons))}"
    )


def test_the_batch_contract_says_which_keys_only_some_batches_carry():
    """The keys every batch carries are held to real batches (tests/test_families.py, each
    family; tests/test_stage_scripts.py, TinyVLM's; tests/test_streaming.py, a stream's). Those
    only some carry: a real family's name and settings (tests/test_families.py), a stream's reader
    state (tests/test_streaming.py), a mixture's loss weights (tests/test_stage_scripts.py,
    slow) and a filler's flag (tests/test_packed_dataset.py)."""
    only_some = contract_keys(every_batch=False) - contract_keys(every_batch=True)
    expected = {"model_family", "model_settings", "reader_state", "loss_weights", "filler"}
    assert only_some == expected


# Repository paths ------------------------------------------------------------------------------

# A path in the repository: under one of its folders, or a stage script. A name in capitals stands
# for any (assets/05_MODEL.png), braces list alternatives (examples/{trainer,torchrun}.py).
REPO_PATH = re.compile(
    r"(?<![\w/.~-])((?:src|tests|docs|assets|bench|tools|examples|\.ci)/[\w./{},*-]*[\w/}*]"
    r"|\b0[1-6]_\w+\.py)"
)
# Not this repository's: transformers' own test files, which the family modules cite.
THIRD_PARTY = ("tests/models/",)
# Paths of the repository's past that a text names as such: bench_packing.py --before loads the
# packers from git revisions before the package layout.
PAST = {"src/mmdp/packing.py"}
TEXTS = [
    *DOCS,
    *sorted((ROOT / "src").rglob("*.py")),
    *sorted(ROOT.glob("0[1-6]_*.py")),
    *(
        p
        for folder in ("examples", "bench", "tools", "tests")
        for p in sorted((ROOT / folder).glob("*.py"))
    ),
]


def alternatives(path: str) -> list[str]:
    """examples/{trainer,torchrun}.py -> examples/trainer.py, examples/torchrun.py."""
    brace = re.search(r"\{([^}]*)\}", path)
    if not brace:
        return [path]
    before, after = path[: brace.start()], path[brace.end() :]
    return [p for option in brace[1].split(",") for p in alternatives(before + option + after)]


def named_paths(text: str) -> list[tuple[int, str]]:
    """(line, path) of every repository path a text names."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in REPO_PATH.finditer(line):
            path = match[1].rstrip(".")
            if path.startswith(THIRD_PARTY) or path in PAST:
                continue
            found += [(number, re.sub(r"[A-Z][A-Z_]+", "*", p)) for p in alternatives(path)]
    return found


def exists(path: str) -> bool:
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


def test_every_repository_path_the_docs_and_docstrings_name_exists():
    missing = [
        f"{text.relative_to(ROOT)}:{line}: {path}"
        for text in TEXTS
        for line, path in named_paths(text.read_text())
        if not exists(path)
    ]
    assert not missing, "no such file or folder:\n" + "\n".join(missing)


def test_the_path_check_catches_a_moved_file():
    """Negative control: the tokenizer's old place is reported, its place and a pattern are not;
    transformers' test files are not ours. (The old place is built from two strings, or this
    file would name it.)"""
    gone = "src/mmdp/" + "smollm2_tokenizer"
    text = (
        f"shipped in {gone} (gone); src/mmdp/data/smollm2_tokenizer/, assets/05_MODEL.png, "
        "examples/{trainer,accelerate_loop}.py and transformers' "
        "tests/models/smolvlm/test_processor_smolvlm.py."
    )
    assert [path for _, path in named_paths(text) if not exists(path)] == [gone]


# Python snippets -------------------------------------------------------------------------------

FRAGMENT = "<!-- fragment"  # the line before a ```python fence: not a whole program


def snippets(fragments: bool) -> list:
    found = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        for block in blocks(doc):
            if block.language != "python":
                continue
            fragment = lines[block.line - 2].startswith(FRAGMENT)
            if fragment == fragments or fragments is None:
                found.append(block)
    return found


@pytest.mark.parametrize("block", snippets(fragments=None), ids=lambda b: b.where())
def test_every_python_snippet_compiles_and_imports_what_exists(block):
    """Its imports run; a fragment's other names come from around it in the doc."""
    code = "\n".join(block.lines)
    tree = ast.parse(code, filename=block.where())
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    exec(compile(ast.Module(imports, type_ignores=[]), block.where(), "exec"), {})


class FirstStepDone(Exception):
    """The snippet computed its first loss: it runs."""


@pytest.mark.slow  # weighs 2,000 rows and runs TinyVLM's first step on a batch of 8 packs
@pytest.mark.parametrize("block", snippets(fragments=False), ids=lambda b: b.where())
def test_every_whole_python_snippet_runs_to_its_first_loss(block):
    """`model`: TinyVLM (stage 6's tiny model) for the shipped tokenizer; the snippet runs to the
    loss of its first batch, which must be a number."""
    import torch

    from mmdp.data.tokenizer import get_tokenizer
    from mmdp.models.tiny_vlm import TinyVLM, TinyVLMConfig

    tokenizer = get_tokenizer()
    tiny_vlm = TinyVLM(TinyVLMConfig(len(tokenizer), tokenizer.image_token_id)).eval()
    losses = []

    def model(**inputs):
        if losses:
            raise FirstStepDone
        with torch.no_grad():
            output = tiny_vlm(**inputs)
        losses.append(float(output.loss))
        return output

    with pytest.raises(FirstStepDone):
        exec(compile("\n".join(block.lines), block.where(), "exec"), {"model": model})
    assert losses and losses[0] == losses[0] and losses[0] > 0


def test_the_output_check_catches_a_changed_line_and_skips_only_marked_numbers(tmp_path):
    """Negative control for tests/doc_blocks.py: a quoted block against printed outputs."""
    from doc_blocks import Block, compare

    quoted = Block(tmp_path / "doc.md", 1, "", ("settings: num_rows=2000, seed=0", "...",
                   "batches:  62", "Over the epoch (~10.8 s, ~184 samples/s):"))  # fmt: skip
    printed = "settings: num_rows=2000, seed=0\nmore\nbatches:  62\nOver the epoch (7.4 s, 268 samples/s):"

    def differs(out: str, template: bool = False) -> bool:
        return bool(compare(quoted, out, template=template, masked_settings=set()))

    assert not differs(printed)  # `~` numbers may differ, `...` skips lines
    assert differs(printed.replace("62", "63"))  # any other number may not
    assert differs(printed.replace("batches:", "packs:"))
    assert differs(printed.replace("seed=0", "seed=0, video_rows=100"))
    assert not differs(printed.replace("\nmore", ""))  # ... may skip no line at all
    # a template (a smaller run): numbers and settings values aside, the same words and names
    smaller = printed.replace("2000", "400").replace("62", "13").replace("seed=0", "seed=1")
    assert differs(smaller) and not differs(smaller, template=True)
    assert differs(smaller.replace("seed=1", "seed=1, video_rows=100"), template=True)
    assert differs(smaller.replace("Over the epoch", "Over an epoch"), template=True)


# The tutorial's shape (issue 52): the README a companion to the blog, the stages short enough to
# read beside it, the docs results rather than diaries.
README_LINES, STAGE_1_BY, SECTION_LINES = 200, 40, 45
SCRIPT_LINES = {1: 120, 2: 120, 3: 130, 4: 100, 5: 160}
DOCS_WORDS, BENCHMARKS_WORDS = 30_000, 8_000


def test_the_readme_reads_as_the_tutorial_and_the_stages_beside_the_blog():
    lines = (ROOT / "README.md").read_text().splitlines()
    starts = [n for n, line in enumerate(lines) if line.startswith("## ")]
    sections = {lines[a]: b - a for a, b in zip(starts, [*starts[1:], len(lines)])}
    stage_1 = next(n for n in starts if lines[n].startswith("## Stage 1"))
    long = {title: n for title, n in sections.items() if "Stage" in title and n > SECTION_LINES}
    assert len(lines) <= README_LINES and stage_1 < STAGE_1_BY and not long, (
        len(lines),
        stage_1,
        long,
    )
    scripts = {n: len(STAGE_SCRIPTS[n].read_text().splitlines()) for n in SCRIPT_LINES}
    assert all(scripts[n] <= most for n, most in SCRIPT_LINES.items()), scripts


def test_the_docs_are_results_not_a_diary():
    words = {p.name: len(p.read_text().split()) for p in (ROOT / "docs").glob("*.md")}
    assert words["benchmarks.md"] <= BENCHMARKS_WORDS and sum(words.values()) <= DOCS_WORDS, words
