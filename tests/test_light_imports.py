"""Each stage reaches only what its blog section needs (issue 52): what executing a stage
script's imports (not its main) loads of mmdp, in lines, and whether it loads torch, transformers,
datasets or the fast packing engines; `import mmdp` alone loads none of the three; stage 5's
ConstantLengthDataset pulls at most 1,500 lines of mmdp and no datasets; every stage imports
each name from the module where it lives, so that a reader finds its file in one step."""

import ast
import json
import re
import subprocess
import sys

import pytest
from conftest import REPO

STAGES = sorted(path.name for path in REPO.glob("0[1-5]_*.py"))  # 06 trains: not measured
HEAVY = ("torch", "transformers", "datasets")
ENGINES = tuple(f"mmdp.packing.{name}" for name in ("_engines", "_best_fit", "_placements"))
MAX_LINES = {"04_knapsack_toy.py": 800, **dict.fromkeys(STAGES[:3], 3_500)}
BLOGS_DATASET = "mmdp.loading.constant_length"  # stage 5's ConstantLengthDataset
DEFINITIONS = (ast.FunctionDef, ast.ClassDef)

# One process for all: `import mmdp` first, then the stage without a heavy library (4), then the
# others; before each, mmdp's modules are forgotten (pure Python: imported again, in full), so
# each stage's count is its own. The heavy libraries stay once loaded (a C extension cannot be
# imported twice): they are told apart only up to the first stage that loads them. Last, every
# name of both faces is resolved: a name whose module moved fails here, not in a user's hands.
MEASURE = """
import json, runpy, sys
from pathlib import Path

def forget():
    for name in [n for n in sys.modules if n == "mmdp" or n.startswith("mmdp.")]:
        del sys.modules[name]

def loaded():
    mmdp = {n: m for n, m in sys.modules.items() if n == "mmdp" or n.startswith("mmdp.")}
    lines = {n: len(Path(m.__file__).read_text().splitlines()) for n, m in mmdp.items()}
    return {"lines": lines, "heavy": [h for h in HEAVY if h in sys.modules],
            "engines": [e for e in ENGINES if e in sys.modules]}

measured = {}
__import__(FIRST)
measured[FIRST] = loaded()
for script in SCRIPTS:
    forget()
    runpy.run_path(script, run_name="imports only")
    measured[script] = loaded()
import mmdp, mmdp.report
missing = [f"{face.__name__}.{name}" for face in (mmdp, mmdp.report) for name in face.__all__
           if not hasattr(face, name)]
print(json.dumps({"measured": measured, "missing": missing}))
"""


@pytest.fixture(scope="module")
def measured() -> dict:
    scripts = ["04_knapsack_toy.py", *(s for s in STAGES if s != "04_knapsack_toy.py")]
    return measure(scripts)


def measure(scripts: list[str], first: str = "mmdp") -> dict:
    """MEASURE in a fresh process: `import first`, then each script's imports."""
    program = f"HEAVY, ENGINES, SCRIPTS, FIRST = {(HEAVY, ENGINES, scripts, first)!r}\n{MEASURE}"
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def breakdown(loaded: dict) -> str:
    modules = sorted(loaded["lines"].items(), key=lambda item: -item[1])
    return f"{sum(loaded['lines'].values()):,} lines: " + ", ".join(f"{n} {k}" for n, k in modules)


def test_import_mmdp_alone_loads_no_heavy_library(measured):
    loaded = measured["measured"]["mmdp"]
    assert loaded["heavy"] == [] and loaded["engines"] == []
    assert set(loaded["lines"]) <= {"mmdp", "mmdp._lazy"}, breakdown(loaded)


def test_stage4_loads_the_blogs_loops_and_nothing_heavy(measured):
    loaded = measured["measured"]["04_knapsack_toy.py"]
    assert loaded["heavy"] == [] and loaded["engines"] == []
    assert "mmdp.packing.knapsack" in loaded["lines"]


# Stages 2 and 3 load 4,259 lines each: the data pipeline a padded batch goes through
# (families.base 482, sources 419, metrics 329, conversation 328, batch 305, formats 251...),
# more than the 3,500 until that path is split further.
@pytest.mark.parametrize("script", MAX_LINES)
def test_each_light_stage_loads_few_lines_of_mmdp(measured, script):
    loaded = measured["measured"][script]
    assert sum(loaded["lines"].values()) <= MAX_LINES[script], breakdown(loaded)


def test_every_name_of_the_faces_resolves(measured):
    assert measured["missing"] == []


def test_the_blogs_constant_length_dataset_pulls_little_of_mmdp_and_no_datasets():
    loaded = measure([], first=BLOGS_DATASET)["measured"][BLOGS_DATASET]  # a process of its own
    assert "datasets" not in loaded["heavy"] and loaded["engines"] == []
    assert sum(loaded["lines"].values()) <= 1_500, breakdown(loaded)


def defined_in(module: str) -> set[str]:
    """The names a module of mmdp defines itself (functions, classes, assignments), not those it
    imports: what `from MODULE import NAME` may take from it."""
    tree = ast.parse(module_path(module).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        for target in getattr(node, "targets", [getattr(node, "target", None)]):
            names |= (
                {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} if target else set()
            )
    return names


def module_path(module: str):
    path = REPO / "src" / module.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@pytest.mark.parametrize("script", STAGES)
def test_each_stage_imports_each_name_from_the_module_where_it_lives(script):
    """`from mmdp.data.vqa_dataset import VQADataset`, not `from mmdp import VQADataset`: the
    import line is the file to open (README, "the stages share src/mmdp/")."""
    tree = ast.parse((REPO / script).read_text())
    elsewhere = [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmdp")
        for alias in node.names
        if alias.name not in defined_in(node.module)
        and not module_path(f"{node.module}.{alias.name}").exists()  # a module: its own file
    ]
    bare = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names if alias.name.startswith("mmdp")]  # fmt: skip
    assert elsewhere == [] and bare == [], f"imported from a face, not its file: {elsewhere + bare}"


def test_the_import_check_names_a_name_taken_from_a_face():
    """Negative control: mmdp's face defines none of the names it hands out."""
    assert "VQADataset" not in defined_in("mmdp") and "VQADataset" in defined_in(
        "mmdp.data.vqa_dataset"
    )
    assert "MAX_LENGTH" in defined_in("mmdp.config")


def test_the_readme_links_the_blogs_dataset_with_each_piece_of_its_table():
    """README stage 5: the module's link and true line count (at most 250), and the blog's table
    row by row, each row linking the file that defines the function it names."""
    readme = (REPO / "README.md").read_text()
    module = module_path(BLOGS_DATASET).relative_to(REPO)
    lines = len((REPO / module).read_text().splitlines())
    assert lines <= 250 and f"[C]: {module}" in readme and f"[C] ({lines} lines)" in readme
    table = readme.split("| Blog | Stage 5 | Here |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    rows = {line.split("|")[1].strip(): line.split("|")[3] for line in table}
    assert list(rows) == ["Item", "Weight", "Knapsack", "Packing Strategy", "Producer-Consumer",
                          "Sample Filtering", "Sharding", "Batching", "Output"]  # fmt: skip
    for blog, cell in rows.items():
        links = re.findall(r"\[([^\]]+)\](?:\(([^)#]+)[^)]*\)|\[C\])", cell)
        code = [(name, path or str(module)) for text, path in links
                for name in re.findall(r"`([\w.]+)", text)]  # fmt: skip
        assert code, f"{blog}: links no function"
        for name, path in code:
            if path.endswith(".py"):
                tree = ast.parse((REPO / path).read_text())
                functions = {n.name for n in ast.walk(tree) if isinstance(n, DEFINITIONS)}
                assert name.split(".")[-1] in functions, f"{blog}: {path} defines no {name}"


def test_the_table_check_names_a_function_the_file_lacks(tmp_path):
    """Negative control: the same parse on a made-up row names what the file does not define."""
    cell = " [`_knapsack_of_the_blog`][C] "
    links = re.findall(r"\[([^\]]+)\](?:\(([^)#]+)[^)]*\)|\[C\])", cell)
    names = [name for text, _ in links for name in re.findall(r"`([\w.]+)", text)]
    tree = ast.parse(module_path(BLOGS_DATASET).read_text())
    assert names == ["_knapsack_of_the_blog"]
    assert names[0] not in {n.name for n in ast.walk(tree) if isinstance(n, DEFINITIONS)}


FACE_NAMES = 40  # issue 60: a face a user reads in one go, grouped by what they do


def test_mmdps_face_is_small_and_lists_each_name_under_the_file_that_defines_it():
    """mmdp/__init__.py's table, {module: [names]}: at most 40 names, each defined in the module
    it is listed under (not imported there), so that the table gives each name's file."""
    tree = ast.parse(module_path("mmdp").read_text())
    table = next(n.args[1] for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args[1:])
    listed = {name.value: module.value for module, names in zip(table.keys, table.values)
              for name in names.elts}  # fmt: skip
    assert len(listed) <= FACE_NAMES, sorted(listed)
    elsewhere = [f"{module}.{name}" for name, module in listed.items()
                 if name not in defined_in(module)]  # fmt: skip
    assert elsewhere == [], f"listed under a module that does not define them: {elsewhere}"
