"""Stage 5 of the blog, "Knapsacks for Multimodal Data": pack samples under a token budget and an
image budget, each pack padded to a fixed length, ready for a trainer.

    uv run 05_knapsack_multimodal.py
    uv run 05_knapsack_multimodal.py --max-length 1024 --save-batch /tmp/batch.pt
    uv run torchrun --nproc_per_node 2 05_knapsack_multimodal.py --metrics-json /tmp/05.json
    uv run 05_knapsack_multimodal.py --streaming --buffer-size 1024
    uv run 05_knapsack_multimodal.py --prepared s3://bucket/prepared   # from uv run -m mmdp.prepare
    uv run 05_knapsack_multimodal.py --model qwen2_5_vl     # or qwen3_vl, smolvlm, llava_onevision, gemma3
    uv run 05_knapsack_multimodal.py --mixture examples/mixture.json
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

With --mixture FILE.json, the rows come from several sources, each with its share of the epoch
(by tokens by default), a loss weight and a label policy (mmdp.data.mixture; the embedded
synthetic data offers one source per task, `synthetic:describe` ...). The report adds a line per
source: rows, drops by reason, tokens, and the share asked vs realised, overall and per rank.

With --streaming, the same stage reads the dataset as a stream (a Hub dataset with
streaming=True, parquet files one by one) and packs it a buffer at a time, as the blog's
ConstantLengthDataset does (mmdp.packing.loading.streaming.loader): same report, figures and
--metrics-json keys, plus the rows still held when the ranks stopped together.
"""

import argparse

import numpy as np
import torch
import torch.distributed as dist

from mmdp import config
from mmdp.cli import (
    add_data_args,
    add_loader_args,
    add_model_and_budget_args,
    description,
    display_path,
    non_negative_int,
    nothing_to_do,
    packing_config,
    positive_int,
    print_batch,
    print_settings,
    print_table,
    run_epoch,
)
from mmdp.data.families import MODELS, OFFLINE, family_for, load_processor, offline_processor
from mmdp.data.mixture import (
    MixedRows,
    load_mixture,
    read_mixture,
)
from mmdp.data.padding import ConstrainedPadCollator
from mmdp.data.reading.sources import load_synthetic_videos, load_vqa_dataset, with_videos
from mmdp.data.reading.stream import load_vqa_stream
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.drop_reasons import HELD_WHEN_RANKS_STOPPED
from mmdp.errors import exit_on_user_error
from mmdp.packing.loading.batch import real_token_mask
from mmdp.packing.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.loading.streaming.loader import StreamingDataLoader, StreamingPackedDataset
from mmdp.packing.packers import STRATEGIES
from mmdp.packing.packing_config import default_config
from mmdp.packing.planning.mixture_plan import MixturePlan
from mmdp.packing.planning.planner import batch_loads
from mmdp.packing.weighing.prepared import read_manifest
from mmdp.ranks import start_ranks
from mmdp.report.metrics import PackReport, rank_balance, write_json
from mmdp.report.mixture import format_source_report, source_report
from mmdp.report.plots import (
    plot_model_budgets,
    plot_pack_samples,
    plot_padding,
    plot_padding_side_by_side,
    save_figure,
    waste_title,
)


def parse_args():
    parser = argparse.ArgumentParser(description=description(__doc__))
    add_data_args(parser)
    add_loader_args(parser)
    add_model_and_budget_args(parser, MODELS)
    parser.add_argument(
        "--packs-per-batch",
        type=positive_int,
        default=config.PACKS_PER_BATCH,
        help=f"packs per batch, one pack a row (default: {config.PACKS_PER_BATCH})",
    )
    parser.add_argument(
        "--processor",
        default=None,
        help="a Hub name or local path of a real model's processor (needs a network for a Hub "
        "name); default: --model's processor built offline",
    )
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="images_first_bfd",
        help="packer (default: images_first_bfd)",
    )
    parser.add_argument(
        "--buffer-size",
        type=positive_int,
        default=4096,
        help="rows packed together, the shuffle window (default: 4096)",
    )
    parser.add_argument(
        "--streaming",
        action="store_true",
        help="read the dataset as a stream and pack it buffer by buffer (mmdp.packing.loading.streaming.loader)",
    )
    parser.add_argument(
        "--epoch", type=non_negative_int, default=0, help="which epoch's shuffle (default: 0)"
    )
    parser.add_argument(
        "--pretokenize",
        action="store_true",
        help="keep every sample's tokens from the weighing pass (cached), so that building a pack "
        "only slices them and decodes images",
    )
    parser.add_argument(
        "--prepared",
        default=None,
        help="read the weights (and tokens) that `uv run -m mmdp.prepare --out URL` wrote to this "
        "path or fsspec URL, and weigh nothing; the budgets not given are its own",
    )
    parser.add_argument(
        "--save-batch", default=None, help="torch.save the first collated batch to this path"
    )
    parser.add_argument(
        "--video-rows",
        type=non_negative_int,
        default=config.DEFAULT_VIDEO_ROWS,
        help="synthetic video clips added to the embedded dataset for a --model that takes video "
        f"(qwen2_5_vl, qwen3_vl, llava_onevision; default: {config.DEFAULT_VIDEO_ROWS})",
    )
    parser.add_argument(
        "--mixture",
        default=None,
        help="a JSON file of sources with shares, loss weights and label policies (see "
        "mmdp.data.mixture; examples/mixture.json); replaces --dataset",
    )
    args = parser.parse_args()
    if args.mixture and (args.streaming or args.dataset):
        parser.error(
            "--mixture names its own datasets, and is planned: not with --dataset or --streaming"
        )
    if args.streaming and args.pretokenize:
        parser.error("--pretokenize needs the whole dataset weighed first: not with --streaming")
    if args.streaming and args.prepared:
        parser.error("--prepared holds the weights of a whole dataset: not with --streaming")
    return args


def main():
    args = parse_args()
    rank = start_ranks()

    # The model's processor: the blog's tokenizer for TinyVLM, or a real model's (built offline)
    processor = model_processor(args)
    if rank == 0:
        print_settings(args)
    if args.streaming:
        # Or read the dataset as a stream, pack it a buffer at a time, stop the ranks together
        epoch, samples = run_streaming_epoch(processor, args)
    else:
        # Get the dataset (or the mixture's sources), and stage 2's tokenized map-style dataset
        mixed = load_sources(args)
        rows = (
            mixed.dataset
            if mixed
            else load_vqa_dataset(
                args.dataset,
                args.subset,
                args.split,
                args.num_rows,
                image_root=args.image_root,
                format=args.format,
            )
        )
        if takes_synthetic_videos(processor, args, mixed):
            # A family that takes video packs the synthetic clips with the rows
            rows = with_videos(rows, load_synthetic_videos(args.video_rows))
        samples = VQADataset(rows, processor, mixture=mixed)

        # Wrap it: weigh every sample, filter, pack with a token and an image budget, shard
        packed = PackedDataset(
            samples,
            packing_config(args),
            pretokenize=args.pretokenize,
            prepared=args.prepared,
            mixture=MixturePlan.of(mixed, seed=args.seed) if mixed else None,
        )
        packed.set_epoch(args.epoch)
        if rank == 0:
            print_weighing(packed)

        # Go through one epoch on every rank; rank 0 reports for all of them
        epoch = run_packed_epoch(packed, args)
        if mixed:
            epoch["sources"] = report_sources(mixed, packed, epoch["reports"], args)
            epoch["share_by"] = mixed.mixture.share_by
        epoch["weights"] = packed.weights
    if rank != 0:
        dist.destroy_process_group()
        return
    print("\nOne batch:")
    print_batch(epoch["first_batch"])
    print_report(epoch, args)
    if not args.streaming:
        print_videos(epoch["report"], samples, args)
    if args.dataset and not args.streaming:
        # Your own rows: what would be dropped and why, and what a sample of them weighs
        print_your_rows(epoch["report"], epoch["weights"], args)
    write_outputs(epoch, args)

    if args.model == "tiny":
        # Visualize the packing of the first batch: the blog's figure, then next to stage 3
        draw_figures(epoch["first_batch"], samples, args)
    else:
        # What each image costs this model and the others, and how full the packs are
        draw_model_figure(epoch["report"], samples, args)


def takes_synthetic_videos(processor, args, mixed) -> bool:
    """Whether to add the synthetic clips: the embedded dataset, a family that takes video."""
    embedded = args.dataset is None and mixed is None and not args.prepared
    return embedded and args.video_rows > 0 and bool(family_for(processor).video_token)


def print_videos(report: PackReport, samples: VQADataset, args) -> None:
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
    budget = len(report.patches_per_row) * args.max_patches if args.max_patches else 0
    share = f", {patches.sum() / budget:.1%} of the packs' patch budget" if budget else ""
    print(
        f"{'videos packed:':<18}{len(costs):,} (tokens per video: min {tokens.min()}, median "
        f"{np.median(tokens):.0f}, max {tokens.max()}; patches per video: min {patches.min()}, "
        f"median {np.median(patches):.0f}, max {patches.max()}; {patches.sum():,} patches"
        f"{share})"
    )


def print_your_rows(report: PackReport, weights, args) -> None:
    """--dataset: the rows used and dropped, by reason (read from the headers and the text when
    weighed, or found when a pack was built), and the tokens, images and patches of a sample of
    the usable rows, by percentile: what a user needs to know before spending GPU hours."""
    print(f"\nYour rows ({args.dataset}):")
    counts = [["used (samples)", report.samples]]
    counts += [[reason, n] for reason, n in sorted(report.dropped.items(), key=lambda kv: -kv[1])]
    print_table(["rows", "count"], counts, ["", ","])
    usable = weights.reasons == 0
    if not usable.any():
        return
    quantiles = (0, 50, 90, 99, 100)
    columns = {"tokens": weights.lengths, "images": weights.image_counts}
    if args.max_patches:
        columns["patches"] = weights.patch_counts
    table = [
        [f"{name} per sample", *np.percentile(values[usable], quantiles, method="lower")]
        for name, values in columns.items()
    ]
    print_table(
        ["usable rows", "min", "p50", "p90", "p99", "max"], table, ["", ",.0f"] + [",.0f"] * 4
    )
    budgets = f"max_length {args.max_length:,}" + (
        f", max_patches {args.max_patches:,}" if args.max_patches else ""
    )
    print(f"   budgets: {budgets}, max_images {args.max_images} (a sample over one is dropped)")


def load_sources(args) -> MixedRows | None:
    """--mixture: every source's rows one after the other (None without a mixture)."""
    if not args.mixture:
        return None
    return load_mixture(read_mixture(args.mixture), args.num_rows or config.DEFAULT_NUM_ROWS)


def report_sources(mixed: MixedRows, packed: PackedDataset, reports: list, args) -> list[dict]:
    """Per source: rows, drops by reason, tokens, share asked vs realised (overall, per rank)."""
    return source_report(
        mixed,
        packed.mixture,
        packed.weights,
        [report.sample_index for report in reports],
        budgets=packed.config.budgets,
        epoch=packed.epoch,
        report_by_source=PackReport.merged(reports).by_source(),
    )


def model_processor(args):
    """--model's processor (TinyVLM: the --tokenizer), or --processor's; the budgets the family
    sets when none is given."""
    if args.processor:
        processor = load_processor(args.processor)
    elif args.model == "tiny":
        processor = get_tokenizer(args.tokenizer)
    else:
        processor = offline_processor(args.model)
    family = family_for(processor)
    args.model = family.name
    if args.prepared:  # the budgets the prepared rows were checked against, unless given
        manifest = read_manifest(args.prepared)
        args.max_length = args.max_length or manifest["max_length"]
        args.max_patches = args.max_patches or manifest["max_patches"]
    # the family's budgets, where no flag (or prepared manifest) gives one
    budgets = default_config(family, max_length=args.max_length, max_patches=args.max_patches)
    args.max_length, args.max_patches = budgets.max_length, budgets.max_patches
    return processor


def print_weighing(packed: PackedDataset) -> None:
    weighing = packed.weighing
    if packed.prepared:
        print(
            f"Read the prepared weights of {len(weighing.weights):,} rows from {packed.prepared} "
            f"in {weighing.seconds:.2f} s (weighed nothing)"
        )
        return
    if weighing.weighed_here:
        how = f"Weighed {weighing.rows_weighed_here:,} of {len(weighing.weights):,} rows here"
    else:
        how = f"Loaded the weights of {len(weighing.weights):,} rows"
    print(f"{how} in {weighing.seconds:.2f} s (cached in {display_path(weighing.path)})")


def run_packed_epoch(packed: PackedDataset, args) -> dict:
    """One epoch through the loader, on this rank; on rank 0, the report merged over ranks.

    Rows dropped while planning are counted once, in the merged report.
    """
    hint = "raise --max-length or --max-images, or use more --num-rows"
    if packed.num_batches() == 0:
        raise nothing_to_do(len(packed.weights), packed.plan().dropped, hint)
    loader = PackedDataLoader(packed, num_workers=args.num_workers)
    report = PackReport()
    first_batch, seconds = run_epoch(loader, report, hint=hint)
    report.add_loader(loader)  # the plan's drops (and, for a mixture, of each source)
    reports, weighed = [report], [packed.weighing.rows_weighed_here]
    if dist.is_initialized():
        reports = [None] * dist.get_world_size()
        dist.all_gather_object(reports, report)
        weighed = [None] * dist.get_world_size()
        dist.all_gather_object(weighed, packed.weighing.rows_weighed_here)
    merged = PackReport.merged(reports)
    return {
        "report": merged,
        "reports": reports,
        "first_batch": first_batch,
        "seconds": seconds,
        "rank_balance": rank_balance(batch_loads(packed.plan(), packed.weights), packed.world_size),
        "weighing": {
            "seconds": round(packed.weighing.seconds, 3),
            "rows_weighed_per_rank": weighed,
        },
    }


def run_streaming_epoch(processor, args) -> tuple[dict, VQADataset]:
    """--streaming: one epoch over the dataset read as a stream, on this rank (every rank stops
    at the same step); on rank 0, the report merged over ranks. Also returns rows from the head
    of the stream, for the figure beside constrained padding."""
    stream = load_vqa_stream(
        args.dataset,
        args.subset,
        args.split,
        args.num_rows,
        image_root=args.image_root,
        format=args.format,
    )
    packed = StreamingPackedDataset(stream, processor, packing_config(args))
    loader = StreamingDataLoader(packed, num_workers=args.num_workers)
    loader.set_epoch(args.epoch)
    report, steps = PackReport(), []

    def batches():
        for batch in loader:
            loads = (
                real_token_mask(batch).sum(),
                batch["sample_of_image"].numel(),
                batch["patches_per_row"].sum(),
            )
            steps.append(tuple(int(load) for load in loads))
            yield batch
        report.add_loader(loader)  # rows read after the last batch, or held

    hint = "raise --max-length or --max-images, or use more --num-rows"
    first_batch, seconds = run_epoch(batches(), report, hint=hint)
    reports, steps_per_rank = [report], [steps]
    if dist.is_initialized():
        reports = [None] * dist.get_world_size()
        steps_per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(reports, report)
        dist.all_gather_object(steps_per_rank, steps)
    # every rank stopped at the same step: [step][rank] (tokens, images, patches)
    loads = np.array(list(zip(*steps_per_rank)), dtype=np.int64).reshape(-1, len(reports), 3)
    names = ("tokens", "images", "patches")
    epoch = {
        "report": PackReport.merged(reports),
        "reports": reports,
        "first_batch": first_batch,
        "seconds": seconds,
        "rank_balance": rank_balance(
            {name: loads[..., k] for k, name in enumerate(names)}, len(reports)
        ),
    }
    # rows from the head of the stream, for the batch beside constrained padding (rank 0 draws)
    head = [] if dist.is_initialized() and dist.get_rank() > 0 else list(stream.take(FIGURE_ROWS))
    return epoch, VQADataset(head, processor)


FIGURE_ROWS = 256  # rows from the head of a stream to draw the constrained-padding batch from


def print_report(epoch: dict, args) -> None:
    report, seconds = epoch["report"], epoch["seconds"]
    print(f"\nOver the epoch ({seconds:.1f} s, {report.samples / seconds:,.0f} samples/s):")
    print(report.summary(args.max_patches))
    if HELD_WHEN_RANKS_STOPPED in report.dropped:
        print(f"({HELD_WHEN_RANKS_STOPPED}: read, not yielded: another rank ran out first)")
    if "sources" in epoch:
        print(f"\nThe mixture ({epoch['share_by']}):")
        print(format_source_report(epoch["sources"], epoch["share_by"]))
    balance = epoch["rank_balance"]
    if balance["world_size"] > 1:
        print(
            f"ranks: {balance['world_size']}, batches per rank {balance['batches_per_rank']}, "
            f"image spread between ranks per step: max {balance['image_spread_per_step']['max']}, "
            f"mean {balance['image_spread_per_step']['mean']}"
        )


def write_outputs(epoch: dict, args) -> None:
    """--metrics-json (the merged epoch report) and --save-batch (the first batch, as is)."""
    if args.metrics_json:
        metrics = {
            **epoch["report"].as_dict(),
            "batches_per_rank_yielded": [r.batches for r in epoch["reports"]],
            "rank_balance": epoch["rank_balance"],
            "seconds": round(epoch["seconds"], 3),
        }
        if "sources" in epoch:  # --mixture
            metrics["mixture"] = {"share_by": epoch["share_by"], "sources": epoch["sources"]}
        if "weighing" in epoch:  # planned: the rows were weighed (or loaded) up front
            metrics["weighing"] = epoch["weighing"]
        print(f"Wrote the epoch report to {display_path(write_json(metrics, args.metrics_json))}")
    if args.save_batch:
        torch.save(epoch["first_batch"], args.save_batch)
        print(f"Saved the first batch to {display_path(args.save_batch)}")


def draw_figures(batch: dict, samples: VQADataset, args) -> None:
    """assets/05.png (the blog's figure), 05_vs_03.png (beside constrained padding), and
    05_samples.png (where each sample and image sits in its pack)."""
    lengths = real_token_mask(batch).sum(dim=1).tolist()
    num_samples = len(batch["sample_index"])
    knapsack = {
        "lengths": lengths,
        "width": args.max_length,
        "limit": args.max_length,
        "title": waste_title(
            f"Knapsack: {num_samples} samples in {len(lengths)} packs", lengths, args.max_length
        ),
    }
    fig = plot_padding(**knapsack)
    print(f"Saved the packing figure to {display_path(save_figure(fig, args.out_dir, '05.png'))}")

    # The same number of rows with stage 3's constrained padding, from the same seed
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(args.seed))
    collate = ConstrainedPadCollator(samples.family.pad_token_id, args.max_length)
    constrained = collate([samples[int(i)] for i in order[: args.packs_per_batch]])
    constrained_lengths = real_token_mask(constrained).sum(dim=1).tolist()
    constrained_panel = {
        "lengths": constrained_lengths,
        "width": args.max_length,
        "limit": args.max_length,
        "title": waste_title(
            f"Constrained: {len(constrained_lengths)} samples", constrained_lengths, args.max_length
        ),
    }
    fig = plot_padding_side_by_side(
        knapsack,
        constrained_panel,
        title=f"One batch of {args.packs_per_batch} rows of {args.max_length} tokens",
    )
    print(f"Saved the comparison to {display_path(save_figure(fig, args.out_dir, '05_vs_03.png'))}")

    fig = plot_pack_samples(
        batch,
        samples.family.feature_token_id,
        title=f"Knapsack packs: {num_samples} samples, "
        f"{len(batch['pixel_values'])} images in {len(lengths)} packs of {args.max_length}",
    )
    path = save_figure(fig, args.out_dir, "05_samples.png")
    print(f"Saved the samples-per-pack figure to {display_path(path)}")


def draw_model_figure(report: PackReport, samples: VQADataset, args) -> None:
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
    fig = plot_model_budgets(
        {name: [t for t, _ in per_image] for name, per_image in costs.items()},
        report.tokens_per_row,
        report.patches_per_row,
        model=args.model,
        max_length=args.max_length,
        max_patches=args.max_patches,
    )
    path = save_figure(fig, args.out_dir, f"05_{args.model}.png")
    print(f"Saved the costs and budgets figure to {display_path(path)}")


if __name__ == "__main__":
    with exit_on_user_error():
        main()
