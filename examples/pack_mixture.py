"""Stage 5's packing over a mixture of sources: each source with its share of the epoch (by tokens
by default), a loss weight and a label policy (mmdp.data.mixture; the embedded synthetic data
offers one source per task, `synthetic:describe` ...), every rank given every source's share.

    uv run examples/pack_mixture.py --mixture examples/mixture.json
    uv run torchrun --standalone --nproc_per_node 2 examples/pack_mixture.py \
        --mixture examples/mixture.json --metrics-json /tmp/mixture.json

Prints one batch (with `loss_weights` when a source has a loss weight) and the epoch report of
stage 5 (05_knapsack_multimodal.py), plus a line per source: rows, samples, tokens, the share
asked vs realised (overall and per rank) and drops by reason, also under "mixture" in
--metrics-json.
"""

import argparse

import torch.distributed as dist

from mmdp import config
from mmdp.data.families import MODELS, family_for
from mmdp.data.mixture import load_mixture, read_mixture
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import exit_on_user_error
from mmdp.flags import (
    add_loader_args,
    add_model_and_budget_args,
    add_packing_args,
    config_for,
    description,
    model_processor,
    non_negative_int,
    positive_int,
)
from mmdp.loading.packed_dataset import PackedDataset
from mmdp.planning.source_shares import MixturePlan
from mmdp.ranks import start_ranks
from mmdp.report.epoch import run_packed_epoch, write_outputs
from mmdp.report.pack_report import epoch_metrics
from mmdp.report.printing import (
    print_epoch_report,
    print_rank_balance,
    print_run_settings,
    print_weighing,
)
from mmdp.report.sources import format_source_report, source_report


def parse_args():
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument(
        "--mixture",
        required=True,
        help="a JSON file of sources with shares, loss weights and label policies (see "
        "mmdp.data.mixture; examples/mixture.json)",
    )
    parser.add_argument(
        "--num-rows",
        type=positive_int,
        default=config.DEFAULT_NUM_ROWS,
        help="the synthetic data's rows, and the most read from each other source "
        f"(default: {config.DEFAULT_NUM_ROWS:,})",
    )
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default: 0)")
    add_loader_args(parser)
    add_model_and_budget_args(parser, MODELS)
    add_packing_args(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    rank = start_ranks()
    processor = model_processor(args)
    family = family_for(processor)
    packing = config_for(family, args)
    if rank == 0:
        print_run_settings(args, packing, family.name)

    # Every source's rows one after the other; the plan takes each source's share of the epoch
    mixed = load_mixture(read_mixture(args.mixture), args.num_rows)
    samples = VQADataset(mixed.dataset, processor, mixture=mixed)
    mixture = MixturePlan.of(mixed, seed=args.seed)
    packed = PackedDataset(samples, config=packing, mixture=mixture)
    packed.set_epoch(args.epoch)
    if rank == 0:
        print_weighing(packed)

    epoch = run_packed_epoch(packed, args.num_workers)
    if rank != 0:
        dist.destroy_process_group()
        return
    # Per source: rows, drops by reason, tokens, share asked vs realised (overall, per rank)
    sources = source_report(
        mixed,
        packed.mixture,
        packed.weights,
        [report.sample_index for report in epoch["reports"]],
        budgets=packing.budgets,
        epoch=packed.epoch,
        report_by_source=epoch["report"].by_source(),
    )
    share_by = mixed.mixture.share_by
    print_epoch_report(epoch, packing.budgets)
    print(f"\nThe mixture ({share_by}):")
    print(format_source_report(sources, share_by))
    print_rank_balance(epoch["rank_balance"])
    mixture_metrics = {"share_by": share_by, "sources": sources}
    metrics = epoch_metrics(epoch, mixture=mixture_metrics, weighing=epoch["weighing"])
    write_outputs(metrics, epoch["first_batch"], args)


if __name__ == "__main__":
    with exit_on_user_error():
        main()
