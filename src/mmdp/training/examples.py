"""What the three training examples share (examples/trainer.py, examples/accelerate_loop.py,
examples/torchrun.py): their flags, the embedded data in a planned loader, the model, and
the --log-samples file that shows a resumed run trains exactly what an uninterrupted one does.

Everything runs offline on a CPU by default: the embedded synthetic rows, and TinyVLM (32-pixel
images) or, with `--model FAMILY`, a tiny random model of that family's real transformers class
with its processor built in code. `--model-path` trains a real checkpoint (the Hub, or a local
folder) instead.
"""

import argparse
import hashlib
import json
import math
import os

import torch
import torch.distributed as dist

from mmdp.cli import positive_float, positive_int
from mmdp.data.families import OFFLINE as FAMILY_MODELS
from mmdp.data.families import load_processor, tiny_processor
from mmdp.data.hub import require_hub
from mmdp.data.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.models.inputs import model_inputs
from mmdp.models.tiny import tiny_model
from mmdp.models.tiny_vlm import TinyVLM, TinyVLMConfig, vlm_inputs
from mmdp.packing.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.packing_config import default_config

IMAGE_SIZE = 32  # small images keep a CPU step short; 32 / 4-pixel patches = 64 image tokens
PATCH_SIZE = 4
TINY_VLM_MAX_LENGTH = 256  # tokens per pack for TinyVLM (a real family's own default otherwise)


def training_flags(description: str) -> argparse.ArgumentParser:
    """A parser with the flags every example takes (an example may add its own)."""
    parser = argparse.ArgumentParser(description=description)
    add = parser.add_argument
    add(
        "--max-steps",
        type=positive_int,
        default=None,
        help="optimizer steps in all (default: --num-train-epochs whole epochs)",
    )
    add(
        "--num-train-epochs",
        type=positive_int,
        default=1,
        help="whole epochs to train when --max-steps is not given (default 1)",
    )
    add("--save-steps", type=positive_int, default=4, help="a checkpoint every N steps (4)")
    add("--output-dir", required=True, help="checkpoints go to DIR/checkpoint-STEP")
    add("--resume-from-checkpoint", default=None, metavar="DIR", help="a checkpoint-STEP folder")
    add("--grad-accum", type=positive_int, default=2, help="micro-batches per step (default 2)")
    add("--log-samples", default=None, metavar="PATH", help="JSON lines: every micro-batch's rows")
    add("--num-rows", type=positive_int, default=64, help="rows of the embedded dataset (64)")
    add(
        "--max-length",
        type=positive_int,
        default=None,
        help="tokens per pack (default 256 for tiny_vlm, the family's own default for the others)",
    )
    add("--packs-per-batch", type=positive_int, default=2, help="packs per micro-batch (2)")
    add("--num-workers", type=int, default=2, help="DataLoader workers per rank (default 2)")
    add("--lr", type=positive_float, default=1e-3, help="constant learning rate (1e-3)")
    add("--seed", type=int, default=0, help="data order and initial weights (default 0)")
    add(
        "--model",
        choices=MODELS,
        default="tiny_vlm",
        help="mmdp's TinyVLM (default), or a "
        "tiny random model of the family's real transformers class, offline",
    )
    add(
        "--model-path",
        default=None,
        metavar="NAME_OR_DIR",
        help="a real checkpoint of a family "
        "mmdp packs for, from the Hub or a folder (instead of --model; needs the network or "
        "the local Hugging Face cache)",
    )
    return parser


def make_processor(args):
    """The model's processor: TinyVLM's tokenizer, a family's built in code, or a checkpoint's
    (one sentence, mmdp.errors.UserError, when it cannot be had)."""
    model_path, model = getattr(args, "model_path", None), getattr(args, "model", "tiny_vlm")
    if model_path:
        return load_processor(model_path)
    if model == "tiny_vlm":
        return get_tokenizer()
    return tiny_processor(family_of(model))


def family_of(model: str) -> str:
    """The family (mmdp.data.families) whose processor a --model uses."""
    return "qwen3_vl" if model == "qwen3_vl_moe" else model


def make_loader(args, *, rank: int | None = None, world_size: int | None = None):
    """The embedded rows, packed and planned: a PackedDataLoader that shards by rank itself
    (rank and world size from torch.distributed unless given). Returns (loader, processor):
    the processor is TinyVLM's tokenizer unless --model or --model-path names another model."""
    processor = make_processor(args)
    rows = load_vqa_dataset(None, num_rows=args.num_rows)
    samples = VQADataset(rows, processor, image_size=IMAGE_SIZE)
    max_length = getattr(args, "max_length", None)
    if max_length is None and samples.family.name == "tiny":
        max_length = TINY_VLM_MAX_LENGTH
    # the family's budgets (a real family's tokens and patches a pack), unless given
    config = default_config(
        samples.family, max_length=max_length, packs_per_batch=args.packs_per_batch, seed=args.seed
    )
    dataset = PackedDataset(
        samples,
        config,
        rank=rank,
        world_size=world_size,
    )
    return PackedDataLoader(dataset, num_workers=args.num_workers), processor


def training_steps(args, loader) -> int:
    """--max-steps, or the optimizer steps of --num-train-epochs whole epochs on this loader:
    each epoch's batches for this rank (each epoch is planned anew, so their counts differ),
    --grad-accum a step, an epoch's last step short (mmdp.training.recipes.optimizer_steps)."""
    if args.max_steps is not None:
        return args.max_steps
    dataset = loader.dataset
    batches = [
        dataset.plan(epoch).for_rank(dataset.rank).num_steps()
        for epoch in range(args.num_train_epochs)
    ]
    return sum(math.ceil(n / args.grad_accum) for n in batches)


def tiny_vlm(tokenizer, seed: int):
    """TinyVLM in float32, the same initial weights on every rank; and its batch keys."""
    torch.manual_seed(seed)
    vlm_config = TinyVLMConfig(
        len(tokenizer), tokenizer.image_token_id, image_size=IMAGE_SIZE, vit_patch_size=PATCH_SIZE
    )
    return TinyVLM(vlm_config).train(), vlm_inputs


# --model: mmdp's TinyVLM, or a tiny random model of a family's real transformers class
# (qwen3_vl_moe: Qwen3VLMoeForConditionalGeneration, with Qwen3-VL's processor).
MODELS = ("tiny_vlm", *FAMILY_MODELS, "qwen3_vl_moe")


def make_model(args, processor):
    """(model, model_inputs) for --model or --model-path, in train mode, the same initial
    weights on every rank; model_inputs(batch, model) picks the keys the model takes."""
    if args.model_path:
        return checkpoint_model(args.model_path), model_inputs
    if args.model == "tiny_vlm":
        return tiny_vlm(processor, args.seed)
    moe = {"moe": True} if args.model == "qwen3_vl_moe" else {}
    return tiny_model(processor, seed=args.seed, **moe).train(), model_inputs


def checkpoint_model(name_or_path: str):
    """A real checkpoint's model, in float32 (one sentence when the Hub is out of reach)."""
    from transformers import AutoModelForImageTextToText

    if not os.path.exists(name_or_path):
        require_hub(f"model {name_or_path!r}", "run without --model-path to train a tiny model")
    model = AutoModelForImageTextToText.from_pretrained(name_or_path, dtype=torch.float32)
    return model.train()


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
