"""The checks of tests/test_trainers.py that need two processes: run under torchrun (gloo, CPU).

    torchrun --nproc-per-node 2 tests/torchrun_checks.py trainer,accelerate,torchrun OUT

For each way to train asked for (examples/trainer.py, examples/accelerate_loop.py,
examples/torchrun.py), one after the other in the same launch (one launch, not one per way: each
process imports torch and transformers once, about 10 s of CPU):

1. the example itself, 2 epochs uninterrupted with 2 workers (their prefetching is what a
   checkpoint must not count as trained), then resumed from its checkpoint at a step of epoch 1,
   with 0 and with 2 workers: every run's --log-samples file and its printed loss and weights
   digest. The resumed runs start from the uninterrupted run's own checkpoint (the file a run
   stopped there would have left: the same save at the same step) and from a copy of its sample
   log, which the resume cuts back to that step: no separate runs up to the stop, and one
   checkpoint a run, not one every 2 steps (each holds TinyVLM's 49k-token embeddings and their
   Adam state);
2. one optimizer step of 2 ranks x 2 micro-batches against one process on the same 4 batches
   (relative gradient difference), with the way's loss and with a per-micro-batch mean;
3. what only this way has: accelerate refuses our loaders in one sentence on both ranks (and
   then the ranks still meet: no hang); torchrun's FSDP2 gradient, and data-parallel groups.

Rank 0 writes OUT/WAY/results.json. The process group has a short timeout: a hang fails.
"""

import contextlib
import copy
import datetime
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.flags import parse_flags
from mmdp.packing.packing_config import PackingConfig
from mmdp.training.ddp import flat_gradient, one_process_gradient, relative_difference
from mmdp.training.examples import TrainingSettings, make_loader
from mmdp.training.recipes import touch_every_parameter

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = {"trainer": "trainer.py", "accelerate": "accelerate_loop.py", "torchrun": "torchrun.py"}
WAYS = tuple(EXAMPLES)
# 52 rows: 5 batches of 2 packs per rank and epoch; with 2 micro-batches a step, steps of 2, 2
# and 1 batches, so epoch 1 is steps 4-6, and step 4 is a checkpoint inside it.
EPOCHS_STEPS, STOP_AT = 6, 4
SETTINGS = ["--num-rows", "52", "--grad-accum", "2", "--save-steps", str(STOP_AT)]
STREAM_STEPS, STREAM_STOP_AT = 8, 5  # MMDPTrainer on a stream: several stream epochs


def example(way: str):
    """examples/<way>.py as a module (its main(argv) returns what rank 0 printed)."""
    spec = importlib.util.spec_from_file_location(
        f"example_{way}", REPO / "examples" / EXAMPLES[way]
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stop_and_resume(main, out: str) -> dict:
    """Part 1: the uninterrupted run, and runs resumed from its checkpoint at STOP_AT, per
    worker count (each with the uninterrupted run's sample log, as a run stopped there left it)."""

    def run(name, workers, resume=None):
        args = SETTINGS + ["--num-workers", str(workers), "--max-steps", str(EPOCHS_STEPS)]
        args += ["--output-dir", f"{out}/{name}", "--log-samples", f"{out}/{name}.jsonl"]
        if resume:
            args += ["--resume-from-checkpoint", f"{out}/uninterrupted/checkpoint-{resume}"]
        return main(args)

    results = {"uninterrupted": run("uninterrupted", 2)}
    for workers in (0, 2):
        name = f"resumed_{workers}_workers"
        if dist.get_rank() == 0:
            shutil.copy(f"{out}/uninterrupted.jsonl", f"{out}/{name}.jsonl")
        dist.barrier()
        results[name] = run(name, workers, resume=STOP_AT)
    return results


def example_args():
    """The examples' settings, with no DataLoader workers, for the checks below."""
    return parse_flags(TrainingSettings, "", SETTINGS + ["--output-dir", "-", "--num-workers", "0"])


def first_batches(rank: int, micro_steps: int = 2) -> list[dict]:
    """The first micro-batches the examples' loader gives `rank` of 2."""
    loader, tokenizer = make_loader(example_args(), rank=rank, world_size=2)
    return [batch for _, batch in zip(range(micro_steps), loader)], tokenizer


def reference_gradient(model) -> list[float] | None:
    """One process's gradient on every rank's first two micro-batches (rank 0 only)."""
    if dist.get_rank() != 0:
        return None
    union = first_batches(0)[0] + first_batches(1)[0]
    return one_process_gradient(copy.deepcopy(model), union)


class GradientRecorder(torch.optim.SGD):
    """An optimizer that does not move (lr 0) and keeps the gradient of its first step."""

    def __init__(self, params):
        self.params_in_order = list(params)
        super().__init__(self.params_in_order, lr=0.0)
        self.gradients = []

    def step(self, closure=None):
        grads = [
            p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            for p in self.params_in_order
            if p.grad is not None
        ]
        self.gradients.append(torch.cat([g.flatten() for g in grads]).clone())
        return super().step(closure)


def compare(gradient, expected) -> float | None:
    return None if expected is None else relative_difference(gradient, expected)


# Part 2 and 3, per way ---------------------------------------------------------------------------


def trainer_gradients(module, out: str) -> dict:
    """MMDPTrainer's first step: token_loss (with and without the model accepting loss kwargs),
    and the model's own per-micro-batch mean under accepts_loss_kwargs=False (Qwen2.5-VL's)."""
    from transformers import TrainerCallback, TrainingArguments

    from mmdp.training.trainer import MMDPTrainer, token_loss

    _, tokenizer = first_batches(dist.get_rank())
    args_ns = example_args()
    model, inputs = module.make_model(args_ns, tokenizer)
    module.untie_output_layer(model)
    expected = reference_gradient(model)

    class Keep(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            self.gradient = flat_gradient(model).clone()

    results = {}
    cases = {
        "token_loss": (token_loss, True),
        "token_loss_no_loss_kwargs": (token_loss, False),
        "per_micro_batch_mean_no_loss_kwargs": (None, False),
    }
    for name, (loss_func, accepts) in cases.items():
        trained = copy.deepcopy(model)
        trained.accepts_loss_kwargs = accepts
        keep = Keep()
        training_args = TrainingArguments(
            output_dir=f"{out}/gradient_{name}",
            max_steps=1,
            gradient_accumulation_steps=2,
            max_grad_norm=0.0,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            learning_rate=1e-3,
        )
        loader, _ = make_loader(args_ns, rank=dist.get_rank(), world_size=2)
        trainer = MMDPTrainer(
            model=trained,
            args=training_args,
            train_loader=loader,
            model_inputs=inputs,
            compute_loss_func=loss_func,
            callbacks=[keep],
        )
        trainer.train()
        results[name] = compare(keep.gradient, expected)
    return results


def trainer_on_a_stream(module, out: str) -> dict:
    """MMDPTrainer on a StreamingDataLoader (one endless pass to Trainer, over several epochs of
    the stream): 8 steps uninterrupted, and resumed from its checkpoint at step 5 (the only one
    it saves). Returns, per run, the micro-batches' rows in order, the stream's epoch at the end
    and the weights' digest."""
    from transformers import TrainingArguments

    from mmdp.data.tokenizer import get_tokenizer
    from mmdp.loading.streaming import StreamingDataLoader, StreamingPackedDataset
    from mmdp.training.examples import IMAGE_SIZE, model_weights_digest, tiny_vlm
    from mmdp.training.trainer import MMDPTrainer

    def run(name: str, resume: int | None = None) -> dict:
        tokenizer = get_tokenizer()
        rows = load_vqa_dataset(None, num_rows=52).to_iterable_dataset(num_shards=4)
        config = PackingConfig(max_length=256, packs_per_batch=2, buffer_size=16)
        dataset = StreamingPackedDataset(rows, tokenizer, config=config, image_size=IMAGE_SIZE)
        loader = StreamingDataLoader(dataset, num_workers=0)
        model, inputs = tiny_vlm(tokenizer, seed=0)
        module.untie_output_layer(model)
        seen = []

        class Seen(MMDPTrainer):
            def training_step(self, model, batch, num_items_in_batch=None):
                seen.append(batch["sample_index"].tolist())
                return super().training_step(model, batch, num_items_in_batch)

        args = TrainingArguments(
            output_dir=f"{out}/{name}", max_steps=STREAM_STEPS, gradient_accumulation_steps=2,
            save_steps=STREAM_STOP_AT, lr_scheduler_type="constant", use_cpu=True, report_to="none",
            disable_tqdm=True,
        )  # fmt: skip
        trainer = Seen(model=model, args=args, train_loader=loader, model_inputs=inputs)
        checkpoint = f"{out}/stream_uninterrupted/checkpoint-{resume}" if resume else None
        trainer.train(resume_from_checkpoint=checkpoint)
        return {
            "seen": seen,
            "stream_epoch": dataset.epoch,
            "digest": model_weights_digest(trainer.model.state_dict()),
        }

    return {
        "uninterrupted": run("stream_uninterrupted"),
        "resumed": run("stream_resumed", resume=STREAM_STOP_AT),
        "resumed_at": STREAM_STOP_AT,
    }


def loop_gradients(module, way: str) -> dict:
    """One step of the example's train_step against one process, and of a per-micro-batch mean."""
    batches, tokenizer = first_batches(dist.get_rank())
    args_ns = example_args()
    model, inputs = module.make_model(args_ns, tokenizer)
    expected = reference_gradient(model)
    results = {}

    if way == "accelerate":
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)  # as the example: every loss touches every parameter
        wrapped = accelerator.prepare(copy.deepcopy(model))
        recorder = GradientRecorder(wrapped.parameters())
        module.train_step(accelerator, wrapped, recorder, batches, inputs)
    else:
        wrapped = module.wrap(copy.deepcopy(model), fsdp2=False, device="cpu")
        recorder = GradientRecorder(wrapped.parameters())
        module.train_step(wrapped, recorder, batches, inputs, "cpu")
    results["recipe"] = compare(recorder.gradients[0], expected)

    # the usual mistake: each micro-batch's own mean, divided by the micro-batches
    wrapped.zero_grad(set_to_none=True)
    for i, batch in enumerate(batches):
        sync = contextlib.nullcontext() if i == len(batches) - 1 else wrapped.no_sync()
        with sync:
            touch_every_parameter(wrapped(**inputs(batch)).loss / len(batches), wrapped).backward()
    results["per_micro_batch_mean"] = compare(flat_gradient(wrapped), expected)
    if way == "torchrun":
        results.update(torchrun_extras(module, model, batches, inputs, expected))
    else:
        results.update(accelerate_refusals(args_ns))
    return results


def torchrun_extras(module, model, batches, inputs, expected) -> dict:
    """FSDP2's gradient with the same recipe, and data-parallel groups of one rank each."""
    results = {}
    try:
        wrapped = module.wrap(copy.deepcopy(model), fsdp2=True, device="cpu")
        recorder = GradientRecorder(wrapped.parameters())
        module.train_step(wrapped, recorder, batches, inputs, "cpu")
        results["fsdp2_recipe"] = compare(recorder.gradients[0], expected)
    except Exception as error:  # noqa: BLE001 - reported, and the test says what failed
        results["fsdp2_error"] = f"{type(error).__name__}: {error}"[:300]
    # Two replicas of one rank each (as with tensor parallelism over both processes): both
    # processes are rank 0 of their group and must read the same batches.
    groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
    loader, _ = make_loader(example_args())
    from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset

    own = PackedDataset(
        loader.dataset.dataset,
        config=PackingConfig(max_length=256, packs_per_batch=2),
        group=groups[dist.get_rank()],
    )
    rows = [b["sample_index"].tolist() for b in PackedDataLoader(own, num_workers=0)]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, rows)
    results["group_rank_and_size"] = [own.rank, own.world_size]
    results["groups_read_the_same_batches"] = every[0] == every[1]
    return results


def accelerate_refusals(args_ns) -> dict:
    """accelerator.prepare(loader), and accelerate's own wrappers, on both ranks."""
    from accelerate import Accelerator
    from accelerate.data_loader import prepare_data_loader

    from mmdp.loading.streaming import StreamingDataLoader, StreamingPackedDataset

    accelerator = Accelerator(cpu=True)
    loader, tokenizer = make_loader(args_ns, rank=dist.get_rank(), world_size=2)
    stream = StreamingDataLoader(
        StreamingPackedDataset([{"images": [], "texts": []}], tokenizer), num_workers=0
    )
    said = {}
    attempts = {
        "prepare": lambda: accelerator.prepare(loader),
        "prepare_stream": lambda: accelerator.prepare(stream),
        "dispatched": lambda: next(
            iter(prepare_data_loader(loader, put_on_device=True, dispatch_batches=True))
        ),
        "sharded": lambda: next(iter(prepare_data_loader(loader, dispatch_batches=False))),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            said[name] = None
        except Exception as error:  # noqa: BLE001 - the sentence is what the test checks
            said[name] = f"{type(error).__name__}: {error}"
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, said)  # both ranks got here: no one waits forever
    return {"refusals_per_rank": every}


def main() -> None:
    ways, out = sys.argv[1].split(","), sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))
    check_ways(ways, out)
    dist.destroy_process_group()


def check_ways(ways: list[str], out: str) -> None:
    """Every way in turn, in the process group already started (tests/torchrun_trainers.py)."""
    torch.set_num_threads(1)
    for way in ways:
        way_out = os.path.join(out, way)
        os.makedirs(way_out, exist_ok=True)
        check_one_way(way, way_out)


def check_one_way(way: str, out: str) -> None:
    """Parts 1-3 for one way; rank 0 writes OUT/results.json."""
    module = example(way)
    results = {"way": way, "runs": stop_and_resume(module.main, out)}
    if way == "trainer":
        results["gradients"] = trainer_gradients(module, out)
        stream = trainer_on_a_stream(module, out)
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, stream)
        results["stream_per_rank"] = every
    else:
        results["gradients"] = loop_gradients(module, way)
    if dist.get_rank() == 0:
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()


if __name__ == "__main__":
    main()
