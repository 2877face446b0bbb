"""The README and docs/ stay true to the repository: every relative link and anchor resolves, and
every `uv run SCRIPT --flag` they quote names a script that exists and flags its parser defines.
Read statically (the scripts are not started), so this costs well under a second."""

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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
    (followed into the functions those call): what its parser can define, read statically."""
    return {"--help"} | flags_in(parsed(script), script, set())


def flags_in(body: ast.AST, path: Path, seen: set) -> set[str]:
    tree = parsed(path)
    local = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    imported = {
        alias.asname or alias.name: module_path(node.module)
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmdp")
        for alias in node.names
    }
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
        if called in adders:
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
    """The README's table of names: (idea, what mmdp calls it)."""
    text = (ROOT / "README.md").read_text()
    table = text.split("| Idea | mmdp | The blog |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split(" | ") for line in table.strip().splitlines()[1:]]
    return [(cells[0].lstrip("| "), cells[1]) for cells in rows]


STAGE_SCRIPTS = {int(p.name[:2]): p for p in ROOT.glob("0[1-6]_*.py")}
SOURCE = "\n".join(p.read_text() for p in (ROOT / "src").rglob("*.py"))


def test_the_readmes_names_are_the_codes_names():
    """Each flag in the README's one-word table is a flag of the stages it names (of some stage if
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
