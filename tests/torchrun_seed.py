"""tests/test_seed_run.py's launches: examples/trainer.py under torchrun (gloo, CPU), W processes.

    torchrun --nproc-per-node W tests/torchrun_seed.py OUT EXAMPLE_FLAGS...

1. Before training, the examples' eval split (--eval-ratio) evaluated on the examples' initial
   model by mmdp.training.evaluation.evaluate, every rank its share: rank 0 writes the metrics to
   OUT/initial_eval.json. The same number on 1, 2 or 3 ranks is the evaluation's exactness
   across ranks.
2. examples/trainer.py with EXAMPLE_FLAGS, its --log-samples in OUT/samples.jsonl and its
   checkpoints in OUT/run; rank 0 writes what it printed (the final loss, eval_loss) to
   OUT/result.json.

Qwen3.5's linear-attention layers run on the CPU stand-ins of their kernels (tests/hybrid_kernels.py),
installed in every process: no other model has them.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist
from hybrid_kernels import linear_attention_kernels

from mmdp.flags import parse_flags
from mmdp.training.evaluation import evaluate
from mmdp.training.examples import TrainingSettings, make_eval_loader, make_loader, make_model

REPO = Path(__file__).resolve().parents[1]


def example_trainer():
    spec = importlib.util.spec_from_file_location("example_trainer", REPO / "examples/trainer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    out, flags = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    args = parse_flags(TrainingSettings, "", [*flags, "--output-dir", f"{out}/run"])
    loader, processor = make_loader(args, rank=rank, world_size=world_size)
    model, inputs = make_model(args, processor)
    initial = evaluate(model, make_eval_loader(loader, args), inputs)
    result = example_trainer().main(
        [*flags, "--output-dir", f"{out}/run", "--log-samples", f"{out}/samples.jsonl"]
    )
    if rank == 0:
        for name, value in (("initial_eval", initial), ("result", result)):
            with open(os.path.join(out, f"{name}.json"), "w") as f:
                json.dump(value, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with linear_attention_kernels():
        main()
