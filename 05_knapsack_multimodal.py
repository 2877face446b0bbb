"""Stage 5 of the blog, "Knapsacks for Multimodal Data": pack samples under a token budget and an
image budget, each pack padded to a fixed length, ready for a trainer.

    uv run 05_knapsack_multimodal.py
    uv run 05_knapsack_multimodal.py --strategy balanced_greedy   # the blog's own packer
    uv run 05_knapsack_multimodal.py --max-images 4               # the image budget binds
    uv run torchrun --nproc_per_node 2 05_knapsack_multimodal.py --metrics-json /tmp/05.json
    uv run 05_knapsack_multimodal.py --model qwen2_5_vl     # or qwen3_vl, smolvlm, llava_onevision, gemma3

The blog's ConstantLengthDataset packs in a producer thread as it reads; PackedDataset does the
same job planned up front: it weighs every sample once, drops those that cannot fit, packs the
rest (mmdp.pack) and shares the packs out to ranks and DataLoader workers. The blog packs with
_balanced_greedy_knapsack (Eagle 2's): --strategy balanced_greedy. The default,
images_first_bfd, is a best fit that places the samples with images first, then fills the packs
whose images are used up with text-only samples (why: README, stage 5).

Prints one batch and the epoch report, and saves assets/05.png (the blog's figure), 05_vs_03.png
(beside stage 3's batch) and 05_samples.png (each sample of each pack); about 8 s. --model packs
for a real vision-language model (assets/05_MODEL.png), --dataset your own rows
(docs/your-own-data.md); examples/pack_{streaming,prepared,mixture}.py run the same packing.
"""

import dataclasses

import torch.distributed as dist

from mmdp import (
    OFFLINE,
    DataSettings,
    ModelSettings,
    PackedDataset,
    PackingConfig,
    VQADataset,
    config,
    default_config,
    family_for,
    load_synthetic_videos,
    offline_processor,
    real_token_mask,
    stage3_batch,
    start_ranks,
    with_videos,
)
from mmdp.errors import exit_on_user_error
from mmdp.flags import (
    FAMILY_BUDGETS,
    EpochSettings,
    Figures,
    LoaderSettings,
    flag_values,
    parse_flags,
)
from mmdp.report import (
    display_path,
    epoch_metrics,
    plot_model_budgets,
    plot_pack_samples,
    plot_padding,
    plot_padding_side_by_side,
    print_epoch_report,
    print_image_costs,
    print_rank_balance,
    print_run_settings,
    print_videos,
    print_weighing,
    print_your_rows,
    run_packed_epoch,
    save_figure,
    waste_title,
    write_outputs,
)


@dataclasses.dataclass(frozen=True)
class Settings:
    data: DataSettings = DataSettings(num_rows=config.DEFAULT_NUM_ROWS)
    loader: LoaderSettings = LoaderSettings()
    model: ModelSettings = ModelSettings()
    # the budgets not given are the model family's (default_config)
    packing: PackingConfig = config.setting(PackingConfig(max_length=None), shown=FAMILY_BUDGETS)
    run: EpochSettings = EpochSettings()
    pretokenize: bool = config.setting(
        False,
        "keep every sample's tokens from the weighing pass (cached), so that building a pack "
        "only slices them and decodes images",
    )
    video_rows: int = config.setting(
        config.DEFAULT_VIDEO_ROWS,
        "synthetic video clips added to the embedded dataset for a --model that takes video "
        "(qwen2_5_vl, qwen3_vl, llava_onevision)",
        min=0,
    )
    figures: Figures = Figures()


def main(argv=None):
    settings = parse_flags(Settings, __doc__, argv)
    args = flag_values(settings)
    rank = start_ranks()

    # The model's processor: the blog's tokenizer for TinyVLM, or a real model's (built offline),
    # and the budgets of a pack: the flags given, the family's for the others
    processor = settings.model.load_processor(settings.loader.tokenizer)
    family = family_for(processor)
    packing = default_config(family, **settings.packing.settings())
    if rank == 0:
        print_run_settings(args, packing, family.name)

    # Get the dataset, and stage 2's tokenized map-style dataset
    rows = settings.data.load()
    if args.dataset is None and args.video_rows > 0 and family.video_token:
        # A family that takes video packs the synthetic clips with the embedded rows
        rows = with_videos(rows, load_synthetic_videos(args.video_rows))
    samples = VQADataset(rows, processor)

    # Wrap it: weigh every sample, filter, pack with a token and an image budget, shard
    packed = PackedDataset(samples, config=packing, pretokenize=args.pretokenize)
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
        draw_figures(epoch["first_batch"], packed, args.out_dir)
    else:
        # What each image costs this model and the others, and how full the packs are
        draw_model_figure(epoch["report"], packed, args.out_dir)


def draw_figures(batch: dict, packed: PackedDataset, out_dir: str) -> None:
    """assets/05.png (the blog's figure), 05_vs_03.png (beside stage 3's), 05_samples.png."""
    samples, max_length = packed.dataset, packed.config.max_length

    def panel(title: str, lengths: list[int]) -> dict:  # real tokens and padding, per row
        return {"lengths": lengths, "width": max_length, "limit": max_length,
                "title": waste_title(title, lengths, max_length)}  # fmt: skip

    lengths = real_token_mask(batch).sum(dim=1).tolist()
    num_samples = len(batch["sample_index"])
    knapsack = panel(f"Knapsack: {num_samples} samples in {len(lengths)} packs", lengths)
    fig = plot_padding(**knapsack)
    print(f"Saved the packing figure to {display_path(save_figure(fig, out_dir, '05.png'))}")

    # Stage 3's batch, as 03.png shows it with the same flags: the same samples, padded
    constrained = stage3_batch(samples, packed.weights.lengths, max_length=max_length,
                               batch_size=config.BATCH_SIZE, seed=packed.config.seed)  # fmt: skip
    kept, dropped = len(constrained["sample_index"]), sum(constrained["dropped"].values())
    constrained_lengths = real_token_mask(constrained).sum(dim=1).tolist()
    fig = plot_padding_side_by_side(
        knapsack,
        panel(f"Constrained: {kept} samples ({dropped} dropped)", constrained_lengths),
        title=f"One batch of rows of {max_length} tokens: the knapsack packs {num_samples} "
        f"samples, constrained padding keeps {kept} of {kept + dropped}",
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


def draw_model_figure(report, packed: PackedDataset, out_dir: str) -> None:
    """assets/05_MODEL.png: what the dataset's images cost each family (tokens per image, from
    their headers), and how full this run's packs are in both budgets. Prints the chosen
    family's tokens and patches per image."""
    samples, packing = packed.dataset, packed.config
    images = [row["images"] for row in samples.dataset]
    mine = samples.family.image_costs(images)
    print_image_costs(mine)
    costs = {}  # rows without images (videos, text): no family's costs to compare
    if mine:
        costs = {name: family_for(offline_processor(name)).image_costs(images) for name in OFFLINE}
        costs = {"tiny": [(config.IMAGE_TOKEN_LENGTH, config.IMAGE_TOKEN_LENGTH)], **costs}
    model = samples.family.name
    fig = plot_model_budgets(
        {name: [t for t, _ in per_image] for name, per_image in costs.items()},
        report.tokens_per_row,
        report.patches_per_row,
        model=model,
        budgets=packing.budgets,
    )
    fig.suptitle(
        f"Knapsacks for {model}: {len(report.tokens_per_row):,} packs of {packing.max_length:,} "
        f"tokens and {packing.max_patches or 0:,} patches, {report.utilization:.1%} of the tokens real"
    )
    fig.tight_layout()  # again, with the title
    path = save_figure(fig, out_dir, f"05_{model}.png")
    print(f"Saved the costs and budgets figure to {display_path(path)}")


if __name__ == "__main__":
    with exit_on_user_error():
        main()
