"""Stage 5 of the blog, "Knapsacks for Multimodal Data": pack samples under a token budget and an
image budget with the blog's ConstantLengthDataset (src/mmdp/loading/constant_length.py).

    uv run 05_knapsack_multimodal.py
    uv run 05_knapsack_multimodal.py --max-images 4         # the image budget binds
    uv run 05_knapsack_multimodal.py --model qwen2_5_vl     # or another real VLM (MODELS)

Reads stage 2's samples, drops those over a budget (counted by reason), packs the others with
the blog's balanced greedy knapsack in a producer thread and lays each pack out with positions
restarting at every sample. Prints one batch and the epoch's numbers, then one line checking the
same rows against mmdp's own loader, PackedDataset; saves assets/05.png (the blog's figure),
05_vs_03.png (beside stage 3's batch) and 05_samples.png (each sample of each pack), TinyVLM's
only. About 15 s. Under torchrun, with videos, a real VLM's costs: examples/pack_planned.py.
"""

import argparse

from torch.utils.data import DataLoader

from mmdp.batch import real_token_mask
from mmdp.config import BATCH_SIZE, PACKS_PER_BATCH
from mmdp.data.families import MODELS
from mmdp.data.padding import stage3_batch
from mmdp.data.reading.settings import DataSettings
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import exit_on_user_error
from mmdp.flags import (
    add_data_args,
    add_loader_args,
    add_model_and_budget_args,
    config_for,
    description,
    display_path,
    model_processor,
    positive_int,
    settings_of,
)
from mmdp.loading.constant_length import OVER_BUDGET, ConstantLengthDataset
from mmdp.loading.packed_dataset import PackedDataset
from mmdp.report.epoch import PACKING_HINT, run_epoch, write_outputs
from mmdp.report.model_plots import plot_pack_samples
from mmdp.report.pack_report import PackReport
from mmdp.report.plots import plot_padding, plot_padding_side_by_side, save_figure, waste_title
from mmdp.report.printing import print_batch, print_settings


def parse_args():
    parser = argparse.ArgumentParser(description=description(__doc__))
    add_data_args(parser)
    add_loader_args(parser)
    add_model_and_budget_args(parser, MODELS)
    parser.add_argument("--packs-per-batch", type=positive_int, default=PACKS_PER_BATCH,
                        help=f"packs a batch, one a row (default: {PACKS_PER_BATCH})")  # fmt: skip
    parser.add_argument("--save-batch", help="torch.save the first batch to this path")
    return parser.parse_args()


def main():
    args = parse_args()

    # Get the dataset, and stage 2's tokenized map-style dataset: the blog's tokenizer for
    # TinyVLM, or a real model's processor (built offline)
    rows = settings_of(DataSettings, args).load()
    samples = VQADataset(rows, model_processor(args))

    # A pack's budgets: 512 tokens and 18 images for TinyVLM (the blog's seq_length and
    # max_images_per_knapsack), a real VLM's own (tokens, vision-encoder patches)
    packing = config_for(samples.family, args)
    print_settings(args, packing)

    # Wrap it: the blog's ConstantLengthDataset reads the samples, filters them, packs them
    # with the balanced greedy knapsack in a producer thread, and shards over the workers
    dataset = ConstantLengthDataset(samples, max_length=packing.max_length,
                                    max_images=packing.max_images,
                                    max_patches=packing.max_patches, seed=args.seed)  # fmt: skip
    loader = DataLoader(dataset, batch_size=packing.packs_per_batch,
                        collate_fn=dataset.collate, num_workers=args.num_workers)  # fmt: skip

    # Go through one epoch; keep the first batch to show it
    report = PackReport()
    first_batch, seconds = run_epoch(loader, report, hint=PACKING_HINT)
    print("\nOne batch:")
    print_batch(first_batch)
    print(f"\nOver the epoch ({seconds:.1f} s, {report.samples / seconds:,.0f} samples/s):")
    print(report.summary(packing.budgets))
    write_outputs(report.as_dict(), first_batch, args)

    # Check: mmdp's own loader, PackedDataset, plans the same rows up front
    packed = check_against_packed_dataset(samples, packing, report)

    if samples.family.name == "tiny":
        # Visualize the first batch: the blog's figure, beside stage 3's, each sample apart
        draw_figures(first_batch, packed, args.out_dir)


def draw_figures(batch: dict, packed: PackedDataset, out_dir: str) -> None:
    """assets/05.png (the blog's figure), 05_vs_03.png (beside stage 3's), 05_samples.png."""
    samples, max_length = packed.dataset, packed.config.max_length

    def panel(title: str, lengths: list[int]) -> dict:  # real tokens and padding, per row
        return {"lengths": lengths, "width": max_length, "limit": max_length,
                "title": waste_title(title, lengths, max_length)}  # fmt: skip

    lengths = real_token_mask(batch).sum(dim=1).tolist()
    num_samples = len(batch["sample_index"])
    knapsack = panel(f"Knapsack, one batch: {num_samples} samples in {len(lengths)} packs", lengths)
    path = save_figure(plot_padding(**knapsack), out_dir, "05.png")
    print(f"Saved the packing figure to {display_path(path)}")

    # Stage 3's batch, as 03.png shows it: the same rows padded, one over max_length dropped
    constrained = stage3_batch(samples, packed.weights.lengths, max_length=max_length,
                               batch_size=BATCH_SIZE, seed=packed.config.seed)  # fmt: skip
    kept, dropped = len(constrained["sample_index"]), sum(constrained["dropped"].values())
    fig = plot_padding_side_by_side(
        knapsack,
        panel(
            f"Constrained, one batch: {kept} samples ({dropped} dropped)",
            real_token_mask(constrained).sum(dim=1).tolist(),
        ),
        title=f"One batch of rows of {max_length} tokens: the knapsack packs {num_samples} "
        f"samples, constrained padding keeps {kept} of {kept + dropped}",
    )
    path = save_figure(fig, out_dir, "05_vs_03.png")
    print(f"Saved the comparison to {display_path(path)}")

    fig = plot_pack_samples(
        batch,
        samples.family.feature_token_id,
        title=f"Knapsack packs, one batch: {num_samples} samples, {len(batch['pixel_values'])} "
        f"images in {len(lengths)} packs of {max_length} tokens and at most {packed.max_images} images",
    )
    path = save_figure(fig, out_dir, "05_samples.png")
    print(f"Saved the samples-per-pack figure to {display_path(path)}")


def check_against_packed_dataset(samples: VQADataset, packing, report: PackReport):
    """PackedDataset plans an epoch from the samples' token and image counts before it reads a
    pixel: its packs, their share of real tokens, and whether it packs the samples the knapsack
    above packed (but for rows that fail only when built, a broken image, which its loader drops
    too)."""
    print("\nChecked against mmdp's own loader (planned up front, every rank equal, resumable):")
    packed = PackedDataset(samples, config=packing)
    plan = packed.plan()
    packs = len(plan.pack_starts) - 1
    utilization = packed.weights.lengths[plan.rows].sum() / (packs * packing.max_length)
    failed = {row for row, reason in report.dropped_rows if reason not in OVER_BUDGET}
    same = set(plan.rows.tolist()) - failed == set(report.sample_index)
    print(
        f"PackedDataset ({packing.strategy}): {packs:,} packs, {utilization:.1%} real tokens; "
        f"the knapsack above: {len(report.tokens_per_row):,} packs, {report.utilization:.1%}; "
        f"{'the same' if same else 'NOT the same'} {report.samples:,} samples"
    )
    return packed


if __name__ == "__main__":
    with exit_on_user_error():
        main()
