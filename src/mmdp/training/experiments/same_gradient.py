"""Part 4 of stage 6, same gradient under DDP: one optimizer step of two ranks (torchrun, gloo)
against one process over the same packed batches (mmdp.training.ddp)."""

import time

from mmdp.training.ddp import run_torchrun
from mmdp.training.experiments.settings import ExperimentSettings


def check_ddp_gradient(settings: ExperimentSettings) -> dict:
    """mmdp.training.ddp under torchrun: two ranks (gloo, CPU), two micro-steps each, of stage 5's
    packed batches; each normalisation's gradient against one process's over the same batches."""
    if settings.skip_ddp:
        return ddp_not_run("skipped (--skip-ddp)")
    data_args = [
        f"--{name.replace('_', '-')}={getattr(settings, name)}"
        for name in ("dataset", "image_root", "format", "subset", "split")
        if getattr(settings, name) is not None
    ]
    started = time.perf_counter()
    try:
        result = run_torchrun("--max-length", str(settings.max_length), *data_args)
    except RuntimeError as error:
        return ddp_not_run(str(error))
    return {
        **result,
        "seconds": round(time.perf_counter() - started, 1),
        "command": "torchrun --standalone --nproc_per_node 2 -m mmdp.training.ddp",
    }


def ddp_not_run(reason: str) -> dict:
    return {
        "grad_rel_diff_global_tokens": None,
        "grad_rel_diff_per_rank_mean": None,
        "reason": reason,
    }
