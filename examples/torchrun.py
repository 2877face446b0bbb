"""Train on an mmdp loader with plain torchrun: DDP (or FSDP2's fully_shard), the loss that gives
one process's gradient, and checkpoints that resume exactly.

    uv run torchrun --nproc-per-node 2 examples/torchrun.py --max-steps 12 --grad-accum 2 \
        --output-dir /tmp/torchrun --log-samples /tmp/torchrun/samples.jsonl
    uv run torchrun --nproc-per-node 2 examples/torchrun.py --max-steps 12 --grad-accum 2 \
        --output-dir /tmp/torchrun --log-samples /tmp/torchrun/samples.jsonl \
        --resume-from-checkpoint /tmp/torchrun/checkpoint-8

TinyVLM on the embedded rows, offline, on CPU (gloo) or GPUs (NCCL, each rank on its LOCAL_RANK's
GPU); `--model FAMILY` a tiny random model of that family's real class, `--model-path` a real
checkpoint, `--num-train-epochs N` without `--max-steps` N whole epochs; checkpoints in
DIR/checkpoint-STEP. Prints the final step's loss and a digest of the weights: a run stopped
after a checkpoint and resumed prints the same as one that never stopped.

What the recipe does (mmdp.training.recipes):
1. The loader shards by rank itself: no DistributedSampler, and it is not wrapped.
2. Each optimizer step takes --grad-accum micro-batches; all but the last skip the gradient
   all-reduce (DDP's no_sync, FSDP2's set_requires_gradient_sync). Each loss touches every
   trainable parameter (touch_every_parameter): a micro-batch without images still gives DDP
   every gradient, with no find_unused_parameters (and none of its warnings).
3. Each micro-batch's loss is its summed token loss x world size / the step's label tokens on
   every rank (all-reduced): one process's gradient, whatever the ranks' token counts. The
   logits are computed for the trained positions only (micro_batch_loss runs the model).
4. A checkpoint holds the model and optimizer (written by rank 0) and one loader state per rank.
5. With --eval-ratio, the held-out rows' exact eval_loss at the end
   (mmdp.training.evaluation.evaluate: summed losses and label tokens, all-reduced once).
"""

import dataclasses
import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from mmdp.config import setting
from mmdp.errors import exit_on_user_error
from mmdp.flags import parse_flags
from mmdp.models.tiny_vlm import TinyVLM
from mmdp.training.evaluation import evaluate
from mmdp.training.examples import (
    SampleLog,
    TrainingSettings,
    checkpoint_folder,
    checkpoint_step,
    make_eval_loader,
    make_loader,
    make_model,
    model_weights_digest,
    print_result,
    training_steps,
    video_rows,
)
from mmdp.training.loop import to_device
from mmdp.training.recipes import (
    gradient_sync,
    load_loader_state,
    micro_batch_loss,
    optimizer_steps,
    save_loader_state,
    step_label_tokens,
    touch_every_parameter,
)

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on the CPU


def wrap(model, fsdp2: bool, device):
    """DDP, or FSDP2 with each language-model layer sharded on its own and the rest at the top."""
    model.to(device)
    if not fsdp2:
        # no find_unused_parameters: every loss touches every parameter (train_step)
        return DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for layer in language_model_layers(model):
        fully_shard(layer)
    return fully_shard(model)


def language_model_layers(model):
    """The decoder layers of the model's language model, which every micro-batch runs. Not the
    vision tower's blocks: a micro-batch without images skips them, and a rank that skips a
    sharded block leaves the others waiting in its all-gather; at the top, they are gathered
    with the rest."""
    decoder = model.lm.model if isinstance(model, TinyVLM) else model.get_decoder()
    return decoder.layers


def save_checkpoint(folder: str, model, optimizer, loader) -> None:
    """Model and optimizer, whole, from rank 0; the loader's state from every rank."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=FULL)
    if dist.get_rank() == 0:
        os.makedirs(folder, exist_ok=True)
        torch.save({"model": model_state, "optimizer": optimizer_state}, f"{folder}/model.pt")
    save_loader_state(loader, folder, dist.get_rank())
    dist.barrier()  # the checkpoint is whole before anyone goes on (or stops)


def load_checkpoint(folder: str, model, optimizer, loader) -> int:
    """Restore what save_checkpoint wrote; returns the step it was saved at."""
    state = torch.load(f"{folder}/model.pt", weights_only=True)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(full_state_dict=True),
    )
    load_loader_state(loader, folder, dist.get_rank())
    return checkpoint_step(folder)


def train_step(model, optimizer, micro_batches, inputs, device) -> torch.Tensor:
    """One optimizer step on the micro-batches; returns this rank's share of the step's loss."""
    world_size = dist.get_world_size()
    unwrapped = getattr(model, "module", model)  # DDP's; FSDP2 keeps the model (and its config)
    tokens = step_label_tokens(micro_batches, device=device)
    loss_share = torch.zeros((), device=device)
    for i, batch in enumerate(micro_batches):
        batch = to_device(batch, device)
        with gradient_sync(model, sync=i == len(micro_batches) - 1):
            # the logits of the trained positions only; the batch: labels, loss weights
            loss = micro_batch_loss(model, inputs(batch, unwrapped), batch, tokens, world_size)
            # a micro-batch without images leaves the vision tower unused: DDP would wait for it
            touch_every_parameter(loss, model).backward()
        loss_share += loss.detach() / world_size
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_share


@dataclasses.dataclass(frozen=True)
class TorchrunSettings:
    """The examples' settings (what the package reads), and this one's own flag."""

    training: TrainingSettings
    fsdp2: bool = setting(False, "FSDP2's fully_shard, not DDP")


def main(argv=None) -> dict | None:
    flags = parse_flags(TorchrunSettings, __doc__, argv)
    settings = flags.training
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if on_gpu else "cpu"
    if on_gpu:  # before anything touches the GPU: FSDP2's default mesh (and NCCL) use this one
        torch.cuda.set_device(device)
    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("nccl" if on_gpu else "gloo")
    rank = dist.get_rank()

    loader, tokenizer = make_loader(settings)  # this rank's share of every epoch
    model, inputs = make_model(settings, tokenizer)
    model = wrap(model, flags.fsdp2, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    step = 0
    if settings.resume_from_checkpoint:
        step = load_checkpoint(settings.resume_from_checkpoint, model, optimizer, loader)
    resumed_step = step if settings.resume_from_checkpoint else None
    log = SampleLog(settings.log_samples, rank, resumed_step, video_rows(loader))

    steps = optimizer_steps(loader, settings.grad_accum)
    loss = torch.zeros(())
    max_steps = training_steps(settings, loader)  # --max-steps, or --num-train-epochs whole epochs
    while step < max_steps:  # test before pulling a step: a pulled step moves the loader
        micro_batches = next(steps)
        step += 1
        for micro_step, batch in enumerate(micro_batches):
            log.write(step, micro_step, batch)
        loss = train_step(model, optimizer, micro_batches, inputs, device)
        if step % settings.save_steps == 0 or step == max_steps:
            save_checkpoint(checkpoint_folder(settings.output_dir, step), model, optimizer, loader)

    dist.all_reduce(loss)  # the step's mean over every label token of every rank
    evaluation = None
    eval_loader = make_eval_loader(loader, settings)  # --eval-ratio's held-out rows, every rank's
    if eval_loader is not None:  # every held-out token's mean over all ranks: one all-reduce
        evaluation = evaluate(model, eval_loader, inputs, device=device)
    model_state, _ = get_state_dict(model, optimizer, options=FULL)
    digest = model_weights_digest(model_state)
    result = print_result(float(loss), step, digest, evaluation) if rank == 0 else None
    if started_here:
        dist.destroy_process_group()
    return result


if __name__ == "__main__":
    with exit_on_user_error():  # --model-path offline: one sentence, exit status 2
        main()
