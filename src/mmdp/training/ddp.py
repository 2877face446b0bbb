"""Packed batches under DDP: the loss that gives the same gradient as one process (stage 6).

    uv run torchrun --standalone --nproc_per_node 2 -m mmdp.check_ddp --metrics-json /tmp/ddp.json

Each rank averages its loss over its own label tokens, ranks hold different numbers of them
(more so with packing: a pack holds as many tokens, not as many samples), and DDP then averages
the ranks' gradients: a token on a rank with few tokens weighs more than one on a rank with
many. The fix (transformers' Trainer does it with `num_items_in_batch`): sum the token losses,
and divide by the label tokens of the whole step, all-reduced over ranks and micro-steps.

    tokens = torch.tensor(float(sum(label_tokens(b["labels"]) for b in micro_batches)))
    tokens = tokens.to(device)                      # NCCL reduces GPU tensors only
    dist.all_reduce(tokens)                         # label tokens of the step, every rank
    for i, batch in enumerate(micro_batches):       # gradient accumulation
        sync = i == len(micro_batches) - 1          # all-reduce gradients on the last one only
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = summed_loss(model(**vlm_inputs(batch)).logits, batch["labels"])
            (loss * world_size / tokens).backward() # DDP divides by world_size: undo it
    optimizer.step()

Then the gradient is d/dw [sum of every token loss of the step / every label token of the
step], exactly what one process computes on the union of the same batches. This module runs
one step this way and the usual way (ddp_gradient) on stage 5's packed batches, and compares
each gradient with one process's.
"""

import copy
import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mmdp.config import setting
from mmdp.data.reading.settings import DataSettings
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.models.tiny_vlm import TinyVLM, TinyVLMConfig, vlm_inputs
from mmdp.packing.packing_config import PackingConfig
from mmdp.report.metrics import write_json
from mmdp.training.loss import label_tokens, summed_loss
from mmdp.training.recipes import (
    collective_device,
    gradient_sync,
    step_label_tokens,
    touch_every_parameter,
)


@dataclasses.dataclass(frozen=True)
class DdpSettings:
    """This module's settings: the rows, their packed batches and the step (its flags, --help)."""

    data: DataSettings = DataSettings(num_rows=64)
    packing: PackingConfig = setting(
        PackingConfig(packs_per_batch=2), flags=("max_length", "packs_per_batch")
    )
    micro_steps: int = setting(2, "gradient-accumulation micro-steps per optimizer step", min=1)
    seed: int = setting(0, "the data order and the initial weights", min=0)
    metrics_json: str | None = setting(None, "rank 0 writes the results here")


def rank_batches(
    samples: VQADataset, settings: DdpSettings, rank: int, world_size: int
) -> list[dict]:
    """The first `micro_steps` batches stage 5's loader gives `rank`."""
    config = dataclasses.replace(settings.packing, seed=settings.seed)
    packed = PackedDataset(samples, config=config, rank=rank, world_size=world_size)
    batches = list(PackedDataLoader(packed, num_workers=0))[: settings.micro_steps]
    if len(batches) < settings.micro_steps:
        raise SystemExit(f"rank {rank} has {len(batches)} batches; raise --num-rows")
    return batches


def ddp_gradient(model, batches: list[dict], normalisation: str) -> torch.Tensor:
    """One step's gradient under DDP (all parameters, flattened), with the loss normalised
    "global_tokens" (the recipe above) or "per_rank_mean" (each micro-batch's own mean over its
    label tokens, divided by the micro-steps: what a hand-written loop usually does)."""
    world_size = dist.get_world_size()
    tokens = step_label_tokens(batches)  # every rank's, all-reduced
    model.zero_grad(set_to_none=True)
    for i, batch in enumerate(batches):
        with gradient_sync(model, i == len(batches) - 1):
            output = model(**vlm_inputs(batch))
            if normalisation == "global_tokens":
                loss = summed_loss(output.logits, batch["labels"]) * world_size / tokens
            else:
                loss = output.loss / len(batches)
            touch_every_parameter(loss, model).backward()  # a text-only batch: no vision
    return flat_gradient(model.module)


def one_process_gradient(model, batches: list[dict]) -> torch.Tensor:
    """The reference: one process, every rank's batches, mean over all their label tokens."""
    model.zero_grad(set_to_none=True)
    tokens = sum(label_tokens(b["labels"]) for b in batches)
    for batch in batches:
        (summed_loss(model(**vlm_inputs(batch)).logits, batch["labels"]) / tokens).backward()
    return flat_gradient(model)


def flat_gradient(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def main(settings: DdpSettings) -> None:
    dist.init_process_group("gloo")
    compare_gradients(settings)
    dist.destroy_process_group()


def compare_gradients(settings: DdpSettings) -> dict | None:
    """One step both ways on this rank's batches, in the process group already started, each
    gradient against one process's on every rank's batches: rank 0's result (also printed, and
    written to --metrics-json), None on the other ranks."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    tokenizer = get_tokenizer()
    samples = VQADataset(settings.data.load(), tokenizer)

    # The same initial weights on every rank and in the one-process reference
    torch.manual_seed(settings.seed)
    vlm_config = TinyVLMConfig(vocab_size=len(tokenizer), image_token_id=tokenizer.image_token_id)
    model = TinyVLM(vlm_config).train()
    reference = copy.deepcopy(model)
    ddp_model = DistributedDataParallel(model)  # unused parameters: touch_every_parameter

    mine = rank_batches(samples, settings, rank, world_size)
    gradients = {
        name: ddp_gradient(ddp_model, mine, name) for name in ("global_tokens", "per_rank_mean")
    }
    # label tokens of every micro-batch of every rank: [world_size, micro_steps]
    tokens = torch.tensor([label_tokens(b["labels"]) for b in mine]).to(collective_device())
    gathered = [torch.zeros_like(tokens) for _ in range(world_size)]
    dist.all_gather(gathered, tokens)
    tokens = torch.stack(gathered).cpu()

    if rank == 0:
        union = [
            b for r in range(world_size) for b in rank_batches(samples, settings, r, world_size)
        ]
        expected = one_process_gradient(reference, union)
        result = {
            "world_size": world_size,
            "micro_steps": settings.micro_steps,
            "packs_per_batch": settings.packing.packs_per_batch,
            "label_tokens_per_rank": tokens.sum(dim=1).tolist(),
            "label_tokens_per_micro_batch": tokens.tolist(),
            # what a token weighs under the per-rank mean, relative to one process: there every
            # token weighs 1 / (all tokens); here 1 / (world_size * micro_steps * its batch's)
            "token_weight_per_rank_mean": {
                "min": round(float(tokens.sum() / (tokens.numel() * tokens.max())), 3),
                "max": round(float(tokens.sum() / (tokens.numel() * tokens.min())), 3),
            },
            "grad_rel_diff_global_tokens": relative_difference(
                gradients["global_tokens"], expected
            ),
            "grad_rel_diff_per_rank_mean": relative_difference(
                gradients["per_rank_mean"], expected
            ),
        }
        print(
            f"{world_size} ranks x {settings.micro_steps} micro-steps of "
            f"{settings.packing.packs_per_batch} packs; label tokens per micro-batch {result['label_tokens_per_micro_batch']}; "
            f"gradient against "
            f"one process: global tokens {result['grad_rel_diff_global_tokens']:.1e}, "
            f"per-rank mean {result['grad_rel_diff_per_rank_mean']:.1e}"
        )
        if settings.metrics_json:
            write_json(result, settings.metrics_json)
        return result
    return None


def run_torchrun(*args: str, nproc_per_node: int = 2, timeout: int = 600) -> dict:
    """Run this module's step under torchrun on this machine (gloo; its CLI, mmdp.check_ddp) and
    return rank 0's results.

    `args` are that CLI's flags (mmdp.flags.command_line of DdpSettings); raises RuntimeError
    with torchrun's last line if it fails.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/ddp.json"
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        module = ["--nproc_per_node", str(nproc_per_node), "-m", "mmdp.check_ddp", *args]
        command = [*launcher, *module, "--metrics-json", out]
        # torchrun writes its own log folder (torchelastic_*) under the temp folder: this one
        env = {**os.environ, "TMPDIR": tmp}
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            raise RuntimeError(f"torchrun failed: {lines[-1] if lines else 'no output'}")
        with open(out) as f:
            return json.load(f)
