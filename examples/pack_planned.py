"""Stage 5 with mmdp's own loader, PackedDataset: the epoch planned up front from every row's
weight, shared out evenly to torchrun's ranks and DataLoader workers, resumable; for a real VLM,
with videos, and with a report on your own rows. (Stage 5 itself runs the blog's
ConstantLengthDataset, src/mmdp/loading/constant_length.py, and checks it against this loader.)

    uv run examples/pack_planned.py
    uv run examples/pack_planned.py --strategy balanced_greedy   # the blog's own packer
    uv run torchrun --standalone --nproc_per_node 2 examples/pack_planned.py --metrics-json /tmp/05.json
    uv run examples/pack_planned.py --model qwen2_5_vl     # or qwen3_vl, smolvlm, llava_onevision, gemma3
    uv run examples/pack_planned.py --dataset train.jsonl --model qwen2_5_vl   # your rows

PackedDataset weighs every sample once (cached), drops those that cannot fit, packs the rest
(mmdp.packing.packers.pack; default images_first_bfd: a best fit that places the samples with
images first, then fills the packs whose images are used up with text-only samples) and shares
the packs out. Prints one batch and the epoch report (under torchrun: the ranks' balance);
--model adds the synthetic video clips of a family that takes video, what each image and
video costs, and saves assets/05_MODEL.png (what the same images cost every family, how full
each pack is in both budgets); --dataset your rows, used and dropped by reason. About 8 s
(--model qwen2_5_vl: about a minute). examples/pack_{streaming,prepared,mixture}.py run the same
packing from a stream, a prepared dataset, a mixture.
"""

import dataclasses

import numpy as np
import torch.distributed as dist
from matplotlib.figure import Figure

from mmdp import config
from mmdp.data.families import OFFLINE, family_for, offline_processor
from mmdp.data.reading.settings import DataSettings, ModelSettings
from mmdp.data.reading.sources import load_synthetic_videos, with_videos
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
from mmdp.loading.packed_dataset import PackedDataset
from mmdp.packing.packing_config import PackingConfig, default_config
from mmdp.packing.weights import Budgets
from mmdp.ranks import start_ranks
from mmdp.report.epoch import run_packed_epoch, write_outputs
from mmdp.report.pack_report import epoch_metrics
from mmdp.report.plots import (
    CONTENT_HIGHLIGHT,
    LIMIT_COLOUR,
    PADDING_COLOUR,
    display_path,
    save_figure,
    subplots,
)
from mmdp.report.printing import (
    print_epoch_report,
    print_rank_balance,
    print_run_settings,
    print_table,
    print_weighing,
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

    if family.name != "tiny":
        # What each image costs this model and the others, and how full the packs are
        draw_model_figure(epoch["report"], packed, args.out_dir)


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


def plot_model_budgets(
    tokens_per_image: dict,
    tokens_per_row: list,
    patches_per_row: list,
    *,
    model: str,
    budgets: Budgets,
) -> Figure:
    """--model's figure, one panel above the other: what the same images cost each family (tokens
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


def print_videos(report, samples, packing) -> None:
    """The videos packed this epoch (a PackReport's rows of a VQADataset's `samples`):
    how many, the tokens and patches each costs (from their headers), and their share of the
    packs' patch budget (a PackingConfig's); nothing for a dataset without videos."""
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


def print_your_rows(report, weights, packing, dataset: str) -> None:
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


def print_image_costs(costs: list[tuple[int, int]]) -> None:
    """--model: the (tokens, patches) of each image of the rows, as min / median / max;
    rows without images (videos, text only) say so."""
    if not costs:
        print(f"{'tokens per image:':<18}no images in these rows")
        return
    tokens, patches = (np.array(values) for values in zip(*costs))
    print(
        f"{'tokens per image:':<18}min {tokens.min()}, median {np.median(tokens):.0f}, "
        f"max {tokens.max()} ({len(tokens):,} images; patches: min {patches.min()}, "
        f"median {np.median(patches):.0f}, max {patches.max()})"
    )


if __name__ == "__main__":
    with exit_on_user_error():
        main()
