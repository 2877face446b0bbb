"""The figures every stage saves under assets/: one helper per kind of picture, shared colours.

Each helper returns a matplotlib Figure; `save_figure` writes it and closes it.
"""

import textwrap
from pathlib import Path

import matplotlib
import matplotlib.lines
import matplotlib.patches

matplotlib.use("Agg")  # no screen needed: figures are only saved
import numpy as np  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

CONTENT_COLOUR = "skyblue"
PADDING_COLOUR = "lightgrey"
LIMIT_COLOUR = "red"
# Colours for items / samples: matplotlib's tab20 without its two greys (grey means padding).
ITEM_COLOURS = [c for i, c in enumerate(plt.cm.tab20.colors) if i not in (14, 15)]


def save_figure(fig: Figure, out_dir: str | Path, name: str) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_sample(images: list, texts: list[dict], title: str) -> Figure:
    """Stage 1: the sample's image(s) on the left, its conversation on the right."""
    n = max(len(images), 1)
    fig = plt.figure(figsize=(13, 5.5))
    grid = fig.add_gridspec(n, 2, width_ratios=[1, 1.4])
    for i in range(n):
        ax = fig.add_subplot(grid[i, 0])
        ax.set_xticks([])  # keep the frame: white images on a white page need one
        ax.set_yticks([])
        if images:
            ax.imshow(images[i])
            ax.set_title(f"image {i + 1} of {len(images)} ({images[i].width}x{images[i].height})")
        else:
            ax.text(0.5, 0.5, "(no image)", ha="center", va="center")
    ax_text = fig.add_subplot(grid[:, 1])
    ax_text.axis("off")
    lines = []
    for turn in texts:
        lines += textwrap.wrap("User: " + turn["user"], 80, replace_whitespace=False)
        lines += textwrap.wrap("Assistant: " + turn["assistant"], 80, replace_whitespace=False)
        lines.append("")
    shown = lines[:40] + (["[...]"] if len(lines) > 40 else [])
    ax_text.text(0, 1, "\n".join(shown), va="top", ha="left", fontsize=9, family="monospace")
    ax_text.set_title("conversation")
    fig.suptitle(title)
    return fig


def plot_padding(lengths: list[int], width: int, title: str, limit: int | None = None) -> Figure:
    """Stages 2, 3 and 5: one bar per row of the batch, content in blue and padding in grey.

    `lengths` are the real tokens of each row, `width` the padded length of the batch; `limit`,
    if given, draws the fixed max length as a dashed line.
    """
    lengths = np.asarray(lengths)
    rows = np.arange(len(lengths))
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(lengths) + 2))
    ax.barh(rows, lengths, color=CONTENT_COLOUR, label="content")
    ax.barh(rows, width - lengths, left=lengths, color=PADDING_COLOUR, label="padding")
    if limit is not None:
        ax.axvline(limit, color=LIMIT_COLOUR, linestyle="--", label=f"max length ({limit})")
    ax.set_yticks(rows, [f"row {i + 1}" for i in rows])
    ax.invert_yaxis()
    ax.set_xlabel("token position")
    ax.set_xlim(0, max(width, limit or 0) * 1.02 or 1)
    ax.set_title(title)
    # After everything is drawn, so every element is listed; below the axes, so it hides no bar.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
    return fig


def waste(lengths, width: int) -> float:
    """Padding share of a batch of len(lengths) rows padded to width."""
    total = len(lengths) * width
    return 1 - sum(lengths) / total if total else 0.0


def plot_packs(packs: list[list[int]], capacity: int, title: str) -> Figure:
    """Stage 4: one stacked bar per pack, each item a labelled segment, unused capacity in grey."""
    fig, ax = plt.subplots(figsize=(10, 0.7 * len(packs) + 1.8))
    colours = ITEM_COLOURS
    for row, items in enumerate(packs):
        left = 0
        for item in items:
            ax.barh(row, item, left=left, color=colours[item % len(colours)], edgecolor="white")
            ax.text(left + item / 2, row, str(item), ha="center", va="center", fontsize=8)
            left += item
        ax.barh(row, capacity - left, left=left, color=PADDING_COLOUR)
        ax.text(capacity + 1, row, f"{left / capacity:.0%} full", va="center", fontsize=9)
    ax.axvline(capacity, color=LIMIT_COLOUR, linestyle="--")
    ax.set_yticks(range(len(packs)), [f"pack {i + 1}" for i in range(len(packs))])
    ax.invert_yaxis()
    ax.set_xlim(0, capacity * 1.12)
    ax.set_xlabel("tokens")
    ax.set_title(title)
    handles = [
        matplotlib.patches.Patch(color=colours[3], label="item (its length)"),
        matplotlib.patches.Patch(color=PADDING_COLOUR, label="unused capacity"),
        matplotlib.lines.Line2D(
            [], [], color=LIMIT_COLOUR, linestyle="--", label=f"capacity ({capacity})"
        ),
    ]
    ax.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False
    )
    return fig
