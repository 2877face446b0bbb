"""Stage 5's packing, streamed: read the dataset as a stream (a Hub dataset with streaming=True,
parquet files one by one) and pack it a buffer at a time, as the blog's ConstantLengthDataset
does (mmdp.loading.streaming).

    uv run examples/pack_streaming.py --buffer-size 1024
    uv run torchrun --standalone --nproc_per_node 2 examples/pack_streaming.py
    uv run examples/pack_streaming.py --dataset data/ --model qwen2_5_vl   # parquet files, a real family

Prints one batch and the epoch report of examples/pack_planned.py, and writes the same
--metrics-json keys but the weighing (a stream is weighed as it arrives). Under torchrun every
rank reads its shards and all stop at the same step: the rows a rank still held when another ran
out are counted (held_when_ranks_stopped).
"""

import dataclasses

import torch.distributed as dist

from mmdp import config
from mmdp.config import setting
from mmdp.data.families import family_for
from mmdp.data.reading.settings import DataSettings, ModelSettings
from mmdp.drop_reasons import HELD_WHEN_RANKS_STOPPED
from mmdp.errors import exit_on_user_error
from mmdp.flags import (
    FAMILY_BUDGETS,
    EpochSettings,
    LoaderSettings,
    flag_values,
    parse_flags,
)
from mmdp.loading.streaming import StreamingDataLoader, StreamingPackedDataset
from mmdp.packing.packing_config import PackingConfig, default_config
from mmdp.ranks import start_ranks
from mmdp.report.epoch import PACKING_HINT, run_epoch, write_outputs
from mmdp.report.pack_report import PackReport, epoch_metrics, merge_over_ranks
from mmdp.report.printing import print_epoch_report, print_rank_balance, print_run_settings


@dataclasses.dataclass(frozen=True)
class PackStreamingSettings:
    """Stage 5's settings, the rows read as a stream."""

    data: DataSettings = DataSettings(num_rows=config.DEFAULT_NUM_ROWS)
    loader: LoaderSettings = LoaderSettings()
    model: ModelSettings = ModelSettings()
    # the budgets not given are the model family's (default_config)
    packing: PackingConfig = setting(PackingConfig(max_length=None), shown=FAMILY_BUDGETS)
    run: EpochSettings = EpochSettings()


def main(argv=None):
    settings = parse_flags(PackStreamingSettings, __doc__, argv)
    rank = start_ranks()
    processor = settings.model.load_processor(settings.loader.tokenizer)
    family = family_for(processor)
    packing = default_config(family, **settings.packing.settings())
    if rank == 0:
        print_run_settings(flag_values(settings), packing, family.name)

    # Read the dataset as a stream, pack it a buffer at a time, stop the ranks together
    stream = settings.data.stream()
    loader = StreamingDataLoader(
        StreamingPackedDataset(stream, processor, config=packing),
        num_workers=settings.loader.num_workers,
    )
    loader.set_epoch(settings.run.epoch)
    report = PackReport()

    def batches():
        yield from loader
        report.add_loader(loader)  # rows read after the last batch, or held

    first_batch, seconds = run_epoch(batches(), report, hint=PACKING_HINT)
    # rank 0 reports for every rank; each step's balance as the batches held it (no plan)
    epoch = {**merge_over_ranks(report), "first_batch": first_batch, "seconds": seconds}
    if rank != 0:
        dist.destroy_process_group()
        return
    print_epoch_report(epoch, packing.budgets)
    if HELD_WHEN_RANKS_STOPPED in epoch["report"].dropped:
        print(f"({HELD_WHEN_RANKS_STOPPED}: read, not yielded: another rank ran out first)")
    print_rank_balance(epoch["rank_balance"])
    write_outputs(epoch_metrics(epoch), first_batch, flag_values(settings))


if __name__ == "__main__":
    with exit_on_user_error():
        main()
