"""Stage 5 of the blog, "Knapsacks for Multimodal Data": pack samples under a token budget and an
image budget, each pack padded to a fixed length, ready for a trainer.

    uv run 05_knapsack_multimodal.py
    uv run 05_knapsack_multimodal.py --max-length 1024 --save-batch /tmp/batch.pt
    uv run torchrun --nproc_per_node 2 05_knapsack_multimodal.py --metrics-json /tmp/05.json
    uv run 05_knapsack_multimodal.py --model qwen2_5_vl     # or qwen3_vl, smolvlm, llava_onevision, gemma3
    uv run 05_knapsack_multimodal.py --dataset train.jsonl --model qwen2_5_vl   # your own rows

Prints the shapes of one batch and the epoch report (utilization, dropped samples by reason,
tokens / images / samples per pack), and saves assets/05.png (the blog's figure),
assets/05_vs_03.png (next to constrained padding) and assets/05_samples.png (every sample of
every pack in its own colour, image tokens hatched). Under torchrun every rank loads its share;
rank 0 prints, draws and writes one merged --metrics-json. About 8 s for 2,000 samples.

With --model, the same stage packs for a real vision-language model: each image costs the tokens
and vision-encoder patches its processor gives it (mmdp.models), a pack has a token budget and a
patch budget (--max-length, --max-patches; each family has defaults), and the batches carry what
that model takes. Offline, the family's processor is built in code; --processor NAME_OR_PATH loads
a Hub or local one. It also prints the tokens per image and saves assets/05_MODEL.png.

With --dataset (your own rows: messages, LLaVA or the_cauldron files, local or remote; --image-root,
--format: docs/your-own-data.md), the report adds what it would drop, by reason, and the tokens,
images and patches of a sample of your usable rows by percentile, against the budgets.

The same packing, run other ways: examples/pack_streaming.py (read the data as a stream, a buffer
at a time), examples/pack_prepared.py (weights from `uv run -m mmdp.prepare`), and
examples/pack_mixture.py (several sources, each with its share of the epoch).
"""

import argparse

import numpy as np
import torch
import torch.distributed as dist

from mmdp import config
from mmdp.batch import real_token_mask
from mmdp.data.families import MODELS, OFFLINE, family_for, offline_processor
from mmdp.data.padding import ConstrainedPadCollator
from mmdp.data.reading.settings import DataSettings
from mmdp.data.reading.sources import load_synthetic_videos, with_videos
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import exit_on_user_error
from mmdp.flags import (
    add_data_args,
    add_loader_args,
    add_model_and_budget_args,
    add_packing_args,
    config_for,
    description,
    display_path,
    model_processor,
    non_negative_int,
    settings_of,
)
from mmdp.loading.packed_dataset import PackedDataset
from mmdp.packing.packing_config import PackingConfig
from mmdp.ranks import start_ranks
from mmdp.report.epoch import run_packed_epoch, write_outputs
from mmdp.report.metrics import PackReport, epoch_metrics
from mmdp.report.model_plots import plot_model_budgets, plot_pack_samples
from mmdp.report.plots import plot_padding, plot_padding_side_by_side, save_figure, waste_title
from mmdp.report.printing import (
    print_epoch_report,
    print_rank_balance,
    print_run_settings,
    print_table,
    print_weighing,
)


def parse_args():
    parser = argparse.ArgumentParser(description=description(__doc__))
    add_data_args(parser)
    add_loader_args(parser)
    add_model_and_budget_args(parser, MODELS)
    add_packing_args(parser)
    parser.add_argument(
        "--processor",
        default=None,
        help="a Hub name or local path of a real model's processor (needs a network for a Hub "
        "name); default: --model's processor built offline",
    )
    parser.add_argument(
        "--pretokenize",
        action="store_true",
        help="keep every sample's tokens from the weighing pass (cached), so that building a pack "
        "only slices them and decodes images",
    )
    parser.add_argument(
        "--video-rows",
        type=non_negative_int,
        default=config.DEFAULT_VIDEO_ROWS,
        help="synthetic video clips added to the embedded dataset for a --model that takes video "
        f"(qwen2_5_vl, qwen3_vl, llava_onevision; default: {config.DEFAULT_VIDEO_ROWS})",
    )
    return parser.parse_args()


def main():
    args = parse_args()
    rank = start_ranks()

    # The model's processor: the blog's tokenizer for TinyVLM, or a real model's (built offline),
    # and the budgets of a pack: the flags given, the family's for the others
    processor = model_processor(args)
    family = family_for(processor)
    packing = config_for(family, args)
    if rank == 0:
        print_run_settings(args, packing, family.name)

    # Get the dataset, and stage 2's tokenized map-style dataset
    rows = settings_of(DataSettings, args).load()
    if args.dataset is None and args.video_rows > 0 and family.video_token:
        # A family that takes video packs the synthetic clips with the embedded rows
        rows = with_videos(rows, load_synthetic_videos(args.video_rows))
    samples = VQADataset(rows, processor)

    # Wrap it: weigh every sample, filter, pack with a token and an image budget, shard
    packed = PackedDataset(samples, packing, pretokenize=args.pretokenize)
    packed.set_epoch(args.epoch)
    if rank == 0:
        print_weighing(packed)

    # Go through one epoch on every rank; rank 0 reports for all of them
    epoch = run_packed_epoch(packed, args.num_workers)
    if rank != 0:
        dist.destroy_process_group()
        return
    # One batch, as a trainer gets it, and the epoch's report
    print_epoch_report(epoch, packing.budgets)
    print_rank_balance(epoch["rank_balance"])
    print_videos(epoch["report"], samples, packing)
    if args.dataset:
        # Your own rows: what would be dropped and why, and what a sample of them weighs
        print_your_rows(epoch["report"], packed.weights, packing, args.dataset)
    write_outputs(epoch_metrics(epoch, weighing=epoch["weighing"]), epoch["first_batch"], args)

    if family.name == "tiny":
        # Visualize the packing of the first batch: the blog's figure, then next to stage 3
        draw_figures(epoch["first_batch"], samples, packing, args.out_dir)
    else:
        # What each image costs this model and the others, and how full the packs are
        draw_model_figure(epoch["report"], samples, packing, args.out_dir)


def print_videos(report: PackReport, samples: VQADataset, packing: PackingConfig) -> None:
    """The videos packed this epoch: how many, the tokens and patches each costs (from their
    headers), and their share of the packs' patch budget."""
    if "videos" not in samples.dataset.column_names:
        return
    rows = samples.dataset.select_columns(["videos"])[report.sample_index]["videos"]
    costs = samples.family.video_costs(rows)
    if not costs:
        print(f"{'videos packed:':<18}0")
        return
    tokens, patches = (np.array(values) for values in zip(*costs))
    budget = len(report.patches_per_row) * (packing.max_patches or 0)
    share = f", {patches.sum() / budget:.1%} of the packs' patch budget" if budget else ""
    print(
        f"{'videos packed:':<18}{len(costs):,} (tokens per video: min {tokens.min()}, median "
        f"{np.median(tokens):.0f}, max {tokens.max()}; patches per video: min {patches.min()}, "
        f"median {np.median(patches):.0f}, max {patches.max()}; {patches.sum():,} patches"
        f"{share})"
    )


def print_your_rows(report: PackReport, weights, packing: PackingConfig, dataset: str) -> None:
    """--dataset: the rows used and dropped, by reason (read from the headers and the text when
    weighed, or found when a pack was built), and the tokens, images and patches of a sample of
    the usable rows, by percentile: what a user needs to know before spending GPU hours."""
    print(f"\nYour rows ({dataset}):")
    counts = [["used (samples)", report.samples]]
    counts += [[reason, n] for reason, n in sorted(report.dropped.items(), key=lambda kv: -kv[1])]
    print_table(["rows", "count"], counts, ["", ","])
    usable = weights.reasons == 0
    if not usable.any():
        return
    quantiles = (0, 50, 90, 99, 100)
    columns = {"tokens": weights.lengths, "images": weights.image_counts}
    if packing.max_patches:
        columns["patches"] = weights.patch_counts
    table = [
        [f"{name} per sample", *np.percentile(values[usable], quantiles, method="lower")]
        for name, values in columns.items()
    ]
    print_table(
        ["usable rows", "min", "p50", "p90", "p99", "max"], table, ["", ",.0f"] + [",.0f"] * 4
    )
    budgets = f"max_length {packing.max_length:,}" + (
        f", max_patches {packing.max_patches:,}" if packing.max_patches else ""
    )
    print(f"   budgets: {budgets}, max_images {packing.max_images} (a sample over one is dropped)")


def draw_figures(batch: dict, samples: VQADataset, packing: PackingConfig, out_dir: str) -> None:
    """assets/05.png (the blog's figure), 05_vs_03.png (beside constrained padding), and
    05_samples.png (where each sample and image sits in its pack)."""
    max_length = packing.max_length

    def panel(title: str, lengths: list[int]) -> dict:  # real tokens and padding, per row
        return {"lengths": lengths, "width": max_length, "limit": max_length,
                "title": waste_title(title, lengths, max_length)}  # fmt: skip

    lengths = real_token_mask(batch).sum(dim=1).tolist()
    num_samples = len(batch["sample_index"])
    knapsack = panel(f"Knapsack: {num_samples} samples in {len(lengths)} packs", lengths)
    fig = plot_padding(**knapsack)
    print(f"Saved the packing figure to {display_path(save_figure(fig, out_dir, '05.png'))}")

    # The same number of rows with stage 3's constrained padding, from the same seed
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(packing.seed))
    collate = ConstrainedPadCollator(samples.family.pad_token_id, max_length)
    constrained = collate([samples[int(i)] for i in order[: packing.packs_per_batch]])
    constrained_lengths = real_token_mask(constrained).sum(dim=1).tolist()
    fig = plot_padding_side_by_side(
        knapsack,
        panel(f"Constrained: {len(constrained_lengths)} samples", constrained_lengths),
        title=f"One batch of {packing.packs_per_batch} rows of {max_length} tokens",
    )
    print(f"Saved the comparison to {display_path(save_figure(fig, out_dir, '05_vs_03.png'))}")

    fig = plot_pack_samples(
        batch,
        samples.family.feature_token_id,
        title=f"Knapsack packs: {num_samples} samples, "
        f"{len(batch['pixel_values'])} images in {len(lengths)} packs of {max_length}",
    )
    path = save_figure(fig, out_dir, "05_samples.png")
    print(f"Saved the samples-per-pack figure to {display_path(path)}")


def draw_model_figure(
    report: PackReport, samples: VQADataset, packing: PackingConfig, out_dir: str
) -> None:
    """assets/05_MODEL.png: what the dataset's images cost each family (tokens per image, from
    their headers), and how full this run's packs are in both budgets. Prints the chosen
    family's tokens and patches per image."""
    images = [row["images"] for row in samples.dataset]
    costs = {name: family_for(offline_processor(name)).image_costs(images) for name in OFFLINE}
    costs = {"tiny": [(config.IMAGE_TOKEN_LENGTH, config.IMAGE_TOKEN_LENGTH)], **costs}
    mine = samples.family.image_costs(images)
    tokens, patches = (np.array(values) for values in zip(*mine))
    print(
        f"{'tokens per image:':<18}min {tokens.min()}, median {np.median(tokens):.0f}, "
        f"max {tokens.max()} ({len(tokens):,} images; patches: min {patches.min()}, "
        f"median {np.median(patches):.0f}, max {patches.max()})"
    )
    model = samples.family.name
    fig = plot_model_budgets(
        {name: [t for t, _ in per_image] for name, per_image in costs.items()},
        report.tokens_per_row,
        report.patches_per_row,
        model=model,
        budgets=packing.budgets,
    )
    path = save_figure(fig, out_dir, f"05_{model}.png")
    print(f"Saved the costs and budgets figure to {display_path(path)}")


if __name__ == "__main__":
    with exit_on_user_error():
        main()
