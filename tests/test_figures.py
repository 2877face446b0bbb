"""tools/figures.py: its table agrees with assets/ and the docs; its check catches a changed
figure and a changed quoted line (stage 4's figures, 2 s); its refresh rewrites a stale quoted
line and keeps the `~` marks; and (-m slow) every committed figure and quoted output is what a
fresh run makes."""

import importlib.util
import re
import subprocess
import sys

import doc_blocks
import pytest
from conftest import REPO
from PIL import Image

spec = importlib.util.spec_from_file_location("figures", REPO / "tools" / "figures.py")
figures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(figures)

STAGE4 = "uv run 04_knapsack_toy.py"


def test_every_figure_in_assets_has_the_command_the_docs_quote_saving_it():
    assert figures.table_problems() == []


def test_the_table_check_names_a_missing_script_and_a_figure_shown_under_another_command():
    problems = figures.table_problems(
        {
            **figures.FIGURES,
            "03_grouped.png": "uv run no_such_script.py",
            "04_greedy.png": "uv run 02_naive_pad_dataloader.py",
        }
    )
    assert [re.sub(r":\d+ quotes .*", "", problem) for problem in problems] == [
        "03_grouped.png: `uv run no_such_script.py` runs no_such_script.py, which does not exist",
        "03_grouped.png: FIGURES says `uv run no_such_script.py` makes it; "
        "docs/use-in-your-trainer.md",  # the doc that shows it, the command above it there
        "04_greedy.png: FIGURES says `uv run 02_naive_pad_dataloader.py` makes it; README.md",
    ]
    assert problems[1].endswith(" quotes `uv run examples/group_by_length.py`")
    assert problems[2].endswith(" quotes `uv run 04_knapsack_toy.py`")


def test_the_check_catches_a_changed_figure_and_a_changed_quoted_line(tmp_path):
    """Negative control: stage 4's committed figures and quoted output are a fresh run's; one
    pixel changed, a figure cut or one quoted number changed is reported."""
    argv, out, _ = figures.run(STAGE4, tmp_path / "fresh")
    fresh = tmp_path / "fresh" / "04_greedy.png"
    committed = figures.ASSETS / "04_greedy.png"
    assert figures.compare_figures(committed, fresh) is None
    assert (
        figures.compare_figures(figures.ASSETS / "04_binpack.png", fresh.parent / "04_binpack.png")
        is None
    )

    with Image.open(committed) as image:
        tampered = image.convert("RGB")
    red, green, blue = tampered.getpixel((10, 20))
    tampered.putpixel((10, 20), (red, green, blue ^ 2))  # anti-aliasing's noise: the same
    tampered.save(tmp_path / "noise.png")
    assert figures.compare_figures(tmp_path / "noise.png", fresh) is None
    tampered.putpixel((10, 20), (255 - red, green, blue))
    tampered.save(tmp_path / "one_pixel.png")
    tampered.crop((0, 0, 100, 100)).save(tmp_path / "cut.png")
    assert figures.compare_figures(tmp_path / "one_pixel.png", fresh).startswith("1 of ")
    assert "x 10-10, y 20-20" in figures.compare_figures(tmp_path / "one_pixel.png", fresh)
    assert figures.compare_figures(tmp_path / "cut.png", fresh).startswith("100x100 px")

    assert figures.quoted_output_differences(STAGE4, argv, out, tmp_path / "fresh") == ""
    changed = out.replace("4 packs, 75% full", "4 packs, 76% full")
    difference = figures.quoted_output_differences(STAGE4, argv, changed, tmp_path / "fresh")
    assert "README.md:" in difference and "printed: 4 packs, 76% full" in difference


def test_the_refresh_rewrites_a_stale_quoted_line_and_keeps_its_marks(tmp_path, monkeypatch):
    doc = tmp_path / "doc.md"
    quoted = [
        "```bash",
        STAGE4,
        "```",
        "```",
        "Over the epoch (~10.8 s, ~184 samples/s):",
        "batches:  62",
        "...",
        "rate   ~1,100 packs/s, 4 packs",
        "```",
        "",
    ]
    doc.write_text("\n".join(quoted))
    monkeypatch.setattr(doc_blocks, "DOCS", [doc])
    printed = (
        "Over the epoch (7.4 s, 268 samples/s):\nbatches:  63\nmore\nrate  12,345 packs/s, 5 packs"
    )
    changes = doc_blocks.refresh_output(STAGE4, ["04_knapsack_toy.py"], printed)
    assert doc.read_text().split("\n")[4:8] == [
        "Over the epoch (~10.8 s, ~184 samples/s):",  # the same, but for its ~ numbers: kept
        "batches:  63",
        "...",
        "rate ~12,345 packs/s, 5 packs",  # rewritten, its ~ kept on the same number
    ]
    assert [change.split("\n")[0] for change in changes] == [f"{doc}:6", f"{doc}:8"]
    assert not doc_blocks.compare(
        doc_blocks.blocks(doc)[1], printed, template=False, masked_settings=set()
    )


@pytest.mark.slow  # every figure's command at its full size: 11 min on 2 cores at load 5
@pytest.mark.docs
def test_the_committed_figures_and_quoted_outputs_are_what_a_fresh_run_makes():
    done = subprocess.run(
        [sys.executable, "tools/figures.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
