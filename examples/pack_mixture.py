"""Stage 5's packing over a mixture of sources: each source with its share of the epoch (by tokens
by default), a loss weight and a label policy (mmdp.data.mixture; the embedded synthetic data
offers one source per task, `synthetic:describe` ...), every rank given every source's share.

    uv run examples/pack_mixture.py --mixture examples/mixture.json
    uv run torchrun --standalone --nproc_per_node 2 examples/pack_mixture.py \
        --mixture examples/mixture.json --metrics-json /tmp/mixture.json

Prints one batch (with `loss_weights` when a source has a loss weight) and the epoch report of
examples/pack_planned.py, plus a line per source: rows, samples, tokens, the share
asked vs realised (overall and per rank) and drops by reason, also under "mixture" in
--metrics-json.
"""

import dataclasses

import torch.distributed as dist

from mmdp import config
from mmdp.config import setting
from mmdp.data.families import family_for
from mmdp.data.mixture import load_mixture, read_mixture
from mmdp.data.reading.settings import DataSettings, ModelSettings
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import exit_on_user_error
from mmdp.flags import (
    FAMILY_BUDGETS,
    EpochSettings,
    LoaderSettings,
    flag_values,
    parse_flags,
)
from mmdp.loading.packed_dataset import PackedDataset
from mmdp.packing.packing_config import PackingConfig, default_config
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


@dataclasses.dataclass(frozen=True)
class PackMixtureSettings:
    """Stage 5's settings, the rows a mixture of sources."""

    mixture: str = setting(
        help="a JSON file of sources with shares, loss weights and label policies (see "
        "mmdp.data.mixture; examples/mixture.json)"
    )
    # --num-rows: the synthetic data's rows, and the most read from each other source
    data: DataSettings = setting(
        DataSettings(num_rows=config.DEFAULT_NUM_ROWS), flags=("num_rows",)
    )
    loader: LoaderSettings = LoaderSettings()
    model: ModelSettings = ModelSettings()
    # the budgets not given are the model family's (default_config); --seed also seeds the
    # shares' plan
    packing: PackingConfig = setting(PackingConfig(max_length=None), shown=FAMILY_BUDGETS)
    run: EpochSettings = EpochSettings()


def main(argv=None):
    settings = parse_flags(PackMixtureSettings, __doc__, argv)
    rank = start_ranks()
    processor = settings.model.load_processor(settings.loader.tokenizer)
    family = family_for(processor)
    packing = default_config(family, **settings.packing.settings())
    if rank == 0:
        print_run_settings(flag_values(settings), packing, family.name)

    # Every source's rows one after the other; the plan takes each source's share of the epoch
    mixed = load_mixture(read_mixture(settings.mixture), settings.data.num_rows)
    samples = VQADataset(mixed.dataset, processor, mixture=mixed)
    mixture = MixturePlan.of(mixed, seed=packing.seed)
    packed = PackedDataset(samples, config=packing, mixture=mixture)
    packed.set_epoch(settings.run.epoch)
    if rank == 0:
        print_weighing(packed)

    epoch = run_packed_epoch(packed, settings.loader.num_workers)
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
    write_outputs(metrics, epoch["first_batch"], flag_values(settings))


if __name__ == "__main__":
    with exit_on_user_error():
        main()
