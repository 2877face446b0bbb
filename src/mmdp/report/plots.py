"""The figures of stages 1-4 (a sample, padding, packs), and what every figure shares: colours,
`subplots`, `save_figure`. Stages 5-6 draw with mmdp.report.model_plots.

Each helper returns a matplotlib Figure (made without pyplot: `subplots`); `save_figure` writes it.
"""

import os
import textwrap
from pathlib import Path

import matplotlib
import matplotlib.lines
import matplotlib.patches
import numpy as np
from matplotlib.figure import Figure

REAL_COLOUR = "skyblue"
PADDING_COLOUR = "lightgrey"
LIMIT_COLOUR = "red"
CONTENT_HIGHLIGHT = "tab:blue"
# Colours for items / samples: matplotlib's tab20 without its two greys (grey means padding).
ITEM_COLOURS = [c for i, c in enumerate(matplotlib.colormaps["tab20"].colors) if i not in (14, 15)]


def subplots(*grid, figsize, layout=None, **kwargs):
    """A Figure and its axes, as pyplot.subplots makes them, without pyplot: no backend is
    chosen and no figure is kept open (a figure is only ever saved). layout="constrained" makes
    room for titles and for legends drawn outside their axes."""
    fig = Figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(*grid, **kwargs)


def legend_below(ax, **kwargs) -> None:
    """The axes' legend, in one row under its x label, whatever the axes' height (its distance
    is in font sizes, not in the axes' fraction): after everything is drawn, so it lists every
    labelled element, and outside the axes, so it hides nothing."""
    ax.legend(
        loc="upper center", bbox_to_anchor=(0.5, 0), borderaxespad=3.2, frameon=False, **kwargs
    )


def save_figure(fig: Figure, out_dir: str | Path, name: str) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def display_path(path) -> str:
    """A path as a user would type it (a saved figure's, a report's): relative to the working
    directory when inside it."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def plot_sample(images: list, texts: list[dict], title: str, system: str | None = None) -> Figure:
    """Stage 1: the sample's image(s) on the left, its conversation on the right (its system
    prompt first). An image that could not be opened is given as the text saying why."""
    from mmdp.report.fonts import families_for  # loaded by stage 1 only

    n = max(len(images), 1)
    fig = Figure(figsize=(13, 5.5))
    grid = fig.add_gridspec(n, 2, width_ratios=[1, 1.4])
    for i in range(n):
        ax = fig.add_subplot(grid[i, 0])
        ax.set_xticks([])  # keep the frame: white images on a white page need one
        ax.set_yticks([])
        if images and isinstance(images[i], str):
            why = textwrap.fill(images[i], 40)  # its path may be in any script
            ax.text(0.5, 0.5, why, ha="center", va="center", fontsize=8, family=families_for(why))
            ax.set_title(f"image {i + 1} of {len(images)} (not opened)")
        elif images:
            ax.imshow(images[i])
            ax.set_title(f"image {i + 1} of {len(images)} ({images[i].width}x{images[i].height})")
        else:
            ax.text(0.5, 0.5, "(no image)", ha="center", va="center")
    ax_text = fig.add_subplot(grid[:, 1])
    ax_text.axis("off")
    lines = [] if system is None else [*textwrap.wrap("System: " + system, 80), ""]
    for turn in texts:
        lines += textwrap.wrap("User: " + turn["user"], 80, replace_whitespace=False)
        lines += textwrap.wrap("Assistant: " + turn["assistant"], 80, replace_whitespace=False)
        lines.append("")
    shown = lines[:40] + (["[...]"] if len(lines) > 40 else [])
    text = "\n".join(shown)
    family = families_for(text, "monospace")  # and a CJK font when the text needs one
    ax_text.text(0, 1, text, va="top", ha="left", fontsize=9, family=family)
    ax_text.set_title("conversation")
    fig.suptitle(title, family=families_for(title))
    return fig


def plot_padding(
    lengths: list[int], width: int, title: str, limit: int | None = None, names=None
) -> Figure:
    """Stages 2, 3 and 5: one bar per row of the batch, real tokens in blue and padding in grey.

    `lengths` are the real tokens of each row, `width` the padded length of the batch; `limit`,
    if given, draws the fixed max length as a dashed line; `names`, the rows' (default: "row 1"...).
    """
    fig, ax = subplots(figsize=(10, 0.45 * len(lengths) + 2))
    draw_padding(ax, lengths, width, title, limit, names)
    return fig


def plot_padding_side_by_side(top: dict, bottom: dict, title: str) -> Figure:
    """Two padding panels (each a dict of draw_padding's arguments), e.g. knapsack vs constrained,
    one above the other on the same token axis: at a README's width, side by side is too small
    to read."""
    rows = len(top["lengths"]) + len(bottom["lengths"])
    fig, axes = subplots(2, 1, figsize=(10, 0.3 * rows + 4), layout="constrained")
    draw_padding(axes[0], **top)
    draw_padding(axes[1], **bottom)
    right = max(ax.get_xlim()[1] for ax in axes)
    for ax in axes:
        ax.set_xlim(0, right)
    fig.suptitle(title)
    return fig


def draw_padding(ax, lengths, width: int, title: str, limit=None, names=None) -> None:
    lengths = np.asarray(lengths)
    rows = np.arange(len(lengths))
    ax.barh(rows, lengths, color=REAL_COLOUR, label="real tokens")
    ax.barh(rows, width - lengths, left=lengths, color=PADDING_COLOUR, label="padding")
    if limit is not None:
        ax.axvline(limit, color=LIMIT_COLOUR, linestyle="--", label=f"max length ({limit})")
    ax.set_yticks(rows, names or [f"row {i + 1}" for i in rows])
    ax.invert_yaxis()
    ax.set_xlabel("token position")
    ax.set_xlim(0, max(width, limit or 0) * 1.02 or 1)
    ax.set_title(title)
    legend_below(ax, ncol=3)


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each run of True in a 1-D boolean array."""
    edges = np.flatnonzero(np.diff(np.r_[0, mask.astype(np.int8), 0]))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def waste(lengths, width: int) -> float:
    """Padding share of a batch of len(lengths) rows padded to width."""
    total = len(lengths) * width
    return 1 - sum(lengths) / total if total else 0.0


def waste_title(what: str, lengths, width: int) -> str:
    """A padding figure's title: what the stage does, then the padding share of the batch shown."""
    return f"{what}, {waste(lengths, width):.1%} padding"


def plot_packs(packs: list[list[int]], max_length: int, title: str, rows=None) -> Figure:
    """Stage 4: one stacked bar per pack, each item a labelled segment, unused room in grey.
    `rows`: the figure's height in packs (two figures side by side: the same). A label too wide
    for its item goes outside the bar, above then below (narrow neighbours stay apart)."""
    fig, ax = subplots(figsize=(7, 0.6 * (rows or len(packs)) + 1.8))
    colours = ITEM_COLOURS
    for row, items in enumerate(packs):
        left, outside = 0, 0
        for item in items:
            ax.barh(row, item, left=left, height=0.7, color=colours[item % len(colours)],
                    edgecolor="white")  # fmt: skip
            if item * 100 >= 3 * len(str(item)) * max_length:  # room for the label inside
                ax.text(left + item / 2, row, str(item), ha="center", va="center", fontsize=8)
            else:
                ax.text(left + item / 2, row + (0.5 if outside % 2 else -0.5), str(item),
                        ha="center", va="center", fontsize=8, zorder=3,
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})  # fmt: skip
                outside += 1
            left += item
        ax.barh(row, max_length - left, left=left, height=0.7, color=PADDING_COLOUR)
        ax.text(max_length + 1, row, f"{left / max_length:.0%} full", va="center", fontsize=9)
    ax.axvline(max_length, color=LIMIT_COLOUR, linestyle="--")
    ax.set_yticks(range(len(packs)), [f"pack {i + 1}" for i in range(len(packs))])
    ax.set_ylim(len(packs) - 0.3, -0.8)  # top down, room for the labels above the first pack
    ax.set_xlim(0, max_length * 1.12)
    ax.set_xlabel("tokens")
    ax.set_title(title)
    handles = [
        matplotlib.patches.Patch(color=colours[3], label="item (its length)"),
        matplotlib.patches.Patch(color=PADDING_COLOUR, label="unused room"),
        matplotlib.lines.Line2D(
            [], [], color=LIMIT_COLOUR, linestyle="--", label=f"max length ({max_length})"
        ),
    ]
    legend_below(ax, handles=handles, ncol=3)
    return fig
