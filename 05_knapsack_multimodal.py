"""Stage 5 of the blog, "Knapsacks for Multimodal Data": pack samples under a token budget and an
image budget with the blog's ConstantLengthDataset (src/mmdp/loading/constant_length.py).

    uv run 05_knapsack_multimodal.py
    uv run 05_knapsack_multimodal.py --max-images 4         # the image budget binds
    uv run 05_knapsack_multimodal.py --model qwen2_5_vl     # or another real VLM (MODELS)

Reads stage 2's samples, drops those over a budget (counted by reason), packs the others with
the blog's balanced greedy knapsack in a producer thread, positions restarting at every sample.
Prints one batch and the epoch, then one line checking the same rows against mmdp's own loader,
PackedDataset; saves assets/05.png (the blog's figure), 05_vs_03.png (beside stage 3's batch),
05_samples.png (each sample of each pack). About 15 s. examples/pack_planned.py: torchrun, videos.
"""

import dataclasses

from torch.utils.data import DataLoader

from mmdp import config
from mmdp.batch import real_token_mask
from mmdp.data.padding import stage3_batch
from mmdp.data.reading.settings import DataSettings, ModelSettings
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import exit_on_user_error
from mmdp.flags import (
    FAMILY_BUDGETS,
    EpochSettings,
    Figures,
    LoaderSettings,
    flag_values,
    parse_flags,
)
from mmdp.loading.constant_length import OVER_BUDGET, ConstantLengthDataset
from mmdp.loading.packed_dataset import PackedDataset
from mmdp.packing.packing_config import PackingConfig, default_config
from mmdp.report.epoch import PACKING_HINT, run_epoch, write_outputs
from mmdp.report.model_plots import plot_pack_samples
from mmdp.report.pack_report import PackReport
from mmdp.report.plots import (
    display_path,
    plot_padding,
    plot_padding_side_by_side,
    save_figure,
    waste_title,
)
from mmdp.report.printing import print_epoch_report, print_settings


@dataclasses.dataclass(frozen=True)
class Settings:
    data: DataSettings = DataSettings(num_rows=config.DEFAULT_NUM_ROWS)
    loader: LoaderSettings = LoaderSettings()
    model: ModelSettings = ModelSettings()
    # the budgets not given are the model family's (default_config)
    packing: PackingConfig = config.setting(
        PackingConfig(max_length=None),
        flags=("max_length", "max_images", "max_patches", "packs_per_batch", "seed"),
        shown=FAMILY_BUDGETS,
    )
    run: EpochSettings = EpochSettings()
    figures: Figures = Figures()


def main(argv=None):
    settings = parse_flags(Settings, __doc__, argv)
    args = flag_values(settings)

    # Get the dataset, and stage 2's tokenized map-style dataset: the blog's tokenizer for
    # TinyVLM, or a real model's processor (built offline)
    processor = settings.model.load_processor(settings.loader.tokenizer)
    samples = VQADataset(settings.data.load(), processor)

    # A pack's budgets: 512 tokens and 18 images for TinyVLM (the blog's seq_length and
    # max_images_per_knapsack), a real VLM's own (tokens, vision-encoder patches)
    packing = default_config(samples.family, **settings.packing.settings())
    print_settings(args, packing)

    # Wrap it: the blog's ConstantLengthDataset reads the samples, filters them, packs them
    # with the balanced greedy knapsack in a producer thread, and shards over the workers
    dataset = ConstantLengthDataset(samples, max_length=packing.max_length,
                                    max_images=packing.max_images,
                                    max_patches=packing.max_patches, seed=packing.seed)  # fmt: skip
    dataset.set_epoch(args.epoch)
    loader = DataLoader(dataset, batch_size=packing.packs_per_batch,
                        collate_fn=dataset.collate, num_workers=args.num_workers)  # fmt: skip

    # Go through one epoch; show its first batch and what it packed
    report = PackReport()
    first_batch, seconds = run_epoch(loader, report, hint=PACKING_HINT)
    epoch = {"first_batch": first_batch, "report": report, "seconds": seconds}
    print_epoch_report(epoch, packing.budgets)
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
                               batch_size=config.BATCH_SIZE, seed=packed.config.seed)  # fmt: skip
    kept, dropped = len(constrained["sample_index"]), sum(constrained["dropped"].values())
    padded = real_token_mask(constrained).sum(dim=1).tolist()
    fig = plot_padding_side_by_side(
        knapsack,
        panel(f"Constrained, one batch: {kept} samples ({dropped} dropped)", padded),
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
    """PackedDataset's plan, from token and image counts, no pixel read: its packs, their real
    tokens, and whether it packs the knapsack's samples (a row failing when built aside)."""
    packed = PackedDataset(samples, config=packing)
    plan = packed.plan()
    packs = len(plan.pack_starts) - 1
    utilization = packed.weights.lengths[plan.rows].sum() / (packs * packing.max_length)
    failed = {row for row, reason in report.dropped_rows if reason not in OVER_BUDGET}
    same = set(plan.rows.tolist()) - failed == set(report.sample_index)
    print(
        "\nChecked against mmdp's own loader (planned up front, every rank equal, resumable):\n"
        f"PackedDataset ({packing.strategy}): {packs:,} packs, {utilization:.1%} real tokens; "
        f"the knapsack above: {len(report.tokens_per_row):,} packs, {report.utilization:.1%}; "
        f"{'the same' if same else 'NOT the same'} {report.samples:,} samples"
    )
    return packed


if __name__ == "__main__":
    with exit_on_user_error():
        main()
