"""Train on an mmdp loader with accelerate: prepare the model and the optimizer, not the loader.

    uv run torchrun --nproc-per-node 2 examples/accelerate_loop.py --max-steps 12 --grad-accum 2 \
        --output-dir /tmp/accelerate --log-samples /tmp/accelerate/samples.jsonl
    uv run torchrun --nproc-per-node 2 examples/accelerate_loop.py --max-steps 12 --grad-accum 2 \
        --output-dir /tmp/accelerate --log-samples /tmp/accelerate/samples.jsonl \
        --resume-from-checkpoint /tmp/accelerate/checkpoint-8

(`accelerate launch --num_processes 2 examples/accelerate_loop.py ...` works the same.) The file
is not called accelerate.py: Python puts a script's folder first on sys.path, and every
`import accelerate` of the run, transformers' included, would import the script instead.

TinyVLM on the embedded rows, offline, on CPU or GPUs (`--model FAMILY`: a tiny random model of
that family's real class; `--model-path` a real checkpoint; `--num-train-epochs N` without
`--max-steps`: N whole epochs); checkpoints in DIR/checkpoint-STEP.
Prints the final step's loss and a digest of the weights: a run stopped after a checkpoint and
resumed prints the same as one that never stopped.

What the recipe does:
1. accelerator.prepare(model, optimizer), and not the loader: accelerate would rebuild it and
   cut or re-shard its batches (mmdp's loaders refuse with one sentence). Batches are moved to
   the device by hand.
2. Each optimizer step takes --grad-accum micro-batches; all but the last run under
   accelerator.no_sync. Not accelerator.accumulate(): it learns where an epoch ends only from
   prepared loaders (accelerate/accelerator.py:1230-1237), so an epoch's short last step would
   never be taken. Each loss touches every trainable parameter (touch_every_parameter): a
   micro-batch without images still gives DDP every gradient, with no find_unused_parameters
   (and none of its warnings).
3. Each micro-batch's loss is its summed token loss x processes / the step's label tokens on
   every rank (mmdp.training.recipes): one process's gradient.
4. accelerator.save_state / load_state, with the loader's state of every rank
   (mmdp.training.recipes.checkpoint_loader_with).
5. With --eval-ratio, the held-out rows' exact eval_loss at the end
   (mmdp.training.evaluation.evaluate: summed losses and label tokens, all-reduced once).
"""

import contextlib

import torch

from mmdp.errors import exit_on_user_error, require_extra
from mmdp.flags import parse_flags
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
    check_launched_processes,
    checkpoint_loader_with,
    micro_batch_loss,
    optimizer_steps,
    step_label_tokens,
    touch_every_parameter,
)

with exit_on_user_error():  # without accelerate: one sentence naming the extra that installs it
    require_extra("accelerate", "accelerate", "examples/accelerate_loop.py")
    from accelerate import Accelerator


def train_step(accelerator, model, optimizer, micro_batches, inputs) -> torch.Tensor:
    """One optimizer step on the micro-batches; returns this rank's share of the step's loss."""
    processes = accelerator.num_processes
    unwrapped = accelerator.unwrap_model(model)  # Gemma 3's masks read the model's config
    tokens = step_label_tokens(micro_batches, device=accelerator.device)
    loss_share = torch.zeros((), device=accelerator.device)
    for i, batch in enumerate(micro_batches):
        batch = to_device(batch, accelerator.device)
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else accelerator.no_sync(model):
            # the logits of the trained positions only; the batch: labels, loss weights
            loss = micro_batch_loss(model, inputs(batch, unwrapped), batch, tokens, processes)
            # a micro-batch without images leaves the vision tower unused: DDP would wait for it
            accelerator.backward(touch_every_parameter(loss, model))
        loss_share += loss.detach() / processes
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_share


def main(argv=None) -> dict | None:
    settings = parse_flags(TrainingSettings, __doc__, argv)
    # without cpu=True on a machine with no GPU, each process would train alone; DDP's
    # find_unused_parameters stays False: every loss touches every parameter (train_step)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    check_launched_processes(accelerator.num_processes)  # ... and that says so if it happens
    # the loader shards by rank itself: it is not prepared
    rank, world_size = accelerator.process_index, accelerator.num_processes
    loader, tokenizer = make_loader(settings, rank=rank, world_size=world_size)
    model, inputs = make_model(settings, tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    checkpoint_loader_with(accelerator, loader)  # save_state/load_state: every rank's position
    step = 0
    if settings.resume_from_checkpoint:
        accelerator.load_state(settings.resume_from_checkpoint)
        step = checkpoint_step(settings.resume_from_checkpoint)
    resumed_step = step if settings.resume_from_checkpoint else None
    log = SampleLog(
        settings.log_samples, accelerator.process_index, resumed_step, video_rows(loader)
    )

    steps = optimizer_steps(loader, settings.grad_accum)
    loss = torch.zeros((), device=accelerator.device)
    max_steps = training_steps(settings, loader)  # --max-steps, or --num-train-epochs whole epochs
    while step < max_steps:  # test before pulling a step: a pulled step moves the loader
        micro_batches = next(steps)
        step += 1
        for micro_step, batch in enumerate(micro_batches):
            log.write(step, micro_step, batch)
        loss = train_step(accelerator, model, optimizer, micro_batches, inputs)
        if step % settings.save_steps == 0 or step == max_steps:
            accelerator.save_state(checkpoint_folder(settings.output_dir, step))

    loss = accelerator.reduce(loss, reduction="sum")  # the step's mean over every label token
    evaluation = None
    eval_loader = make_eval_loader(loader, settings)  # --eval-ratio's held-out rows, every rank's
    if eval_loader is not None:  # every held-out token's mean over all ranks: one all-reduce
        evaluation = evaluate(model, eval_loader, inputs, device=accelerator.device)
    result = None
    if accelerator.is_main_process:
        state = accelerator.unwrap_model(model).state_dict()
        result = print_result(float(loss), step, model_weights_digest(state), evaluation)
    accelerator.wait_for_everyone()  # (with trackers, accelerator.end_training() here)
    return result


if __name__ == "__main__":
    with exit_on_user_error():  # --model-path offline: one sentence, exit status 2
        main()
