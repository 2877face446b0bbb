"""Stage 3's padded batches grouped by modality and length, for trainers that cannot pack
(LLaVA's group_by_modality_length, OpenVLA).

    uv run examples/group_by_length.py
    uv run examples/group_by_length.py --max-length 1024 --metrics-json /tmp/grouped.json
    uv run torchrun --standalone --nproc_per_node 2 examples/group_by_length.py

Stage 3's max_length (longer samples dropped), but text-only samples apart from those with
images, similar lengths in a batch, each batch padded to its longest, each step's tokens balanced
across ranks and the heaviest batch first (mmdp.planning.grouping). Prints one batch, the waste
over the epoch next to naive and constrained padding and how even the ranks' batches are, and
saves assets/03_grouped.png. Under torchrun every rank loads its share and rank 0 reports for all.
"""

import dataclasses

import numpy as np
import torch.distributed as dist
from matplotlib.figure import Figure
from torch.utils.data import DataLoader

from mmdp import (
    DataSettings,
    ModalityLengthBatchSampler,
    NaivePadCollator,
    VQADataset,
    compare_padding,
    config,
    gather_from_ranks,
    get_tokenizer,
    real_token_mask,
    start_ranks,
    weigh_rows,
)
from mmdp.config import setting
from mmdp.errors import exit_on_user_error
from mmdp.flags import Figures, LoaderSettings, flag_values, parse_flags
from mmdp.report import (
    EpochReport,
    display_path,
    nothing_to_do,
    print_batch,
    print_settings,
    rank_balance,
    run_epoch,
    save_figure,
    waste_title,
    write_json,
)
from mmdp.report.model_plots import STRATEGY_COLOURS
from mmdp.report.plots import PADDING_COLOUR, REAL_COLOUR, draw_padding, legend_below, subplots


@dataclasses.dataclass(frozen=True)
class GroupByLengthSettings:
    """Stage 3's settings: the rows, the loader, the batch and its max_length."""

    data: DataSettings = DataSettings(num_rows=config.DEFAULT_NUM_ROWS)
    seed: int = setting(0, "random seed: the batches' order", min=0)
    loader: LoaderSettings = LoaderSettings()
    batch_size: int = setting(config.BATCH_SIZE, "samples per padded batch", min=1)
    max_length: int = setting(config.MAX_LENGTH, "longer samples are dropped, as in stage 3", min=1)
    figures: Figures = Figures()


def main(argv=None):
    settings = parse_flags(GroupByLengthSettings, __doc__, argv)
    rank = start_ranks()
    if rank == 0:
        print_settings(flag_values(settings))

    # Stage 3's tokenizer, dataset and tokenized map-style dataset
    tokenizer = get_tokenizer(settings.loader.tokenizer)
    rows = settings.data.load()
    train_dataset = VQADataset(rows, tokenizer)

    # Weigh every row once (tokens and images, from the text and the image count: no decoding)
    weights = weigh_rows(rows, tokenizer).weights

    # Text-only apart from multimodal, similar lengths in a batch, each step's tokens balanced
    # across ranks, the heaviest batch first; samples longer than max_length dropped as in stage 3
    sampler = ModalityLengthBatchSampler(
        weights, batch_size=settings.batch_size, max_length=settings.max_length, seed=settings.seed
    )
    if len(sampler) == 0:
        raise nothing_to_do(len(weights), sampler.dropped, "raise --max-length")

    # Pad each batch to its longest sample: grouped, that is close to every sample's length
    loader = DataLoader(
        train_dataset,
        batch_sampler=sampler,
        num_workers=settings.loader.num_workers,
        collate_fn=NaivePadCollator(tokenizer.pad_token_id),
    )

    # Go through one epoch on every rank; rank 0 reports for all of them
    epoch = run_grouped_epoch(loader, sampler)
    if sampler.rank != 0:
        return
    print("\nThe first batch, the heaviest of the epoch:")
    print_batch(epoch["first_batch"])
    ranks = f"{sampler.world_size} rank" + "s" * (sampler.world_size > 1)
    print(f"\nOver the epoch ({ranks}):\n{epoch['report'].summary()}")
    balance = epoch["rank_balance"]
    if sampler.world_size > 1:
        print(
            f"batches per rank: {balance['batches_per_rank']}; between the ranks' batches of a "
            f"step: real tokens differ by {mean_max(balance['token_spread_per_step'])} "
            "(mean / max over steps)"
        )

    # Next to naive and constrained padding, on the same rows and ranks
    comparison = compare_padding(
        weights,
        max_length=settings.max_length,
        batch_size=settings.batch_size,
        seed=settings.seed,
        world_size=sampler.world_size,
    )
    print_comparison(comparison, sampler.world_size)
    if settings.loader.metrics_json:
        metrics = {**epoch["metrics"], "comparison": comparison}
        print(
            f"Wrote the epoch report to {display_path(write_json(metrics, settings.loader.metrics_json))}"
        )
    draw_grouped(epoch["first_batch"], comparison, settings)


def run_grouped_epoch(loader: DataLoader, sampler: ModalityLengthBatchSampler) -> dict:
    """One epoch on this rank; on rank 0, the report of every rank merged, and what each rank's
    batch held at each step (real tokens, images, padded tokens), as the loader gave them."""
    report, sample_index, loads = EpochReport(), [], []

    def batches():
        for batch in loader:
            sample_index.extend(batch["sample_index"].tolist())
            mask = real_token_mask(batch)
            loads.append((int(mask.sum()), len(batch["pixel_values"]), mask.numel()))
            yield batch

    first_batch, _ = run_epoch(batches(), report, hint="raise --max-length")
    reports, sample_index, loads = (gather_from_ranks(x) for x in (report, sample_index, loads))
    if dist.is_initialized():
        dist.destroy_process_group()
    merged = EpochReport.merged(reports)
    merged.dropped.update(sampler.dropped)  # rows the plan left out, counted once
    loads = np.array(list(zip(*loads)), dtype=np.int64)  # [step, rank, (tokens, images, padded)]
    names = ("tokens", "images", "padded_tokens")
    balance = rank_balance({name: loads[..., k] for k, name in enumerate(names)}, len(reports))
    return {
        "report": merged,
        "first_batch": first_batch,
        "rank_balance": balance,
        "metrics": {
            **merged.as_dict(),
            "batches_per_rank_yielded": [r.batches for r in reports],
            "sample_index_per_rank": sample_index,
            "rank_balance": balance,
            "padded_tokens": loads[..., 2].tolist(),  # [step][rank]: rows x padded length
        },
    }


def draw_grouped(first_batch: dict, comparison: dict, settings: GroupByLengthSettings) -> None:
    """assets/03_grouped.png: the first batch, the epoch's padding and every step, next to naive
    and constrained padding."""
    lengths = real_token_mask(first_batch).sum(dim=1).tolist()
    width = first_batch["input_ids"].shape[1]
    first = {
        "lengths": lengths,
        "width": width,
        "limit": settings.max_length,
        "title": waste_title(f"The first batch: padded to its longest ({width})", lengths, width),
    }
    waste = 1 - comparison["modality_length"]["utilization"]
    title = (
        f"Constrained Padding grouped by modality and length: {waste:.1%} padding "
        f"(constrained {1 - comparison['constrained']['utilization']:.1%})"
    )
    path = save_figure(
        plot_grouped(first, comparison, title), settings.figures.out_dir, "03_grouped.png"
    )
    print(f"Saved the grouped padding figure to {display_path(path)}")


def print_comparison(comparison: dict, world_size: int) -> None:
    """Padding waste and, on several ranks, how even the ranks' batches are: naive, constrained
    and grouped batches of this epoch (from the weights)."""
    ranks = world_size > 1
    print(
        f"\nThe same epoch batched three ways, from the weights ({world_size} rank"
        + (
            "s; spread: max - min between the ranks' batches of a step, mean / max over steps"
            * ranks
        )
        + "; a step's padded tokens: its heaviest batch's rows x padded length):"
    )
    print(
        f"{'batching':<16}{'padding':>8}{'steps':>7}{'dropped':>9}"
        + (f"{'real tok spread':>17}{'padded tok spread':>19}" * ranks)
        + f"{'first step':>12}{'heaviest step':>15}"
    )
    for name, result in comparison.items():
        balance = result["rank_balance"]
        tokens, padded = balance["token_spread_per_step"], balance["padded_token_spread_per_step"]
        per_step = [max(step) for step in result["padded_tokens"]]
        heaviest = max(range(len(per_step)), key=per_step.__getitem__)
        spreads = f"{mean_max(tokens):>17}{mean_max(padded):>19}"
        print(
            f"{name:<16}{1 - result['utilization']:>8.1%}{result['batches_per_rank']:>7,}"
            f"{sum(result['dropped'].values()):>9,}"
            + (spreads * ranks)
            + f"{per_step[0]:>12,}{per_step[heaviest]:>8,} (#{heaviest + 1})"
        )


def mean_max(spread: dict) -> str:
    return f"{spread['mean']:,.0f} / {spread['max']:,}"


def plot_grouped(first_batch: dict, comparison: dict, title: str) -> Figure:
    """assets/03_grouped.png, three panels one above the other: the first batch (the heaviest
    of the epoch), real and padded tokens of the epoch for each way of batching, and the padded
    tokens of every step in the order the loader yields them (a band: from the lightest rank's
    batch to the heaviest's).

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


if __name__ == "__main__":
    with exit_on_user_error():
        main()
