"""The figures of stages 5-6: what a pack holds, the budgets, the strategies compared, the
learning curves; and batches grouped by length. Colours and helpers: mmdp.report.plots."""

import matplotlib.lines
import matplotlib.patches
import numpy as np
from matplotlib.figure import Figure

from mmdp.packing.weights import Budgets
from mmdp.report.metrics import row_of_image
from mmdp.report.plots import (
    CONTENT_HIGHLIGHT,
    ITEM_COLOURS,
    LIMIT_COLOUR,
    PADDING_COLOUR,
    REAL_COLOUR,
    draw_padding,
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
    _plot_held_out_loss(held_out, samples_seen, eval_loss, styles)
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


def _plot_held_out_loss(ax, samples_seen: list, eval_loss: dict, styles: dict) -> None:
    """One line per strategy: the mean over runs, with the runs' min-max as a band."""
    for name, per_run in eval_loss.items():
        losses = np.asarray(per_run, dtype=np.float64)  # [runs, checkpoints]
        colour = STRATEGY_COLOURS.get(name)
        ax.fill_between(
            samples_seen,
            losses.min(axis=0),
            losses.max(axis=0),
            color=colour,
            alpha=0.2,
            linewidth=0,
        )
        ax.plot(
            samples_seen,
            losses.mean(axis=0),
            marker="o",
            markersize=4,
            color=colour,
            linestyle=styles[name],
            label=f"{name} (mean, min-max over {len(losses)} runs)",
        )


def _plot_runs(ax, runs: dict, styles: dict, marker: str | None = None) -> None:
    """One line per run, `runs[strategy]` being one (x, losses) pair per run."""
    for name, pairs in runs.items():
        for i, (x, losses) in enumerate(pairs):
            ax.plot(
                x,
                losses,
                marker=marker,
                markersize=3,
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


def plot_grouped(first_batch: dict, comparison: dict, title: str) -> Figure:
    """Stage 3 --group-by, three panels one above the other: the first batch (the heaviest of the
    epoch), real and padded tokens of the epoch for each way of batching, and the padded tokens
    of every step in the order the loader yields them (a band: from the lightest rank's batch to
    the heaviest's).

    `first_batch`: draw_padding's arguments; `comparison`: training.strategies.compare_padding's.
    """
    rows = len(first_batch["lengths"])
    fig, axes = subplots(
        3,
        1,
        figsize=(10, 0.35 * rows + 9),
        layout="constrained",
        gridspec_kw={"height_ratios": [0.35 * rows + 0.6, 2.2, 3.6]},
    )
    draw_padding(axes[0], **first_batch)
    names = list(comparison)
    ax = axes[1]
    real = np.array([comparison[n]["real_tokens"] for n in names])
    padding = np.array([comparison[n]["computed_tokens"] for n in names]) - real
    ax.barh(names, real, color=REAL_COLOUR, label="real tokens")
    bars = ax.barh(names, padding, left=real, color=PADDING_COLOUR, label="padding")
    ax.bar_label(bars, labels=[f" {p / (r + p):.1%} padding" for r, p in zip(real, padding)])
    ax.invert_yaxis()
    ax.set_xlim(0, (real + padding).max() * 1.3)
    ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:,.0f}k")
    ax.set_xlabel("tokens computed over the epoch")
    ax.set_title("one epoch: real tokens and padding")
    legend_below(ax, ncol=2)
    ax = axes[2]
    for name in names:
        padded = np.asarray(comparison[name]["padded_tokens"])  # [step, rank]
        steps = np.arange(1, len(padded) + 1)
        heaviest = padded.max(axis=1)
        colour = STRATEGY_COLOURS.get(name)
        ax.plot(steps, heaviest, color=colour, linewidth=0.8, alpha=0.8, label=name)
        if padded.shape[1] > 1:
            ax.fill_between(steps, padded.min(axis=1), heaviest, color=colour, alpha=0.2)
        top = int(np.argmax(heaviest))
        ax.plot(
            steps[top],
            heaviest[top],
            marker="v",
            markersize=11,
            markeredgecolor="black",
            color=colour,
            linestyle="none",
            label=f"{name}'s heaviest: step {top + 1}",
        )
    ranks = np.asarray(comparison[names[0]]["padded_tokens"]).shape[1]
    ax.set_xlabel("step, in the order the loader yields them")
    ax.set_ylabel("padded tokens (rows x padded length)")
    ax.set_ylim(0, None)
    ax.set_title(
        "every step: its heaviest batch"
        + (f" (band: down to the lightest of {ranks} ranks)" if ranks > 1 else "")
    )
    legend_below(ax, ncol=3)
    fig.suptitle(title)
    return fig


def plot_model_budgets(
    tokens_per_image: dict,
    tokens_per_row: list,
    patches_per_row: list,
    *,
    model: str,
    budgets: Budgets,
) -> Figure:
    """Stage 5 --model, one panel above the other: what the same images cost each family (tokens
    per image, one box per family, `model` highlighted; "no images" when `tokens_per_image` is
    empty); how full each pack of the run is in tokens and in vision-encoder patches (the two
    budgets)."""
    fig, (costs, fill) = subplots(2, 1, figsize=(10, 8.5), layout="constrained")
    names = list(tokens_per_image)
    if not names:  # rows of videos or text only: no image to cost
        costs.text(0.5, 0.5, "no images in these rows", ha="center", va="center")
        costs.set_xticks([])
        costs.set_yticks([])
    else:
        boxes = costs.boxplot(
            [tokens_per_image[n] for n in names], tick_labels=names, showfliers=False,
            patch_artist=True,
        )  # fmt: skip
        for name, box in zip(names, boxes["boxes"]):
            box.set_facecolor(CONTENT_HIGHLIGHT if name == model else PADDING_COLOUR)
        costs.set_yscale("log")
    costs.set_xlabel("model family (--model)")
    costs.set_ylabel("tokens per image (log scale)")
    costs.set_title("What the same images cost each model family")
    token_fill = np.asarray(tokens_per_row) / budgets.max_length
    if budgets.max_patches:
        patch_fill = np.asarray(patches_per_row) / budgets.max_patches
        fill.scatter(
            token_fill, patch_fill, s=12, alpha=0.6, color=CONTENT_HIGHLIGHT, label="a pack"
        )
        fill.axhline(
            1, color=LIMIT_COLOUR, linestyle="--", label=f"patch budget ({budgets.max_patches:,})"
        )
        fill.set_ylabel("patches / patch budget")
    else:
        fill.hist(token_fill, bins=30, color=CONTENT_HIGHLIGHT, label="packs")
        fill.set_ylabel("packs")
    fill.axvline(
        1, color=LIMIT_COLOUR, linestyle=":", label=f"token budget ({budgets.max_length:,})"
    )
    fill.set_xlabel("tokens / token budget")
    fill.set_title(f"{model}: how full each pack is, in both budgets")
    fill.set_xlim(0, 1.05)  # the budgets whole, the legend where packs seldom are: a lone pack
    if budgets.max_patches:  # or text-only ones (0 patches) were hidden under it
        fill.set_ylim(0, 1.05)
    fill.legend(loc="upper left")
    return fig
