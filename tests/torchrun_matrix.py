"""The trainer matrix: every model family through every way of training, against the unpacked
reference. Run by tests/test_trainer_matrix.py, in one process or under torchrun (gloo, CPU):

    torchrun --nproc-per-node 2 tests/torchrun_matrix.py trainer,accelerate,ddp,fsdp2,own_loop OUT

One launch runs every path asked for (comma-separated; one path alone works too) on every family
(FAMILIES: mmdp's TinyVLM, a tiny random model of each real transformers class, and the Qwen3-VL
mixture-of-experts class): the process group, the imports and each family's tiny model and
samples are made once for all paths (each launch starts 3 processes that import torch and
transformers). For each path and family:

1. the path takes one optimizer step of 2 ranks x 2 micro-batches (1 process x 4 in a test's
   own process) on the packed batches the family's PackedDataLoader gives each rank;
2. for the pairs in CONTROLS, the same step with the path's negative control: each
   micro-batch's own mean loss (the model's `.loss`; under Trainer, no compute_loss_func and
   accepts_loss_kwargs=False);
3. rank 0 runs the unpacked reference: every sample of every rank's micro-batches alone,
   summed token loss / all the step's label tokens, and compares each parameter's gradient.

Rank 0 writes OUT/results.json: {path: {family: {"exact", "exact_vision", "control" (None
off CONTROLS), "vision_params", "samples"}}}, where "exact" is the largest relative difference
||g - g_ref|| / ||g_ref|| over every parameter, and "exact_vision" over the vision tower's. A
path x family that raises on both ranks is written as {"error": "..."} and the launch goes on, so
each path's test fails on its own.
"""

import copy
import datetime
import functools
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import torch
import torch.distributed as dist

from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.packing_config import PackingConfig
from mmdp.training.loss import label_tokens, summed_loss
from mmdp.training.recipes import (
    gradient_sync,
    micro_batch_loss,
    mixed_precision,
    optimizer_steps,
    step_label_tokens,
    touch_every_parameter,
)

REPO = Path(__file__).resolve().parents[1]
FAMILIES = (
    "tiny",
    "qwen2_5_vl",
    "qwen3_vl",
    "smolvlm",
    "llava_onevision",
    "gemma3",
    "qwen3_vl_moe",
)
PATHS = ("trainer", "accelerate", "ddp", "fsdp2", "own_loop")
# The negative controls under torchrun: each family on one path, each path on at least one family
# (tiny on trainer, qwen2_5_vl on accelerate, ..., gemma3 on trainer again). A control shows that
# the comparison can fail: for a family, that its batches' micro-batch means differ from the
# step's; for a path, that its way of normalising is what the comparison sees. Every pair's
# control would double the launch's steps (35 controls, the matrix's costliest part) and show
# nothing these 7 do not. The default suite runs 5 other pairs' controls (test_trainer_matrix.FAST).
CONTROLS = tuple((PATHS[i % len(PATHS)], family) for i, family in enumerate(FAMILIES))
PACKS_PER_BATCH = 2
SAMPLES_PER_PACK = 3  # about: packs hold max(longest sample, 3 average samples) tokens
TOLERANCE = 1e-5  # float32 sums in another order: the packed step's gradient within this
# A parameter's error is relative to its own gradient, but no less than this share of the whole
# model's: some exact gradients are 0 (a key projection's bias: softmax ignores it), and their
# rounding noise (1e-10) has no size to be relative to.
NOISE_FLOOR = 1e-4


@dataclass
class Case:
    """One family's samples, its tiny model (the same initial weights for every path) and the
    batch keys it takes: `inputs(batch, model)`; `references` keeps the unpacked reference's
    gradients by the rows they cover, `loaders` each rank's loader (new, empty ones for a
    dataclasses.replace'd case)."""

    name: str
    samples: VQADataset
    model: torch.nn.Module
    inputs: object
    max_length: int
    references: dict = field(default_factory=dict, init=False, repr=False)
    loaders: dict = field(default_factory=dict, init=False, repr=False)


@functools.cache
def family_case(name: str) -> Case:
    """The family's case, built once per process and shared by every path (deep-copied)."""
    from mmdp.data.families import tiny_processor
    from mmdp.models.inputs import model_inputs
    from mmdp.models.tiny import tiny_model
    from mmdp.training.examples import IMAGE_SIZE, tiny_vlm

    rows = matrix_rows()
    if name == "tiny":
        from mmdp.data.tokenizer import get_tokenizer

        tokenizer = get_tokenizer()
        samples = VQADataset(rows, tokenizer, image_size=IMAGE_SIZE)
        model, inputs = tiny_vlm(tokenizer, seed=0)
    else:
        processor = tiny_processor("qwen3_vl" if name == "qwen3_vl_moe" else name)
        samples = VQADataset(rows, processor)
        model = tiny_model(processor, **({"moe": True} if name == "qwen3_vl_moe" else {}))
        inputs = model_inputs
    lengths = samples.family.weigh(rows["texts"], rows["images"])[0]
    max_length = max(max(lengths), SAMPLES_PER_PACK * sum(lengths) // len(lengths))
    return Case(name, samples, model.train(), inputs, max_length)


def matrix_rows(num_rows: int = 36):
    """Short conversations with small images of many shapes (0, 1 or 2 a row): packs of a few
    samples each, fast on CPU, and every rank's micro-batches hold images."""
    from PIL import Image

    from mmdp.data.synthetic.rows import encode_png

    sizes = [(40, 30), (24, 72), (64, 64), (90, 20), (33, 47), (56, 28)]
    rows = []
    for i in range(num_rows):
        colour = (40 * i % 256, 90, 200 - 5 * i)
        images = [
            {"bytes": encode_png(Image.new("RGB", sizes[(i + k) % 6], colour)), "path": None}
            for k in range(i % 3)
        ]
        reply = " ".join(["A coloured box."] * (1 + i % 4))
        texts = [{"user": f"Question {i}: what is it?", "assistant": reply, "source": "matrix"}]
        if i % 5 == 0:
            texts.append({"user": "And then?", "assistant": "Nothing more.", "source": "matrix"})
        rows.append({"images": images, "texts": texts})
    return datasets.Dataset.from_list(rows)


def make_loader(case: Case, rank: int, world_size: int) -> PackedDataLoader:
    """The rank's loader at the start of its first epoch. Made once per case and rank (a new
    PackedDataset weighs the rows and hashes the tokenizer again: about 0.1 s, 70 times a rank
    in the matrix), then rewound with its own first state_dict for every step."""
    if (rank, world_size) not in case.loaders:
        dataset = PackedDataset(
            case.samples,
            config=PackingConfig(
                max_length=case.max_length, packs_per_batch=PACKS_PER_BATCH, seed=0
            ),
            rank=rank,
            world_size=world_size,
        )
        loader = PackedDataLoader(dataset, num_workers=0)
        case.loaders[rank, world_size] = loader, loader.state_dict()
    loader, start = case.loaders[rank, world_size]
    loader.load_state_dict(start)
    return loader


# The reference and the comparison ------------------------------------------------------------


def alone_inputs(case: Case, sample: dict) -> dict:
    """One sample as the model takes it unpacked: no positions (the model computes its own),
    its images and videos as the family collates them, no cache."""
    inputs = {"input_ids": sample["input_ids"][None]}
    if case.name == "tiny":
        return {**inputs, "pixel_values": sample["pixel_values"]}
    family = case.samples.family
    inputs.update({key: sample[key][None] for key in family.token_keys})
    if sample["image_count"] or sample.get("video_count"):
        inputs.update(family.collate_vision([sample]))
    return {**inputs, "use_cache": False}


def reference_gradients(case: Case, rows: list[int]) -> dict:
    """The unpacked reference: each sample alone, summed token loss / all their label tokens.
    Computed once per case and rows: every path trains the same rows from the same initial
    weights (each step deep-copies case.model), so the five paths share one reference."""
    key = tuple(sorted(rows))  # the same samples in another order: the same sum
    if key not in case.references:
        case.references[key] = alone_gradients(case, rows)
    return case.references[key]


def alone_gradients(case: Case, rows: list[int]) -> dict:
    model = copy.deepcopy(case.model)
    samples = [case.samples[row] for row in rows]
    tokens = sum(label_tokens(sample["labels"][None]) for sample in samples)
    for sample in samples:
        # the cross entropy of the full logits in float64: float32's (its log-softmax) is 2.6e-5
        # off it on Gemma 3's gradient, and the trainers' loss over the trained positions 3e-6
        logits = model(**alone_inputs(case, sample)).logits.double()
        (summed_loss(logits, sample["labels"][None]) / tokens).backward()
    return named_gradients(model)


def named_gradients(model) -> dict:
    """Every trainable parameter's whole gradient (FSDP2's shards gathered: a collective, so
    every rank calls it), zeros where it has none."""
    gradients = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        grad = parameter.grad
        if grad is None:
            grad = torch.zeros(parameter.shape)
        elif hasattr(grad, "full_tensor"):
            grad = grad.full_tensor()
        gradients[name] = grad.detach().cpu().clone()
    return gradients


def is_vision(name: str) -> bool:
    return "vision" in name or "visual" in name


def difference(gradients: dict, expected: dict, vision_only: bool = False) -> float:
    """The largest ||g - g_ref|| / ||g_ref|| over the parameters (see NOISE_FLOOR)."""
    whole = float(torch.cat([grad.flatten() for grad in expected.values()]).norm())
    worst = 0.0
    for name, reference in expected.items():
        if vision_only and not is_vision(name):
            continue
        error = float((gradients[name] - reference).norm())
        worst = max(worst, error / max(float(reference.norm()), NOISE_FLOOR * whole))
    return worst


# The paths: each takes one optimizer step and returns (gradients, rows trained) -------------


def example(name: str):
    """examples/<name> as a module."""
    spec = importlib.util.spec_from_file_location(name[:-3], REPO / "examples" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class GradientRecorder(torch.optim.SGD):
    """An optimizer that does not move (lr 0) and keeps the gradients of its first step."""

    def __init__(self, model):
        self.model = model
        super().__init__(model.parameters(), lr=0.0)
        self.gradients = None

    def step(self, closure=None):
        if self.gradients is None:
            self.gradients = named_gradients(self.model)
        return super().step(closure)


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rows_of(micro_batches: list[dict]) -> list[int]:
    return [row for batch in micro_batches for row in batch["sample_index"].tolist()]


def trainer_step(case: Case, grad_accum: int, control: bool, out: str):
    """MMDPTrainer, as examples/trainer.py builds it (control: the model's own mean loss)."""
    from transformers import TrainerCallback, TrainingArguments

    from mmdp.training.trainer import MMDPTrainer

    model = copy.deepcopy(case.model)
    rows, kept = [], {}

    class Keep(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            kept.update(named_gradients(model))

    class Recorded(MMDPTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            rows.extend(inputs["sample_index"].tolist())
            return super().training_step(model, inputs, num_items_in_batch)

    extra = {}
    if control:  # Trainer then divides each micro-batch's own mean by the accumulation steps
        model.accepts_loss_kwargs = False
        extra["compute_loss_func"] = None
    args = TrainingArguments(
        output_dir=out,
        max_steps=1,
        gradient_accumulation_steps=grad_accum,
        max_grad_norm=0.0,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    rank, world_size = rank_and_world()
    trainer = Recorded(
        model=model,
        args=args,
        train_loader=make_loader(case, rank, world_size),
        model_inputs=case.inputs,
        callbacks=[Keep()],
        **extra,
    )
    trainer.train()
    return kept, rows


def per_micro_batch_mean(model, unwrapped, micro_batches, inputs) -> None:
    """The usual mistake: each micro-batch's own mean loss, divided by the micro-batches."""
    for i, batch in enumerate(micro_batches):
        with gradient_sync(model, sync=i == len(micro_batches) - 1):
            loss = model(**inputs(batch, unwrapped)).loss / len(micro_batches)
            touch_every_parameter(loss, model).backward()  # DDP: no unused parameter


def first_step(case: Case, grad_accum: int) -> list[dict]:
    rank, world_size = rank_and_world()
    return next(optimizer_steps(make_loader(case, rank, world_size), grad_accum))


def accelerate_step(case: Case, grad_accum: int, control: bool, out: str):
    """examples/accelerate_loop.py's train_step."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)  # as the example: every loss touches every parameter
    model = copy.deepcopy(case.model)
    wrapped = accelerator.prepare(model)
    recorder = GradientRecorder(model)
    micro_batches = first_step(case, grad_accum)
    if control:
        per_micro_batch_mean(wrapped, model, micro_batches, case.inputs)
        recorder.step()
    else:
        example("accelerate_loop.py").train_step(
            accelerator, wrapped, recorder, micro_batches, case.inputs
        )
    return recorder.gradients, rows_of(micro_batches)


def torchrun_step(case: Case, grad_accum: int, control: bool, out: str, fsdp2: bool):
    """examples/torchrun.py's wrap and train_step (DDP, or FSDP2's fully_shard)."""
    module = example("torchrun.py")
    model = copy.deepcopy(case.model)
    wrapped = module.wrap(model, fsdp2=fsdp2, device="cpu")
    recorder = GradientRecorder(model)
    micro_batches = first_step(case, grad_accum)
    if control:
        per_micro_batch_mean(wrapped, model, micro_batches, case.inputs)
        recorder.step()
    else:
        module.train_step(wrapped, recorder, micro_batches, case.inputs, "cpu")
    return recorder.gradients, rows_of(micro_batches)


def own_loop_step(case: Case, grad_accum: int, control: bool, out: str):
    """The loop of your own in docs/use-in-your-trainer.md, as written there (DDP when launched
    by torchrun)."""
    from torch.nn.parallel import DistributedDataParallel

    model = copy.deepcopy(case.model)
    rank, world_size = rank_and_world()
    wrapped = model
    if world_size > 1:
        wrapped = DistributedDataParallel(model)
    optimizer = GradientRecorder(model)
    loader = make_loader(case, rank, world_size)
    inputs = case.inputs
    for micro_batches in optimizer_steps(loader, grad_accum):
        if control:
            per_micro_batch_mean(wrapped, model, micro_batches, inputs)
        else:  # the documented loop, line for line
            tokens = step_label_tokens(micro_batches)
            for i, batch in enumerate(micro_batches):
                with gradient_sync(wrapped, i == len(micro_batches) - 1):
                    with mixed_precision("cpu", bf16=False):
                        loss = micro_batch_loss(
                            wrapped, inputs(batch, model), batch, tokens, world_size
                        )
                    touch_every_parameter(loss, wrapped).backward()
        optimizer.step()
        optimizer.zero_grad()
        return optimizer.gradients, rows_of(micro_batches)


STEPS = {
    "trainer": trainer_step,
    "accelerate": accelerate_step,
    "ddp": functools.partial(torchrun_step, fsdp2=False),
    "fsdp2": functools.partial(torchrun_step, fsdp2=True),
    "own_loop": own_loop_step,
}


def measure(
    path: str, family: str, grad_accum: int, out: str, with_control: bool = True
) -> dict | None:
    """One path's step (and its negative control) for one family, against the unpacked
    reference of every rank's micro-batches (on rank 0; None on the other ranks)."""
    return measure_case(path, family_case(family), grad_accum, out, with_control)


def measure_case(
    path: str, case: Case, grad_accum: int, out: str, with_control: bool = True
) -> dict | None:
    """measure() for any case (a PEFT-wrapped model: tests/test_lora.py)."""
    step = STEPS[path]
    got, rows = step(case, grad_accum, False, f"{out}/{case.name}")
    control = None
    if with_control:
        control, _ = step(case, grad_accum, True, f"{out}/{case.name}_control")
    every = [rows]
    if dist.is_available() and dist.is_initialized():
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, rows)
    if rank_and_world()[0] != 0:
        return None
    union = [row for rank_rows in every for row in rank_rows]
    expected = reference_gradients(case, union)
    vision = [name for name, grad in expected.items() if is_vision(name) and grad.norm() > 0]
    return {
        "exact": difference(got, expected),
        "exact_vision": difference(got, expected, vision_only=True),
        "control": None if control is None else difference(control, expected),
        "vision_params": len(vision),
        "samples": len(union),
        "micro_batches": grad_accum * len(every),
    }


def measure_or_error(path: str, family: str, out: str) -> dict | None:
    """measure(), or the error it raised: a bug in one path (raised alike on both ranks, which
    then meet again at the next barrier) fails that path's test, not the whole launch."""
    try:
        with_control = (path, family) in CONTROLS
        return measure(path, family, grad_accum=2, out=out, with_control=with_control)
    except Exception as error:  # noqa: BLE001 - reported per path x family, the test fails it
        return {"error": f"{type(error).__name__}: {error}"[:500]}


def main() -> None:
    paths, out = sys.argv[1].split(","), sys.argv[2]
    families = sys.argv[3:] or FAMILIES
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=900))
    measure_matrix(paths, families, out)
    dist.destroy_process_group()


def measure_matrix(paths: list[str], families: list[str], out: str) -> None:
    """Every path on every family, in the process group already started
    (tests/torchrun_trainers.py); rank 0 writes OUT/results.json."""
    torch.set_num_threads(1)
    results = {}
    for path in paths:
        results[path] = {}
        for family in families:
            results[path][family] = measure_or_error(path, family, f"{out}/{path}")
            if dist.get_rank() == 0:
                print(f"{path} x {family}: {results[path][family]}", flush=True)
            dist.barrier()
    if dist.get_rank() == 0:
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()


if __name__ == "__main__":
    main()
