"""Stage 5's packing from a prepared dataset: the weights (and tokens) that
`uv run -m mmdp.prepare --out URL` wrote once, read from a path or any fsspec URL; nothing is
weighed (mmdp.weighing.prepared).

    uv run -m mmdp.prepare --out /tmp/prepared/synthetic
    uv run examples/pack_prepared.py --prepared /tmp/prepared/synthetic
    uv run --extra s3 torchrun --standalone --nproc_per_node 2 examples/pack_prepared.py \
        --prepared s3://bucket/prepared/ai2d --dataset HuggingFaceM4/the_cauldron --subset ai2d \
        --model qwen2_5_vl

The rows are still loaded (their images are read from them): the same rows, model and budgets as
the prepared ones, or the run is refused in one sentence. The budgets not given are the prepared
dataset's. Prints one batch and the epoch report of examples/pack_planned.py, and
writes the same --metrics-json (weighing.rows_weighed_per_rank: [0, 0] under torchrun).
"""

import argparse

import torch.distributed as dist

from mmdp.data.families import MODELS, family_for
from mmdp.data.reading.settings import DataSettings
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import exit_on_user_error
from mmdp.flags import (
    add_data_args,
    add_loader_args,
    add_model_and_budget_args,
    add_packing_args,
    config_for,
    description,
    model_processor,
    settings_of,
)
from mmdp.loading.packed_dataset import PackedDataset
from mmdp.ranks import start_ranks
from mmdp.report.epoch import run_packed_epoch, write_outputs
from mmdp.report.pack_report import epoch_metrics
from mmdp.report.printing import (
    print_epoch_report,
    print_rank_balance,
    print_run_settings,
    print_weighing,
)
from mmdp.weighing.prepared import read_manifest


def parse_args():
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument(
        "--prepared",
        required=True,
        help="the path or fsspec URL that `uv run -m mmdp.prepare --out URL` wrote to",
    )
    add_data_args(parser)
    add_loader_args(parser)
    add_model_and_budget_args(parser, MODELS)
    add_packing_args(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    rank = start_ranks()
    processor = model_processor(args)
    family = family_for(processor)
    # the budgets the prepared rows were checked against, where no flag gives one
    manifest = read_manifest(args.prepared)
    budgets = {name: manifest[name] for name in ("max_length", "max_patches")}
    packing = config_for(family, args, **budgets)
    if rank == 0:
        print_run_settings(args, packing, family.name)

    rows = settings_of(DataSettings, args).load()
    packed = PackedDataset(VQADataset(rows, processor), config=packing, prepared=args.prepared)
    packed.set_epoch(args.epoch)
    if rank == 0:
        print_weighing(packed)

    epoch = run_packed_epoch(packed, args.num_workers)
    if rank != 0:
        dist.destroy_process_group()
        return
    print_epoch_report(epoch, packing.budgets)
    print_rank_balance(epoch["rank_balance"])
    write_outputs(epoch_metrics(epoch, weighing=epoch["weighing"]), epoch["first_batch"], args)


if __name__ == "__main__":
    with exit_on_user_error():
        main()
