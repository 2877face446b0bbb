"""What the three training examples share (examples/trainer.py, examples/accelerate_loop.py,
examples/torchrun.py): their flags, the embedded data in a planned loader, a tiny model, and
the --log-samples file that shows a resumed run trains exactly what an uninterrupted one does.

Everything runs offline on a CPU: the embedded synthetic rows, 32-pixel images and TinyVLM.
"""

import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist

from mmdp.cli import positive_float, positive_int
from mmdp.data.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.models.tiny_vlm import TinyVLM, TinyVLMConfig, vlm_inputs
from mmdp.packing.packed_dataset import PackedDataLoader, PackedDataset

IMAGE_SIZE = 32  # small images keep a CPU step short; 32 / 4-pixel patches = 64 image tokens
PATCH_SIZE = 4


def training_flags(description: str) -> argparse.ArgumentParser:
    """A parser with the flags every example takes (an example may add its own)."""
    parser = argparse.ArgumentParser(description=description)
    add = parser.add_argument
    add("--max-steps", type=positive_int, default=12, help="optimizer steps in all (default 12)")
    add("--save-steps", type=positive_int, default=4, help="a checkpoint every N steps (4)")
    add("--output-dir", required=True, help="checkpoints go to DIR/checkpoint-STEP")
    add("--resume-from-checkpoint", default=None, metavar="DIR", help="a checkpoint-STEP folder")
    add("--grad-accum", type=positive_int, default=2, help="micro-batches per step (default 2)")
    add("--log-samples", default=None, metavar="PATH", help="JSON lines: every micro-batch's rows")
    add("--num-rows", type=positive_int, default=64, help="rows of the embedded dataset (64)")
    add("--max-length", type=positive_int, default=256, help="tokens per pack (default 256)")
    add("--packs-per-batch", type=positive_int, default=2, help="packs per micro-batch (2)")
    add("--num-workers", type=int, default=2, help="DataLoader workers per rank (default 2)")
    add("--lr", type=positive_float, default=1e-3, help="constant learning rate (1e-3)")
    add("--seed", type=int, default=0, help="data order and initial weights (default 0)")
    add("--model", choices=sorted(MODELS), default="tiny_vlm", help="the model (tiny_vlm)")
    return parser


def make_loader(args, *, rank: int | None = None, world_size: int | None = None):
    """The embedded rows, packed and planned: a PackedDataLoader that shards by rank itself
    (rank and world size from torch.distributed unless given). Returns (loader, tokenizer)."""
    tokenizer = get_tokenizer()
    rows = load_vqa_dataset(None, num_rows=args.num_rows)
    dataset = PackedDataset(
        VQADataset(rows, tokenizer, image_size=IMAGE_SIZE),
        max_length=args.max_length,
        packs_per_batch=args.packs_per_batch,
        seed=args.seed,
        rank=rank,
        world_size=world_size,
    )
    return PackedDataLoader(dataset, num_workers=args.num_workers), tokenizer


def tiny_vlm(tokenizer, seed: int):
    """TinyVLM in float32, the same initial weights on every rank; and its batch keys."""
    torch.manual_seed(seed)
    vlm_config = TinyVLMConfig(
        len(tokenizer), tokenizer.image_token_id, image_size=IMAGE_SIZE, vit_patch_size=PATCH_SIZE
    )
    return TinyVLM(vlm_config).train(), vlm_inputs


# The models the examples can train: name -> (tokenizer, seed) -> (model, model_inputs), where
# model_inputs(batch, model) picks the keys the model takes. The real families' tiny models
# (mmdp.data.families) plug in here, with mmdp.models.inputs.model_inputs.
MODELS = {"tiny_vlm": tiny_vlm}


def make_model(args, tokenizer):
    return MODELS[args.model](tokenizer, args.seed)


def checkpoint_folder(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, f"checkpoint-{step}")


def checkpoint_step(folder: str) -> int:
    """The step a checkpoint-STEP folder was saved at."""
    return int(os.path.basename(os.path.normpath(folder)).rsplit("-", 1)[1])


class SampleLog:
    """--log-samples: one JSON line per micro-batch trained, every rank into one file:
    {"rank", "step", "micro_step", "sample_index"}, `step` counting optimizer steps from 1 and
    `micro_step` the micro-batch within it.

    A fresh run empties the file; a resumed run keeps the lines up to its checkpoint's step and
    drops the later ones (trained before the run stopped, but not saved), so the file ends as the
    uninterrupted run's does, up to the order in which ranks' lines interleave. Every rank must
    create it (it waits for rank 0 to prepare the file).
    """

    def __init__(self, path: str | None, rank: int, resumed_step: int | None = None):
        self.path, self.rank = path, rank
        if path and rank == 0:
            lines = []
            if resumed_step is not None and os.path.exists(path):
                with open(path) as f:
                    lines = [line for line in f if json.loads(line)["step"] <= resumed_step]
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                f.writelines(lines)
        if path and dist.is_available() and dist.is_initialized():
            dist.barrier()

    def write(self, step: int, micro_step: int, batch: dict) -> None:
        if not self.path:
            return
        line = {
            "rank": self.rank,
            "step": step,
            "micro_step": micro_step,
            "sample_index": batch["sample_index"].tolist(),
        }
        # one write() of one line, opened for appending: ranks' lines never interleave mid-line
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)


def weights_digest(state_dict: dict) -> str:
    """A short sha256 of a model's weights: two runs that end the same print the same."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        digest.update(name.encode())
        digest.update(
            state_dict[name].detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
        )
    return digest.hexdigest()[:16]


def print_result(loss: float, step: int, digest: str) -> dict:
    """What every example prints at the end, on rank 0 (and returns, for tests)."""
    print(f"final loss {loss:.4f} after {step} steps (weights sha256 {digest})", flush=True)
    return {"loss": loss, "step": step, "digest": digest}
