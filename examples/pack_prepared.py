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

import dataclasses

import torch.distributed as dist

from mmdp import config
from mmdp.config import setting
from mmdp.data.families import family_for
from mmdp.data.reading.settings import DataSettings, ModelSettings
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import exit_on_user_error
from mmdp.flags import EpochSettings, LoaderSettings, flag_values, parse_flags
from mmdp.loading.packed_dataset import PackedDataset
from mmdp.packing.packing_config import PackingConfig, default_config
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

PREPARED = "the prepared dataset's"


@dataclasses.dataclass(frozen=True)
class PackPreparedSettings:
    """Stage 5's settings, the weights read from a prepared dataset."""

    prepared: str = setting(
        help="the path or fsspec URL that `uv run -m mmdp.prepare --out URL` wrote to"
    )
    data: DataSettings = DataSettings(num_rows=config.DEFAULT_NUM_ROWS)
    loader: LoaderSettings = LoaderSettings()
    model: ModelSettings = ModelSettings()
    # the budgets not given are the prepared dataset's
    packing: PackingConfig = setting(
        PackingConfig(max_length=None),
        shown={"max_length": PREPARED, "max_patches": PREPARED},
    )
    run: EpochSettings = EpochSettings()


def main(argv=None):
    settings = parse_flags(PackPreparedSettings, __doc__, argv)
    rank = start_ranks()
    processor = settings.model.load_processor(settings.loader.tokenizer)
    family = family_for(processor)
    # the budgets the prepared rows were checked against, where no flag gives one
    manifest = read_manifest(settings.prepared)
    budgets = {name: manifest[name] for name in ("max_length", "max_patches")}
    given = {k: v for k, v in settings.packing.settings().items() if v is not None}
    packing = default_config(family, **{**budgets, **given})
    if rank == 0:
        print_run_settings(flag_values(settings), packing, family.name)

    rows = settings.data.load()
    packed = PackedDataset(VQADataset(rows, processor), config=packing, prepared=settings.prepared)
    packed.set_epoch(settings.run.epoch)
    if rank == 0:
        print_weighing(packed)

    epoch = run_packed_epoch(packed, settings.loader.num_workers)
    if rank != 0:
        dist.destroy_process_group()
        return
    print_epoch_report(epoch, packing.budgets)
    print_rank_balance(epoch["rank_balance"])
    write_outputs(
        epoch_metrics(epoch, weighing=epoch["weighing"]),
        epoch["first_batch"],
        flag_values(settings),
    )


if __name__ == "__main__":
    with exit_on_user_error():
        main()
