"""The slow group's two trainer suites in one torchrun launch (gloo, CPU, 2 processes):

    torchrun --nproc-per-node 2 tests/torchrun_trainers.py OUT

1. tests/torchrun_checks.py: each way to train (examples/trainer.py, accelerate_loop.py,
   torchrun.py), its files in OUT/checks/WAY (tests/test_trainers.py reads them);
2. mmdp.training.ddp: stage 6's one DDP step against one process, OUT/ddp/ddp.json
   (tests/test_ddp.py reads it; alone: `torchrun ... -m mmdp.check_ddp`);
3. tests/torchrun_matrix.py: every family on every path, OUT/matrix/results.json
   (tests/test_trainer_matrix.py reads it).

One launch, not one each: every launch starts 3 processes that import torch, transformers and
datasets, about 10 s a process on a quiet 2-core machine and 26-34 s on a busy one
(docs/benchmarks.md). Each script still runs alone, as its docstring says.
"""

import datetime
import os
import sys

import torch.distributed as dist
from torchrun_checks import WAYS, check_ways
from torchrun_matrix import FAMILIES, PATHS, measure_matrix

from mmdp.flags import parse_flags
from mmdp.training import ddp

# two ranks x two gradient-accumulation micro-steps x two packs of 512 tokens
DDP_FLAGS = ["--num-rows", "64", "--micro-steps", "2", "--packs-per-batch", "2"]
# Alone, the checks' launch failed a hang after 180 s and the matrix's after 900 s. The longest
# wait of this launch is rank 1 at a barrier while rank 0 computes a family's unpacked reference
# (seconds), so a hang still fails long before the test's own timeout.
TIMEOUT = datetime.timedelta(seconds=600)


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo", timeout=TIMEOUT)
    for part in ("checks", "ddp", "matrix"):
        os.makedirs(os.path.join(out, part), exist_ok=True)
    check_ways(WAYS, os.path.join(out, "checks"))
    ddp_json = os.path.join(out, "ddp", "ddp.json")
    ddp.compare_gradients(
        parse_flags(ddp.DdpSettings, "", [*DDP_FLAGS, "--metrics-json", ddp_json])
    )
    measure_matrix(PATHS, FAMILIES, os.path.join(out, "matrix"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
