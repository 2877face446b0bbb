"""Each stage reaches only what its blog section needs (issue 52): what executing a stage
script's imports (not its main) loads of mmdp, in lines, and whether it loads torch, transformers,
datasets or the fast packing engines; `import mmdp` alone loads none of the three; every stage
takes its names from mmdp's faces, at most 4 mmdp modules."""

import ast
import json
import subprocess
import sys

import pytest
from conftest import REPO

STAGES = sorted(path.name for path in REPO.glob("0[1-5]_*.py"))  # 06 trains: not measured
HEAVY = ("torch", "transformers", "datasets")
ENGINES = tuple(f"mmdp.packing.{name}" for name in ("_engines", "_best_fit", "_placements"))
FACES = {"mmdp", "mmdp.flags", "mmdp.report", "mmdp.errors"}  # where a stage takes its names
MAX_LINES = {"04_knapsack_toy.py": 800, **dict.fromkeys(STAGES[:3], 3_500)}

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
import mmdp
measured["import mmdp"] = loaded()
for script in SCRIPTS:
    forget()
    runpy.run_path(script, run_name="imports only")
    measured[script] = loaded()
import mmdp.report
missing = [f"{face.__name__}.{name}" for face in (mmdp, mmdp.report) for name in face.__all__
           if not hasattr(face, name)]
print(json.dumps({"measured": measured, "missing": missing}))
"""


@pytest.fixture(scope="module")
def measured() -> dict:
    scripts = ["04_knapsack_toy.py", *(s for s in STAGES if s != "04_knapsack_toy.py")]
    program = f"HEAVY, ENGINES, SCRIPTS = {HEAVY!r}, {ENGINES!r}, {scripts!r}\n{MEASURE}"
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def breakdown(loaded: dict) -> str:
    modules = sorted(loaded["lines"].items(), key=lambda item: -item[1])
    return f"{sum(loaded['lines'].values()):,} lines: " + ", ".join(f"{n} {k}" for n, k in modules)


def test_import_mmdp_alone_loads_no_heavy_library(measured):
    loaded = measured["measured"]["import mmdp"]
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


@pytest.mark.parametrize("script", STAGES)
def test_each_stage_takes_its_names_from_mmdps_faces(script):
    tree = ast.parse((REPO / script).read_text())
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    modules |= {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    from_mmdp = {m for m in modules if m == "mmdp" or m.startswith("mmdp.")}
    assert from_mmdp <= FACES and len(from_mmdp) <= 4, sorted(from_mmdp)
