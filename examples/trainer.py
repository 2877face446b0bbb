"""Train on an mmdp loader with transformers' Trainer: mmdp.training.trainer.MMDPTrainer.

    uv run torchrun --nproc-per-node 2 examples/trainer.py --max-steps 12 --grad-accum 2 \
        --output-dir /tmp/trainer --log-samples /tmp/trainer/samples.jsonl
    uv run torchrun --nproc-per-node 2 examples/trainer.py --max-steps 12 --grad-accum 2 \
        --output-dir /tmp/trainer --log-samples /tmp/trainer/samples.jsonl \
        --resume-from-checkpoint /tmp/trainer/checkpoint-8

(`uv run python examples/trainer.py ...` runs it in one process.) TinyVLM on the embedded rows,
offline, on CPU or GPUs (`--model qwen2_5_vl`: a tiny random Qwen2.5-VL instead, and so for every
family; `--model-path` a real checkpoint; `--num-train-epochs N` without `--max-steps`: N
epochs); Trainer's checkpoints in DIR/checkpoint-STEP, each with every rank's loader state.
Prints the final step's loss and a digest of the weights: a run stopped after a checkpoint and
resumed prints the same as one that never stopped. The seed user's run, in one command (6.5
minutes on 2 busy CPU cores; every training row 3 times, the clips included, and eval_loss):

    uv run torchrun --nproc-per-node 2 examples/trainer.py --model qwen3_vl_moe --lora \
        --videos 24 --num-rows 120 --num-train-epochs 3 --grad-accum 16 --eval-ratio 0.1 \
        --output-dir /tmp/seed --log-samples /tmp/seed/samples.jsonl

What MMDPTrainer does for you (its module's docstring has the why, with transformers' lines):
the loader goes to Trainer as it is, not through accelerator.prepare; the model gets only the
keys it takes; the loss is the summed token loss over the label tokens of the whole step on
every rank, whatever the model's accepts_loss_kwargs; every checkpoint holds each rank's loader
state, and a resume restores it instead of re-reading the batches already trained; with
--eval-ratio, eval_loss at the end of every epoch is every held-out token's mean over all ranks.
"""

import torch
from transformers import TrainingArguments

from mmdp.errors import exit_on_user_error
from mmdp.flags import parse_flags
from mmdp.models.tiny_vlm import TinyVLM
from mmdp.training.examples import (
    SampleLog,
    TrainingSettings,
    checkpoint_step,
    make_eval_loader,
    make_loader,
    make_model,
    model_weights_digest,
    print_result,
    video_rows,
)

with exit_on_user_error():  # without accelerate: one sentence naming the extra that installs it
    from mmdp.training.trainer import MMDPTrainer


class LoggedTrainer(MMDPTrainer):
    """MMDPTrainer that writes every micro-batch's rows to --log-samples before training on it
    (the line's epoch is the batch's own: Trainer fetches a step's micro-batches ahead)."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        step = self.state.global_step + 1  # the optimizer step this micro-batch belongs to
        if not inputs.get("filler"):  # a filler ends an epoch's short step: it has no rows
            self.micro_step = self.micro_step + 1 if step == self.last_step else 0
            self.last_step = step
            self.sample_log.write(step, self.micro_step, inputs)
        return super().training_step(model, inputs, num_items_in_batch)


def untie_output_layer(model) -> None:
    """TinyVLM is a plain nn.Module whose output layer shares the embeddings' weights; Trainer
    saves such a module with safetensors.save_file, which refuses tensors that share memory
    (transformers/trainer.py:4155). A copy makes them two weights (a PreTrainedModel, as the
    real families are, saves tied weights itself)."""
    if not isinstance(model, TinyVLM):
        return
    lm_head = model.lm.lm_head
    lm_head.weight = torch.nn.Parameter(lm_head.weight.detach().clone())


def main(argv=None) -> dict | None:
    settings = parse_flags(TrainingSettings, __doc__, argv)
    training_args = TrainingArguments(
        output_dir=settings.output_dir,
        max_steps=settings.max_steps or -1,  # -1: num_train_epochs whole epochs
        num_train_epochs=settings.num_train_epochs,
        gradient_accumulation_steps=settings.grad_accum,
        learning_rate=settings.lr,
        lr_scheduler_type="constant",  # a run cut short by --max-steps is the same run
        save_strategy="steps",
        save_steps=settings.save_steps,
        logging_steps=1,
        eval_strategy="epoch" if settings.eval_ratio else "no",  # each loader epoch's end
        seed=settings.seed,
        per_device_train_batch_size=settings.packing.packs_per_batch,  # for Trainer's logs only
        # without it, on a machine with no GPU, Trainer runs every process on its own
        use_cpu=not torch.cuda.is_available(),
        report_to="none",
        disable_tqdm=True,
    )
    # the loader shards by rank itself: this process's rank among Trainer's
    rank, world_size = training_args.process_index, training_args.world_size
    loader, tokenizer = make_loader(settings, rank=rank, world_size=world_size)
    model, inputs = make_model(settings, tokenizer)
    untie_output_layer(model)
    trainer = LoggedTrainer(
        model=model,
        args=training_args,
        train_loader=loader,
        eval_loader=make_eval_loader(loader, settings),  # None without --eval-ratio
        model_inputs=inputs,
    )
    resumed_step = None
    if settings.resume_from_checkpoint:
        resumed_step = checkpoint_step(settings.resume_from_checkpoint)
    trainer.sample_log = SampleLog(
        settings.log_samples, training_args.process_index, resumed_step, video_rows(loader)
    )
    trainer.micro_step, trainer.last_step = 0, None
    trainer.train(resume_from_checkpoint=settings.resume_from_checkpoint)
    evaluation = last_evaluation(trainer) if settings.eval_ratio else None

    if training_args.process_index != 0:
        return None
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    digest = model_weights_digest(trainer.model.state_dict())
    return print_result(losses[-1], trainer.state.global_step, digest, evaluation)


def last_evaluation(trainer) -> dict:
    """The evaluation of the final weights: the one the last step made (the end of an epoch),
    or a new one (--max-steps ended mid-epoch). Every rank calls it: it all-reduces."""
    evaluations = [e for e in trainer.state.log_history if "eval_loss" in e]
    if evaluations and evaluations[-1]["step"] == trainer.state.global_step:
        return evaluations[-1]
    return trainer.evaluate()


if __name__ == "__main__":
    with exit_on_user_error():  # --model-path offline: one sentence, exit status 2
        main()
