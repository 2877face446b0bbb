"""Every figure in assets/, and the output the docs quote beside it, from one command.

    uv run tools/figures.py                 # every figure made again; assets/ and the docs updated
    uv run tools/figures.py --check         # exit 1 when a committed figure or quoted line is stale
    uv run tools/figures.py --only 04_greedy.png 06   # the commands of these figures only
    uv run tools/figures.py --list          # FIGURES: each figure and the command that makes it

Each figure is made by the command the docs quote above it (FIGURES). Both ways run those
commands, one at a time, into a temporary folder (--out-dir), and compare:

- each fresh figure with the committed one, pixel by pixel (PIL), each colour within
  TOLERANCE: the same run twice draws the same pixels, but stage 6's training on 1 thread and on
  2 differs in the 7th digit, which moves 128 of 06.png's 1.5 M pixels by 1/255;
- the docs' quoted output of each command with what it printed, as tests/doc_blocks.py does
  (exactly, but for the `~` numbers, which vary by machine).

--check reports what differs and exits 1. Without it, a stale figure is copied into assets/ and a
stale quoted line rewritten in its doc (its `~` marks kept); the prose around it is yours to read
again. Measured on 2 CPU cores shared with other jobs (load average 5-10): 14-17 min either way,
stage 6 8-13 min of it (2 min on quiet cores). The slow group runs --check (tests/test_figures.py:
11 min, on a fresh cache and one thread).
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"
sys.path.insert(0, str(ROOT / "tests"))  # the docs' quoted outputs, as the tests read them
from doc_blocks import (  # noqa: E402
    DOCS,
    FENCE,
    check_output,
    first_command,
    refresh_output,
    script_words,
)

# Every figure in assets/ and the command that makes it, as the docs quote it (in the docs'
# order: stage 3 grouped weighs the rows stage 5 then loads from the cache). When a command
# moves (to another script, other flags), change its row with the docs: table_problems() stops
# both ways before anything runs, naming the figure, and the script that is gone or the command
# the docs quote saving it.
FIGURES = {
    "01.png": "uv run 01_check_dataset.py --seed 5",
    "02.png": "uv run 02_naive_pad_dataloader.py",
    "03.png": "uv run 03_constrained_pad_dataloader.py",
    "03_grouped.png": "uv run examples/group_by_length.py",
    "04_greedy.png": "uv run 04_knapsack_toy.py",
    "04_binpack.png": "uv run 04_knapsack_toy.py",
    "05.png": "uv run 05_knapsack_multimodal.py",
    "05_vs_03.png": "uv run 05_knapsack_multimodal.py",
    "05_samples.png": "uv run 05_knapsack_multimodal.py",
    "05_qwen2_5_vl.png": "uv run examples/pack_planned.py --model qwen2_5_vl",
    "06.png": "uv run 06_packing_pays_off.py",
    "strategies.png": "uv run 06_packing_pays_off.py",
}
# Figures a benchmark makes: their timings are the machine's, so no fresh run can hold them pixel
# by pixel; listed here so that every PNG in assets/ says what makes it, and never run by --check.
BENCH_FIGURES = {"train_step.png": "uv run bench/bench_train_step.py --preset cpu"}
REFRESH = "uv run tools/figures.py"
EMBEDDED = re.compile(r"\]\((?:\.\./)?assets/([\w.-]+\.png)\)")  # ![...](assets/NAME.png)
INLINE_COMMAND = re.compile(r"`(uv run [^`]+)`")
# How far (of 255) a pixel's colour may move before a figure is stale: anti-aliasing that a
# number's 7th digit moves, no more (a changed title, bar or line moves some pixel by far more).
TOLERANCE = 2


def parse_args(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 naming each stale figure and quoted line",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="these figures' commands only (04_greedy.png or 04_greedy); default: all",
    )
    parser.add_argument(
        "--list", action="store_true", help="print FIGURES (figure: command) and stop"
    )
    return parser.parse_args(argv)


def quoted_above(doc: Path) -> dict[str, tuple[int, str | None]]:
    """Each figure `doc` shows (![...](assets/NAME.png)): its line, and the last command quoted
    above it (a bash block's first `uv run`, or inline code `uv run ...`)."""
    shown, command, fence = {}, None, None  # fence: the open block's language and lines
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        opening = FENCE.match(line)
        if fence is not None:
            if opening:  # its end: a bash block's first `uv run` is the command above
                if fence[0] == "bash":
                    command = first_command(fence[1]) or command
                fence = None
            else:
                fence[1].append(line)
            continue
        if opening:
            fence = (opening[1], [])
            continue
        for span in INLINE_COMMAND.findall(line):
            command = " ".join(span.split())
        for name in EMBEDDED.findall(line):
            shown[name] = (number, command)
    return shown


def table_problems(figures: dict[str, str] = FIGURES) -> list[str]:
    """What makes FIGURES disagree with assets/ and the docs: a figure not listed, a listed one
    not committed or shown nowhere, a command whose script is gone, a doc that shows the figure
    under another command. [] when they agree. (Other commands may write the same file, a
    user's --dataset run of stage 1 say: the committed figure is the one the docs show.)"""
    problems = [
        f"{path.relative_to(ROOT)} is in no row of FIGURES (tools/figures.py): what makes it?"
        for path in sorted(ASSETS.glob("*.png"))
        if path.name not in figures and path.name not in BENCH_FIGURES
    ]
    quoted = {}  # figure -> [(where a doc shows it, the command quoted above it)]
    for doc in DOCS:
        for name, (line, command) in quoted_above(doc).items():
            quoted.setdefault(name, []).append((f"{doc.relative_to(ROOT)}:{line}", command))
    for name, command in figures.items():
        script = script_words(command)[0]
        if not (ROOT / "assets" / name).exists():
            problems.append(f"{name}: listed in FIGURES but not in assets/")
        if not (ROOT / script).exists():
            problems.append(f"{name}: `{command}` runs {script}, which does not exist")
        if name not in quoted:
            problems.append(f"{name}: no doc shows it (an image link to {ASSETS.name}/{name})")
        problems += [
            f"{name}: FIGURES says `{command}` makes it; {where} quotes `{other}`"
            for where, other in quoted.get(name, [])
            if other != command
        ]
    return problems


def compare_figures(committed: Path, fresh: Path) -> str | None:
    """None when the two PNGs hold the same pixels, each colour within TOLERANCE; else how
    they differ."""
    if not committed.exists():
        return "not committed"
    with Image.open(committed) as a, Image.open(fresh) as b:
        if a.size != b.size:
            return f"{a.size[0]}x{a.size[1]} px, a fresh run {b.size[0]}x{b.size[1]} px"
        a, b = (np.asarray(image.convert("RGBA"), dtype=np.int16) for image in (a, b))
    differs = (np.abs(a - b) > TOLERANCE).any(axis=-1)
    if not differs.any():
        return None
    rows, columns = np.nonzero(differs)
    return (
        f"{int(differs.sum()):,} of {differs.size:,} pixels differ by more than {TOLERANCE}/255 "
        f"(up to {int(np.abs(a - b).max())}/255), in x {columns.min()}-{columns.max()}, "
        f"y {rows.min()}-{rows.max()}"
    )


def run(command: str, out_dir: Path) -> tuple[list[str], str, float]:
    """Run a quoted command as its script in this Python, from the repository root, its figures
    into out_dir: (the script and its arguments, what it printed, seconds)."""
    argv = [*script_words(command), "--out-dir", str(out_dir)]
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"`{command}` failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return argv, done.stdout, seconds


def quoted_output_differences(command: str, argv: list[str], out: str, out_dir: Path) -> str:
    """How the docs' quoted output of `command` differs from this run's; empty when it does not."""
    try:
        check_output(command, argv, out, paths={str(out_dir): "assets"})
    except AssertionError as error:
        return str(error).split("\nUpdate the block")[0]
    return ""


def remake(names: list[str], *, check: bool, assets: Path = ASSETS) -> list[str]:
    """Run the commands of the figures `names`, one at a time, into a temporary folder, and
    compare what they make and print with `assets` and the docs. check: change nothing, return
    what is stale; else copy each stale figure into `assets`, rewrite each stale quoted line,
    and return []. Prints a line per figure and command."""
    commands = list(dict.fromkeys(FIGURES[name] for name in names))
    stale, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="figures-") as folder:
        for i, command in enumerate(commands):
            out_dir = Path(folder) / str(i)
            argv, out, seconds = run(command, out_dir)
            print(f"{command} ({seconds:.0f} s):")
            for name in (name for name, made_by in FIGURES.items() if made_by == command):
                fresh, shown = out_dir / name, f"{ASSETS.name}/{name}"  # as the docs write it
                if not fresh.exists():
                    sys.exit(f"   `{command}` wrote no {name}: is FIGURES still right?")
                with Image.open(fresh) as image:
                    size = f"{image.size[0]}x{image.size[1]} px"
                difference = compare_figures(assets / name, fresh)
                if difference is None:
                    print(f"   {shown} ({size}): the same")
                elif check:
                    stale.append(f"{shown}: {difference}")
                    print(f"   {shown} ({size}): STALE, {difference}")
                else:
                    shutil.copyfile(fresh, assets / name)
                    print(f"   {shown} ({size}): written ({difference})")
            paths = {str(out_dir): "assets"}
            if check:
                difference = quoted_output_differences(command, argv, out, out_dir)
                print("   its quoted output: " + ("STALE" if difference else "the same"))
                stale += [difference] if difference else []
            else:
                changes = refresh_output(command, argv, out, paths=paths)
                rewritten = f"{len(changes)} line(s) rewritten" if changes else "the same"
                print(f"   its quoted output: {rewritten}")
                print("".join(f"   {change}\n" for change in changes), end="")
    print(f"{len(commands)} commands in {time.perf_counter() - started:.0f} s")
    return stale


def main(argv: list[str] | None = None):
    args = parse_args(argv)
    if args.list:
        for name, command in FIGURES.items():
            print(f"{name:<20} {command}")
        return
    problems = table_problems()
    if problems:
        sys.exit("FIGURES (tools/figures.py) disagrees with the docs:\n" + "\n".join(problems))
    names = [name if name.endswith(".png") else f"{name}.png" for name in args.only or FIGURES]
    unknown = [name for name in names if name not in FIGURES]
    if unknown:
        sys.exit(f"no such figure: {', '.join(unknown)} (uv run tools/figures.py --list)")
    stale = remake(names, check=args.check)
    if stale:
        only = f" --only {' '.join(args.only)}" if args.only else ""
        sys.exit(
            "Stale against a fresh run:\n"
            + "\n".join(stale)
            + f"\nRefresh the figures and the quoted outputs with `{REFRESH}{only}`, then read "
            "the prose beside them again."
        )


if __name__ == "__main__":
    main()
