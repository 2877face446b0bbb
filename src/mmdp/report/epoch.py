"""One epoch through a loader, as the stage scripts run it: every batch added to a report, the
first batch kept to show, one sentence when the settings left nothing to do; and what a run writes
(--metrics-json, --save-batch)."""

import argparse
import time

import torch

from mmdp.drop_reasons import VIDEO_REFUSED
from mmdp.errors import UserError


def run_epoch(loader, report, keep_batch=None, hint="raise --num-rows") -> tuple[dict, float]:
    """Go through one epoch, adding every batch to `report` (an EpochReport).

    Returns the batch to show (the first one, or the first for which keep_batch(batch) is true,
    else the first) and the seconds the epoch took. Raises a UserError ending in `hint` when no
    batch held a sample: the settings left nothing to do.
    """
    shown = None
    start = time.perf_counter()
    for batch in loader:
        if shown is None or (keep_batch and not keep_batch(shown) and keep_batch(batch)):
            shown = batch
        report.add_batch(batch)
    seconds = time.perf_counter() - start
    if report.samples == 0:
        raise nothing_to_do(report.rows_read, report.dropped, hint)
    return shown, seconds


def nothing_to_do(rows_read: int, dropped: dict, hint: str, takes_video=False) -> UserError:
    """The one sentence for settings that leave no sample to use."""
    if set(dropped) == {VIDEO_REFUSED} and not takes_video:  # TinyVLM: no budget would pack them
        hint = f"TinyVLM takes no video: pack videos with {VIDEO_STAGE} --model qwen2_5_vl"
    reasons = ", ".join(f"{n:,} {reason}" for reason, n in sorted(dropped.items()))
    return UserError(
        f"nothing to do: none of the {rows_read:,} rows read made it into a batch"
        + (f" (dropped: {reasons})" if reasons else "")
        + f"; {hint}"
    )


PACKING_HINT = "raise --max-length or --max-images, or use more --num-rows"
VIDEO_STAGE = "05_knapsack_multimodal.py"


def run_packed_epoch(packed, num_workers: int) -> dict:
    """One epoch of a PackedDataset through its loader, on this rank; the report merged over
    ranks (mmdp.report.pack_report.merge_over_ranks: rows dropped while planning counted once), the
    first batch, the seconds, and how many rows each rank weighed."""
    from mmdp.loading.packed_dataset import PackedDataLoader
    from mmdp.planning.planner import batch_loads
    from mmdp.ranks import gather_from_ranks
    from mmdp.report.pack_report import PackReport, merge_over_ranks

    if packed.num_batches() == 0:
        video = bool(packed.dataset.family.video_token)
        raise nothing_to_do(len(packed.weights), packed.plan().dropped, PACKING_HINT, video)
    loader = PackedDataLoader(packed, num_workers=num_workers)
    report = PackReport()
    first_batch, seconds = run_epoch(loader, report, hint=PACKING_HINT)
    report.add_loader(loader)  # the plan's drops (and, for a mixture, of each source)
    epoch = merge_over_ranks(report, batch_loads(packed.plan(), packed.weights))
    weighed = gather_from_ranks(packed.weighing.rows_weighed_here)
    weighing = {"seconds": round(packed.weighing.seconds, 3), "rows_weighed_per_rank": weighed}
    return {**epoch, "first_batch": first_batch, "seconds": seconds, "weighing": weighing}


def write_outputs(metrics: dict, first_batch: dict, args: argparse.Namespace) -> None:
    """--metrics-json (the epoch's `metrics`) and --save-batch (the first batch, as it is)."""
    from mmdp.report.metrics import write_json
    from mmdp.report.plots import display_path

    if args.metrics_json:
        print(f"Wrote the epoch report to {display_path(write_json(metrics, args.metrics_json))}")
    if args.save_batch:
        torch.save(first_batch, args.save_batch)
        print(f"Saved the first batch to {display_path(args.save_batch)}")
