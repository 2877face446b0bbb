"""Stage 5 of the blog, "Knapsacks for Multimodal Data": pack samples under a token budget and an
image budget, balanced, each pack padded to a fixed length.

    uv run 05_knapsack_multimodal.py
    uv run 05_knapsack_multimodal.py --max-length 1024 --save-batch /tmp/batch.pt
    uv run torchrun --nproc_per_node 2 05_knapsack_multimodal.py --metrics-json /tmp/05.json

Prints the shapes of one batch and the epoch report (utilization, dropped samples by reason,
tokens / images / samples per pack), and saves assets/05.png (the blog's figure),
assets/05_vs_03.png (next to constrained padding) and assets/05_samples.png (every sample of
every pack in its own colour, image tokens hatched). Under torchrun every rank loads its share;
rank 0 prints, draws and writes one merged --metrics-json. About 8 s for 2,000 samples.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

from mmdp import config
from mmdp.cli import add_data_args, add_loader_args, display_path, print_batch, print_settings
from mmdp.collate import ConstrainedPadCollator, real_token_mask
from mmdp.data import load_vqa_dataset
from mmdp.errors import exit_on_user_error
from mmdp.metrics import PackReport, write_json
from mmdp.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing import STRATEGIES
from mmdp.plots import (
    plot_pack_samples,
    plot_padding,
    plot_padding_side_by_side,
    save_figure,
    waste,
)
from mmdp.tokenizer import get_tokenizer
from mmdp.vqa_dataset import VQADataset


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_args(parser)
    add_loader_args(parser)
    parser.add_argument(
        "--max-length", type=int, default=config.MAX_LENGTH,
        help=f"token budget of a pack, and its padded length (default: {config.MAX_LENGTH})",
    )  # fmt: skip
    parser.add_argument(
        "--max-images", type=int, default=config.MAX_IMAGES,
        help=f"image budget of a pack (default: {config.MAX_IMAGES})",
    )  # fmt: skip
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="images_first_bfd",
        help="packer (default: images_first_bfd)",
    )
    parser.add_argument("--epoch", type=int, default=0, help="which epoch's shuffle (default: 0)")
    parser.add_argument(
        "--save-batch", default=None, help="torch.save the first collated batch to this path"
    )
    return parser.parse_args()


def main():
    args = parse_args()
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")  # started by torchrun: one process per rank
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        print_settings(args)

    # Get the tokenizer, the dataset, and stage 2's tokenized map-style dataset
    tokenizer = get_tokenizer(args.tokenizer)
    rows = load_vqa_dataset(args.dataset, args.subset, args.split, args.num_samples)
    samples = VQADataset(rows, tokenizer)

    # Wrap it: weigh every sample, filter, pack with a token and an image budget, shard
    packed = PackedDataset(
        samples,
        max_length=args.max_length,
        max_images=args.max_images,
        packs_per_batch=args.batch_size,
        strategy=args.strategy,
        seed=args.seed,
    )
    packed.set_epoch(args.epoch)
    loader = PackedDataLoader(packed, num_workers=args.num_workers)

    # Go through one epoch; keep the first batch to show it
    report = PackReport()
    first_batch = None
    start = time.perf_counter()
    for batch in loader:
        if first_batch is None:
            first_batch = batch
        report.add_batch(batch)
    seconds = time.perf_counter() - start

    # One report for all ranks; rows dropped while planning are counted once
    reports = [report]
    if dist.is_initialized():
        reports = [None] * dist.get_world_size()
        dist.all_gather_object(reports, report)
    if rank != 0:
        dist.destroy_process_group()
        return
    report = PackReport.merged(reports)
    report.dropped.update(packed.plan(args.epoch).dropped)

    print("\nOne batch:")
    print_batch(first_batch)
    print(f"\nOver the epoch ({seconds:.1f} s, {report.samples / seconds:,.0f} samples/s):")
    print(report.summary())
    balance = packed.rank_balance()
    if packed.world_size > 1:
        print(
            f"ranks: {balance['world_size']}, batches per rank {balance['batches_per_rank']}, "
            f"image spread between ranks per step: max {balance['image_spread_per_step']['max']}, "
            f"mean {balance['image_spread_per_step']['mean']}"
        )
    if args.metrics_json:
        metrics = {
            **report.as_dict(),
            "batches_per_rank_yielded": [r.batches for r in reports],
            "rank_balance": balance,
            "seconds": round(seconds, 3),
        }
        print(f"Wrote the epoch report to {display_path(write_json(metrics, args.metrics_json))}")
    if args.save_batch:
        torch.save(first_batch, args.save_batch)
        print(f"Saved the first batch to {display_path(args.save_batch)}")

    # Visualize the packing of the first batch: the blog's figure, then next to stage 3
    lengths = real_token_mask(first_batch).sum(dim=1).tolist()
    num_samples = len(first_batch["sample_index"])
    knapsack = {
        "lengths": lengths,
        "width": args.max_length,
        "limit": args.max_length,
        "title": f"Knapsack: {num_samples} samples in {len(lengths)} packs, "
                 f"{waste(lengths, args.max_length):.1%} padding",
    }  # fmt: skip
    fig = plot_padding(**knapsack)
    print(f"Saved the packing figure to {display_path(save_figure(fig, args.out_dir, '05.png'))}")

    constrained_rows = torch.randperm(
        len(samples), generator=torch.Generator().manual_seed(args.seed)
    )
    collate = ConstrainedPadCollator(tokenizer.pad_token_id, args.max_length)
    constrained = collate([samples[int(i)] for i in constrained_rows[: args.batch_size]])
    constrained_lengths = real_token_mask(constrained).sum(dim=1).tolist()
    fig = plot_padding_side_by_side(
        knapsack,
        {
            "lengths": constrained_lengths,
            "width": args.max_length,
            "limit": args.max_length,
            "title": f"Constrained: {len(constrained_lengths)} samples, "
            f"{waste(constrained_lengths, args.max_length):.1%} padding",
        },  # fmt: skip
        title=f"One batch of {args.batch_size} rows of {args.max_length} tokens",
    )
    print(f"Saved the comparison to {display_path(save_figure(fig, args.out_dir, '05_vs_03.png'))}")

    fig = plot_pack_samples(
        first_batch, tokenizer.image_token_id,
        title=f"Knapsack packs: {num_samples} samples, "
              f"{len(first_batch['images'])} images in {len(lengths)} packs of {args.max_length}",
    )  # fmt: skip
    path = save_figure(fig, args.out_dir, "05_samples.png")
    print(f"Saved the samples-per-pack figure to {display_path(path)}")


if __name__ == "__main__":
    with exit_on_user_error():
        main()
