"""What every way of training shares: the micro-batches of each optimizer step, the loss that
gives one process's gradient, gradient sync during accumulation, and the loader's state in a
checkpoint, one file per rank.

transformers' Trainer does the first three itself (mmdp.training.trainer only hands it the
loader and a loss); a loop of your own, with accelerate or plain torchrun, uses these
(examples/accelerate_loop.py, examples/torchrun.py):

    steps = optimizer_steps(loader, grad_accum)             # GA micro-batches per step
    for micro_batches in steps:
        tokens = step_label_tokens(micro_batches, device=device)  # every rank's, all-reduced
        for i, batch in enumerate(micro_batches):
            with gradient_sync(model, i == len(micro_batches) - 1):
                with mixed_precision(device, bf16):  # unwrapped: the model before DDP
                    loss = micro_batch_loss(model, model_inputs(batch, unwrapped), batch,
                                            tokens, world_size)
                touch_every_parameter(loss, model).backward()  # DDP: no unused parameter
        optimizer.step(); optimizer.zero_grad()
        # a checkpoint here: save_loader_state(loader, folder, rank) on every rank

Why the loss is summed and divided by the step's label tokens of every rank, not averaged per
micro-batch: mmdp.training.ddp, and docs/stage6-findings.md part 4 (measured by stage 6:
4.0e-8 against one process, 0.041 for each micro-batch's own mean).
"""

import contextlib
import math
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mmdp.training.loss import batch_loss, label_tokens

LOADER_STATE = "mmdp_loader_state_rank{rank}.pt"  # in a checkpoint folder, one per rank
EPOCH_END = object()  # what batches_forever yields between epochs, when asked to


def batches_forever(loader, *, epoch_ends: bool = False) -> Iterator:
    """The loader's batches, epoch after epoch, with EPOCH_END between epochs if `epoch_ends`.

    The loader moves to its next epoch as soon as a pass ends, before anything else is yielded,
    so a checkpoint taken at any yield says where the next batch comes from. The epoch number
    is the loader's own (`loader.dataset.epoch`), which a resumed loader carries: a counter of
    your loop would start again at 0. Ends after two passes in a row without a batch (a pass
    resumed at its very end has none; a second one means there is no data).
    """
    empty_passes = 0
    while empty_passes < 2:
        empty_passes += 1
        for batch in loader:
            empty_passes = 0
            yield batch
        loader.set_epoch(loader.dataset.epoch + 1)
        if epoch_ends:
            yield EPOCH_END


def optimizer_steps(loader, grad_accum: int) -> Iterator[list[dict]]:
    """The micro-batches of each optimizer step: `grad_accum` batches at a time, forever.

    As transformers' Trainer groups them (Trainer._run_epoch, transformers 5.23): a planned loader's
    epoch ends with a shorter step when its batch count is not a multiple of `grad_accum`; a
    stream, whose epochs have no known length, runs as one endless pass (as
    mmdp.training.trainer hands it to Trainer), so a step may take its batches from two epochs.
    Example: 5 batches per epoch, grad_accum 2 -> steps of 2, 2, 1 batches, then epoch 1's.

    Stop by leaving the loop, not by pulling one more step: a pulled step moves the loader's
    position past batches that were never trained.
    """
    planned = hasattr(loader.dataset, "num_batches")  # PackedDataset; a stream has no length
    micro_batches = []
    for item in batches_forever(loader, epoch_ends=planned):
        if item is not EPOCH_END:
            micro_batches.append(item)
        if micro_batches and (len(micro_batches) == grad_accum or item is EPOCH_END):
            yield micro_batches
            micro_batches = []


def epoch_steps(dataset, epoch: int, grad_accum: int) -> int:
    """The optimizer steps of a planned epoch (a PackedDataset's, the same on every rank), as
    optimizer_steps groups its batches: the last step may hold fewer."""
    return math.ceil(dataset.plan(epoch).num_steps() / grad_accum)


def step_label_tokens(micro_batches: list[dict], *, device=None, group=None) -> torch.Tensor:
    """The label tokens of one optimizer step on every rank: its micro-batches' counts, summed,
    then all-reduced over `group` (the data-parallel group; None: the world). A 0-d float tensor
    on `device` (default: collective_device); micro_batch_loss moves it to the loss."""
    tokens = torch.tensor(float(sum(label_tokens(b["labels"]) for b in micro_batches)))
    return all_reduced(tokens, device=device, group=group)


def collective_device(group=None) -> torch.device:
    """Where a collective's tensor must live: this process's GPU under NCCL, else the CPU."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduced(tensor: torch.Tensor, *, device=None, group=None) -> torch.Tensor:
    """`tensor` summed over `group` (as it is without a process group), on `device` (default:
    collective_device). Every collective of a loop of your own goes through here, so a run
    under NCCL never hands it a CPU tensor (a resumed run with no step left included)."""
    tensor = tensor.to(device if device is not None else collective_device(group))
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, group=group)
    return tensor


def micro_batch_loss(
    model, inputs: dict, batch: dict, step_tokens: torch.Tensor, world_size: int
) -> torch.Tensor:
    """The loss to call backward() on for one micro-batch: one forward of `model` (wrapped in
    DDP or FSDP2 as it is) on `inputs` (model_inputs(batch, unwrapped)), and the micro-batch's
    summed token loss over the step's label tokens on every rank, times `world_size` because DDP
    and FSDP average the ranks' gradients. Summed over the step's micro-batches and ranks: the
    mean over every label token of the step, exactly what one process computes on all of them.

    batch_loss computes the logits of the trained positions only, a chunk at a time; a mixture's
    `loss_weights` in `batch` weigh each token (weighted_mean_over_tokens), and a model that
    returns router logits adds its router term (BatchLoss.over).
    """
    return batch_loss(model, inputs, batch).over(step_tokens) * world_size


def touch_every_parameter(loss: torch.Tensor, model) -> torch.Tensor:
    """Under DDP (`model` a DistributedDataParallel), `loss` + 0 x one element of every parameter
    that trains: the same value and the same gradient, but every such parameter takes part in
    every backward. Any other model (one process, FSDP2's sharded DTensors): `loss` as it is.

    DDP all-reduces a parameter's gradient when backward reaches it, and waits for every one: a
    parameter a micro-batch leaves unused (the vision tower, or its adapters, on a micro-batch
    without images or videos) would stop the run ("Expected to have finished reduction"). The
    usual cure, DistributedDataParallel(find_unused_parameters=True), walks the autograd graph
    at every step and warns whenever a step uses every parameter (reducer.cpp, torch 2.x). With
    this, find_unused_parameters stays False and nothing warns. The cost: a zero gradient added
    to every trainable parameter once per micro-batch (LoRA: the adapters' only). FSDP and one
    process need none of it.
    """
    if not isinstance(model, DistributedDataParallel):
        return loss
    return loss + sum(p.view(-1)[0] for p in model.parameters() if p.requires_grad) * 0.0


def mixed_precision(device, bf16: bool):
    """The forward's autocast in a loop of your own, as accelerate's mixed_precision="bf16" (and so
    Trainer's bf16=True) makes it: torch.autocast(device type, bfloat16) around the forward and the
    loss only (get_mixed_precision_context_manager in accelerate.utils.modeling, accelerate 1.15),
    never around backward() or the optimizer step; the weights stay float32. The loss is taken in
    float32 either way (mmdp.training.loss upcasts the logits)."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16)


@contextlib.contextmanager
def gradient_sync(model, sync: bool):
    """Let this backward all-reduce gradients only if `sync` (the step's last micro-batch).

    DistributedDataParallel: `model.no_sync()` on the others. FSDP2 (`fully_shard`), which has no
    no_sync: `set_requires_gradient_sync(False)` keeps their gradients unsharded and local, and
    the last micro-batch reduce-scatters the sum. One process: nothing to do.
    """
    if sync:
        yield
    elif hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def check_launched_processes(num_processes: int) -> None:
    """Refuse to train when the launcher started more processes than train together.

    On a machine without a GPU, accelerate (and so Trainer) runs each torchrun process on its own
    unless it is told cpu=True (PartialState._prepare_backend, accelerate 1.15): every process then
    trains alone, on the whole data, and nothing says so.
    """
    launched = os.environ.get("WORLD_SIZE")  # set by torchrun and accelerate launch
    if launched is not None and int(launched) != num_processes:
        raise RuntimeError(
            f"{launched} processes were launched but they train as {num_processes}: on a machine "
            "without a GPU, create Accelerator(cpu=True) (with Trainer, TrainingArguments("
            "use_cpu=True)), or each process trains alone on all the data"
        )


def save_loader_state(loader, folder: str, rank: int) -> str:
    """Write the loader's state into a checkpoint folder, as this rank's file (every rank calls
    it: a streamed loader's position differs between ranks). Atomic: written beside its name,
    then moved in place (os.replace), so a kill leaves the whole file or none. Returns its path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOADER_STATE.format(rank=rank))
    torch.save(loader.state_dict(), path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def load_loader_state(loader, folder: str, rank: int) -> None:
    """Give the loader this rank's state from a checkpoint folder (save_loader_state's file)."""
    path = os.path.join(folder, LOADER_STATE.format(rank=rank))
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path}: this checkpoint has no mmdp loader state for rank {rank} (saved by another "
            "number of ranks, or without save_loader_state?)"
        )
    loader.load_state_dict(torch.load(path, weights_only=True))


def checkpoint_loader_with(accelerator, loader) -> None:
    """Make `accelerator.save_state(folder)` save the loader's state of every rank, and
    `accelerator.load_state(folder)` restore this rank's.

    Not `register_for_checkpointing(loader)`: it writes from the main process only
    (accelerate 1.15: checkpointing.save_custom_state, utils.other.save) and loads that one
    file on every rank, while a streamed loader's position differs between ranks. The state
    pre-hooks run on every rank (Accelerator.save_state and Accelerator.load_state).
    """
    rank = accelerator.process_index
    accelerator.register_save_state_pre_hook(
        lambda models, weights, folder: save_loader_state(loader, folder, rank)
    )
    accelerator.register_load_state_pre_hook(
        lambda models, folder: load_loader_state(loader, folder, rank)
    )
