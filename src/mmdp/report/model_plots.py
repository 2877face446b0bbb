"""The figures of stages 5-6: what a pack holds, the strategies compared, the learning curves
(one colour per strategy, STRATEGY_COLOURS). Colours and helpers: mmdp.report.plots."""

import matplotlib.patches
import numpy as np
from matplotlib.figure import Figure

from mmdp.report.metrics import row_of_image
from mmdp.report.plots import (
    ITEM_COLOURS,
    PADDING_COLOUR,
    legend_below,
    runs,
    subplots,
)

STRATEGY_COLOURS = {
    "naive": "tab:grey",
    "constrained": "tab:brown",
    "greedy": "tab:orange",
    "binpack": "tab:green",
    "bfd": "tab:cyan",
    "images_first_bfd": "tab:blue",
    "balanced_greedy": "tab:purple",
    "modality_length": "tab:red",  # stage 3's padded batches grouped by modality and length
}


def plot_pack_samples(batch: dict, image_token_id: int, title: str) -> Figure:
    """Stage 5: each pack's tokens coloured by the sample they belong to, image tokens hatched.

    Shows what a flat "real tokens vs padding" bar hides: where each sample starts and ends, how
    many samples and images each pack holds.
    """
    input_ids = batch["input_ids"]
    rows, width = input_ids.shape
    fig, ax = subplots(figsize=(12, 0.55 * rows + 2))
    sample = 0
    offsets = batch["cu_seq_lens_q"].tolist()
    segment = 0
    image_row = row_of_image(batch)
    for row in range(rows):
        left = 0
        for _ in range(int(batch["samples_per_pack"][row])):
            length = offsets[segment + 1] - offsets[segment]
            colour = ITEM_COLOURS[sample % len(ITEM_COLOURS)]
            ax.barh(row, length, left=left, color=colour, edgecolor="white", linewidth=0.8)
            is_image = (input_ids[row, left : left + length] == image_token_id).numpy()
            for start, stop in runs(is_image):
                ax.barh(
                    row,
                    stop - start,
                    left=left + start,
                    color="none",
                    hatch="////",
                    edgecolor="black",
                    linewidth=0,
                )
            left += length
            sample += 1
            segment += 1
        if left < width:
            ax.barh(row, width - left, left=left, color=PADDING_COLOUR)
            segment += 1
        images = int((image_row == row).sum())
        samples = int(batch["samples_per_pack"][row])
        label = f"{samples} sample{'s' * (samples != 1)}, {images} image{'s' * (images != 1)}"
        ax.text(width * 1.01, row, label, va="center", fontsize=8)
    ax.set_yticks(range(rows), [f"pack {i + 1}" for i in range(rows)])
    ax.invert_yaxis()
    ax.set_xlim(0, width * 1.2)
    ax.set_xlabel("token position")
    ax.set_title(title)
    handles = [
        matplotlib.patches.Patch(facecolor=ITEM_COLOURS[0], label="a sample (one colour each)"),
        matplotlib.patches.Patch(
            facecolor="white", edgecolor="black", hatch="////", label="image tokens (64 per image)"
        ),
        matplotlib.patches.Patch(color=PADDING_COLOUR, label="padding"),
    ]
    legend_below(ax, handles=handles, ncol=3)
    return fig


def plot_learning_curves(
    samples_seen: list, eval_loss: dict, eval_steps: dict, training: dict, title: str
) -> Figure:
    """Stage 6: learning over several runs (seeds), one colour per strategy, three panels one
    above the other.

    Top: the held-out loss at each of `samples_seen`, `eval_loss[strategy]` being one list per
    run; the line is the mean over runs, the band their min-max. Middle: the same losses against
    the optimizer steps done when they were measured (`eval_steps`, same shape), one line per
    run. Bottom: the training loss of every step, `training[strategy]` being one (samples seen,
    losses) pair per run.
    """
    fig, (held_out, per_step, train) = subplots(
        3, 1, figsize=(10, 12), sharey=True, layout="constrained"
    )
    # different line styles: two strategies that learn alike (naive, constrained) stay visible
    styles = dict(zip(eval_loss, ["-", "--", "-.", ":"] * len(eval_loss)))
    # one line per strategy: the mean over runs, with the runs' min-max as a band
    for name, per_run in eval_loss.items():
        losses = np.asarray(per_run, dtype=np.float64)  # [runs, checkpoints]
        colour = STRATEGY_COLOURS.get(name)
        band = (losses.min(axis=0), losses.max(axis=0))
        held_out.fill_between(samples_seen, *band, color=colour, alpha=0.2, linewidth=0)
        held_out.plot(
            samples_seen,
            losses.mean(axis=0),
            marker="o",
            markersize=4,
            color=colour,
            linestyle=styles[name],
            label=f"{name} (mean, min-max over {len(losses)} runs)",
        )
    _plot_runs(
        per_step, {name: list(zip(eval_steps[name], eval_loss[name])) for name in eval_loss}, styles
    )
    _plot_runs(train, training, styles)
    held_out.set_title("held-out loss against samples seen")
    held_out.set_xlabel("samples seen")
    per_step.set_title("the same held-out losses against optimizer steps")
    per_step.set_xlabel("optimizer steps")
    train.set_title("training loss of each step")
    train.set_xlabel("samples seen")
    for ax in (held_out, per_step, train):
        ax.set_ylabel("loss (mean over reply tokens)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right")  # the losses fall from the top left: that corner is free
    fig.suptitle(title)
    return fig


def _plot_runs(ax, runs: dict, styles: dict) -> None:
    """One line per run, `runs[strategy]` being one (x, losses) pair per run."""
    for name, pairs in runs.items():
        for i, (x, losses) in enumerate(pairs):
            ax.plot(
                x,
                losses,
                color=STRATEGY_COLOURS.get(name),
                alpha=0.6,
                linewidth=1,
                linestyle=styles[name],
                label=f"{name} (one line per run)" if i == 0 else None,
            )


def plot_strategies(results: dict, title: str) -> Figure:
    """Stage 6: every strategy on one epoch, one column per strategy through four panels one
    above the other: utilization, batches (and samples dropped), real tokens and images per row."""
    names = list(results)
    x = np.arange(len(names))
    colours = [STRATEGY_COLOURS.get(n) for n in names]
    fig, axes = subplots(4, 1, figsize=(10, 11), sharex=True, layout="constrained")
    ax = axes[0]
    values = [100 * results[n]["utilization"] for n in names]
    bars = ax.bar(x, values, color=colours)
    ax.bar_label(bars, labels=[f"{v:.1f}%" for v in values])
    ax.set_ylim(0, 115)
    ax.set_ylabel("% of computed tokens")
    ax.set_title("utilization: real tokens / computed tokens")
    ax = axes[1]
    values = [results[n]["batches"] for n in names]
    dropped = [sum(results[n]["dropped"].values()) for n in names]
    bars = ax.bar(x, values, color=colours)
    ax.bar_label(bars, labels=[f"{v} ({d} dropped)" for v, d in zip(values, dropped)])
    ax.set_ylim(0, max(values) * 1.2)
    ax.set_ylabel("batches")
    ax.set_title("batches per epoch (and samples dropped)")
    for ax, key, label in (
        (axes[2], "tokens", "real tokens per row"),
        (axes[3], "images", "images per row"),
    ):
        ax.boxplot([results[n]["per_row"][key] for n in names], positions=x, whis=(0, 100))
        ax.set_ylabel(label.split(" per ")[0])
        ax.set_title(f"{label} (padded row or pack): median, quartiles, min-max")
    # the names once, under the last panel, level: each has its column's room
    axes[-1].set_xticks(x, names)
    axes[-1].set_xlabel("strategy")
    fig.suptitle(title)
    return fig
