"""One training step of a real VLM, fed by mmdp's loaders: naive padding, constrained padding
and packing (images_first_bfd) at the same budgets, as time (issue 53).

    uv run bench/bench_train_step.py --preset cpu          # 2 CPU cores: 3.5-5 min
    uv run bench/bench_train_step.py --preset gpu          # one GPU: Qwen2.5-VL-3B's sizes, bf16
    uv run bench/bench_train_step.py --preset gpu --device cpu --dtype float32 --layers 1 \
        --batch-size 2 --packs-per-batch 1 --max-length 384 --warmup 0 --steps 1 --rounds 1 \
        --num-rows 64 --num-workers 1                      # the gpu preset's code on a CPU, small

The model is Qwen2_5_VLForConditionalGeneration, transformers' own class, built from a config
written here (no download; random weights: a step's time does not depend on them):

    gpu  Qwen2.5-VL-3B-Instruct's config.json: 36 decoder layers of hidden size 2,048 (MLP
         11,008, 16 heads, 2 key-value heads, tied embeddings), a 32-block vision tower of width
         1,280; bfloat16 weights and AdamW state; every attention implementation mmdp packs for
         that is there, in turn: sdpa, flex_attention, flash_attention_2 where flash-attn is
         installed (on a CPU: sdpa alone)
    cpu  the same class scaled to 2 cores: 14 decoder layers of hidden size 384 (MLP 2,064: the
         3B's ratio; 6 heads of 64, 2 key-value heads), a 2-block vision tower of width 128;
         float32 (an AVX2 CPU has no fast bfloat16), sdpa, torch on one thread (--threads 1):
         the other core runs the loader's worker, and 2 threads on a busy 2-core machine wait
         on each other at every operation (measured: a packed step of 512 tokens 28 s on 2
         threads, 3.8 s on one, at load average 7)

Both keep our tokenizer's vocabulary (49,156 tokens, not Qwen's 151,936), and the trainers'
loss: the output layer runs on the trained positions only (mmdp.training.loss.batch_loss, through
micro_batch_loss), so the decoder layers, not the output layer, are most of a step (the run
prints how a packed step's matrix products on the weights split between the decoder layers, the
output layer and the vision tower).

Every step is a trainer's: the loader's next batch, model_inputs(batch, model), the model called
as model(**inputs) inside micro_batch_loss, backward, AdamW (fused: Trainer's default), zero_grad.
The batches come from the embedded dataset through Qwen2.5-VL's processor (built offline), made in
DataLoader workers (--num-workers) while the model computes, as in training:

    naive        a torch DataLoader over VQADataset, --batch-size samples each padded to the
                 longest of its batch (stage 2)
    constrained  the same, every row padded to --max-length, longer samples dropped (stage 3)
    packed       PackedDataLoader: --packs-per-batch packs of --max-length tokens (and the
                 family's patch budget), packed by images_first_bfd (stage 5)

mmdp's padding collators (stages 2-3) build TinyVLM's batches only; here each padded row is a pack
of one sample (mmdp's layout_pack + collate_packs: PaddedRows), so a padded batch carries what a
real family's model takes (Qwen's 4-row position_ids, mm_token_type_ids, image_grid_thw) and its
padding tail runs through every layer, as it does beside an attention_mask.

Two orders (--interleave, --no-interleave). The cpu preset interleaves: one loader per
strategy, all running in their workers, a step of each in turn (the order reversed every other
step), so that on a machine shared with other jobs each strategy meets their load alike (side by
side, each meets whatever load its own minutes bring). Each loader then has three steps' time to
make its next batch, so its wait is a floor; on the cpu preset a batch takes its worker about
0.4 s against steps of 5-20 s. The gpu preset runs the strategies side by side: --rounds rounds
(the order reversed every other round), each strategy alone with a fresh loader, as in training,
so the wait is the one training sees. Either way the first --warmup steps of each loader (workers
starting, the optimizer's state, compiles) are not counted. Per strategy, over the counted
steps:

    step (s)          median time of a whole step: waiting for the batch, then computing it
    real tok/s        real tokens over the time of the steps that hold them, summed (real: not
                      padding, the batch's real_token_mask; prompts and image tokens included)
    computed tok/s    the same for computed tokens: rows x row length
    waste             computed tokens / real tokens, summed over the same steps
    ms / real token   1,000 / real tok/s: what the figure draws
    loader wait       time blocked in next(loader), summed, over the steps' time, summed
    peak (GB)         the most one more step holds above what it starts with (activations,
                      gradients, temporaries; the weights and AdamW's state are there before),
                      taken after the timed rounds on the next round's first batch: CUDA,
                      torch.cuda.max_memory_allocated above memory_allocated at the step's start;
                      CPU, the process's resident-set high-water mark (VmHWM, reset through
                      /proc/self/clear_refs) above its resident set at the step's start, glibc
                      told first to map every allocation over 1 MiB on its own (mallopt
                      M_MMAP_THRESHOLD: torch's CPU tensors are plain malloc'ed memory, and freed
                      ones then leave the resident set). Not during the timed steps: a fresh
                      mapping per tensor costs page faults the default malloc does not.

    packed/naive      packed real tok/s over naive's
    waste ratio       naive's waste over packed's: how many more tokens naive padding computes
                      per real token. Were a step's time its computed tokens' alone, packed/naive
                      would equal it; the output layer (on trained positions: the same for both),
                      the vision tower (per image) and the optimizer (per step) do not shrink
                      with padding, and sdpa computes a packed row's attention densely, masked.

The last line: `train step: packed/naive real tok/s N.NNx (waste N.NNx), peak memory packed N.N GB
/ naive N.N GB, loader wait N.N%` (the loader wait: packed's), for the attention implementation
whose packed steps were fastest. The figure (--figure; assets/train_step.png for the cpu preset,
train_step_gpu.png beside it for the gpu one) draws the time per real token of each strategy.
"""

import argparse
import ctypes
import dataclasses
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from matplotlib.figure import Figure
from torch.utils.data import DataLoader

from mmdp import (
    PackedDataLoader,
    PackedDataset,
    PackingConfig,
    VQADataset,
    load_vqa_dataset,
    micro_batch_loss,
    model_inputs,
    real_token_mask,
    step_label_tokens,
)
from mmdp.batch import collate_packs, layout_pack
from mmdp.data.families import offline_processor

REPO = Path(__file__).resolve().parents[1]
FAMILY = "qwen2_5_vl"
STRATEGIES = ("naive", "constrained", "images_first_bfd")
PACKER = STRATEGIES[-1]
GB = 1e9

# Qwen/Qwen2.5-VL-3B-Instruct's config.json, as transformers 5.23's Qwen2_5_VLConfig takes it
# (text_config, vision_config); the vocabulary and the special tokens' ids are our tokenizer's.
QWEN2_5_VL_3B = {
    "text": {
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 128000,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [16, 24, 24],  # of the head's 64 rotary pairs (head_dim 128)
        },
    },
    "vision": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "out_hidden_size": 2048,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
    },
}

# The same architecture for 2 CPU cores: 3/16 of the width, 14 of the 36 layers, the 3B's MLP
# ratio (11,008 / 2,048), head_dim 64 (so the rotary sections halve), a small vision tower.
# 14 layers, not 10: with 10, what does not shrink with padding (the vision tower and the output
# layer, per real token; the optimizer, per step) kept packed/naive at 0.88x the waste ratio;
# with 14, 0.99x (CPU time of the same 3 batches of each strategy, one thread).
QWEN2_5_VL_CPU = {
    "text": {
        **QWEN2_5_VL_3B["text"],
        "hidden_size": 384,
        "intermediate_size": 2064,
        "num_hidden_layers": 14,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "rope_parameters": {
            **QWEN2_5_VL_3B["text"]["rope_parameters"],
            "mrope_section": [8, 12, 12],
        },
    },
    "vision": {
        **QWEN2_5_VL_3B["vision"],
        "depth": 2,
        "hidden_size": 128,
        "intermediate_size": 342,
        "num_heads": 2,
        "out_hidden_size": 384,
        "fullatt_block_indexes": [1],
    },
}

# The attention implementations a gpu run tries, where they are there (sdpa always)
GPU_ATTENTION = ("sdpa", "flex_attention", "flash_attention_2")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a run measures; a preset's values unless a flag says otherwise."""

    sizes: dict  # the model's text and vision configs (QWEN2_5_VL_3B, QWEN2_5_VL_CPU)
    dtype: str  # the weights' and AdamW state's dtype
    attention: tuple[str, ...]  # attention implementations, each run on every strategy
    max_length: int  # tokens per pack, and constrained padding's row length
    batch_size: int  # samples per padded batch (naive, constrained)
    packs_per_batch: int  # packs per packed batch
    num_workers: int  # DataLoader workers of each loader
    warmup: int  # steps not counted at the start of every loader
    steps: int  # counted steps per strategy and round
    rounds: int  # rounds of the three strategies side by side (not --interleave)
    interleave: bool  # a step of each strategy in turn, rather than each strategy's steps apart
    num_rows: int  # rows of the embedded dataset
    figure: str | None  # where the figure goes (None: no figure)
    threads: int | None = None  # torch's intra-op threads (None: torch's default, every core)
    seed: int = 0  # initial weights and data order
    layers: int | None = None  # decoder layers (and at most as many vision blocks): a smaller model
    device: str = "cpu"


PRESETS = {
    # 2 CPU cores, <= 10 minutes: 6 counted steps per strategy
    "cpu": Settings(
        sizes=QWEN2_5_VL_CPU,
        dtype="float32",
        attention=("sdpa",),
        max_length=512,
        batch_size=8,
        packs_per_batch=3,
        num_workers=1,
        warmup=1,
        steps=6,
        rounds=1,
        interleave=True,  # a busy shared machine: each strategy meets its load alike
        num_rows=2000,
        figure="assets/train_step.png",
        threads=1,  # the other core: the loader's worker (see the module docstring)
    ),
    # one GPU, <= 8 minutes: the family's own pack (2,048 tokens, 8,192 patches), 16 samples a
    # padded batch (as many as 2 packs hold, about)
    "gpu": Settings(
        sizes=QWEN2_5_VL_3B,
        dtype="bfloat16",
        attention=GPU_ATTENTION,
        max_length=2048,
        batch_size=16,
        packs_per_batch=2,
        num_workers=6,
        warmup=2,
        steps=5,
        rounds=3,
        interleave=False,  # a machine of its own: each loader alone, its wait as in training
        num_rows=2000,
        figure=str(Path("assets") / "train_step_gpu.png"),  # made the day a GPU runs it
    ),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="A flag left out takes the preset's value."
    )
    add = parser.add_argument
    add("--preset", choices=PRESETS, default="cpu", help="the model and run sizes (default cpu)")
    add("--device", default=None, help="cpu or cuda (default: cuda if there is one)")
    add("--dtype", choices=("float32", "bfloat16"), default=None, help="weights' dtype (preset's)")
    add(
        "--attention",
        default=None,
        help="comma-separated attention implementations (default: the preset's, those there)",
    )
    add("--layers", type=at_least(1), default=None, help="decoder layers (and at most as many "
        "vision blocks) instead of the preset's: the same widths, a smaller model")  # fmt: skip
    # the preset's values unless given (each flag read statically by tests/test_docs.py)
    add("--max-length", type=at_least(1), help="tokens per pack and per constrained row")
    add("--batch-size", type=at_least(1), help="samples per padded batch")
    add("--packs-per-batch", type=at_least(1), help="packs per packed batch")
    add("--num-workers", type=at_least(1), help="DataLoader workers per loader (as in training)")
    add("--warmup", type=at_least(0), help="uncounted steps at the start of every loader")
    add("--steps", type=at_least(1), help="counted steps per strategy and round")
    add("--rounds", type=at_least(1), help="rounds of the three strategies, side by side")
    add(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a step of each strategy in turn, every loader running (cpu), or each strategy's "
        "steps apart with its loader alone, in --rounds rounds (gpu)",
    )
    add("--num-rows", type=at_least(1), help="rows of the embedded dataset")
    add("--seed", type=at_least(0), help="initial weights and data order")
    add("--threads", type=at_least(1), help="torch's intra-op threads (cpu: 1; gpu: every core)")
    add("--figure", default=None, help="where to save the figure (default: the preset's)")
    add("--no-figure", action="store_true", help="save no figure")
    return parser.parse_args(argv)


def at_least(minimum: int):
    """An argparse type: an integer of at least `minimum`."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def settings_of(args) -> Settings:
    """The preset, with the flags given (a flag left out is None) applied over it."""
    preset = PRESETS[args.preset]
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    given = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(Settings)
        if getattr(args, field.name, None) is not None
    }
    attention = args.attention.split(",") if args.attention else preset.attention
    given.update(device=device, attention=tuple(a for a in attention if available(a, device)))
    if args.no_figure:
        given["figure"] = None
    return dataclasses.replace(preset, **given)


def available(attention: str, device: str) -> bool:
    """Whether this machine runs `attention` for training: flex_attention and FlashAttention
    on a GPU only (flex_attention compiles a kernel per batch shape, slowly on a CPU)."""
    if attention == "sdpa":
        return True
    if attention == "flash_attention_2":
        return device.startswith("cuda") and transformers.utils.is_flash_attn_2_available()
    return device.startswith("cuda")


# The model ----------------------------------------------------------------------------------


def build_model(settings: Settings, tokenizer, attention: str):
    """Qwen2_5_VLForConditionalGeneration from the sizes, randomly initialised on the device,
    its token ids our tokenizer's, in train mode."""
    text = {
        **settings.sizes["text"],
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    vision = dict(settings.sizes["vision"])
    if settings.layers is not None:
        text["num_hidden_layers"] = settings.layers
        vision["depth"] = min(vision["depth"], settings.layers)
        full = [i for i in vision["fullatt_block_indexes"] if i < vision["depth"]]
        vision["fullatt_block_indexes"] = full or [vision["depth"] - 1]
    tokens = ("vision_start_token", "vision_end_token", "image_token", "video_token")
    ids = {f"{name}_id": getattr(tokenizer, f"{name}_id") for name in tokens}
    config = transformers.Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=text["tie_word_embeddings"],
        **ids,
    )  # fmt: skip
    torch.manual_seed(settings.seed)
    with torch.device(settings.device):
        model = transformers.Qwen2_5_VLForConditionalGeneration._from_config(
            config, attn_implementation=attention, dtype=getattr(torch, settings.dtype)
        )
    return model.train()


def parameter_counts(model) -> dict:
    """Parameters of the decoder layers, the output layer and the vision tower."""
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    return {
        "decoder layers": count(model.get_decoder().layers),
        "output layer": count(model.get_output_embeddings()),
        "vision tower": count(model.model.visual),
    }


# The loaders --------------------------------------------------------------------------------


class PaddedRows:
    """A DataLoader's collate_fn for stages 2 and 3 with a real family: every usable sample its
    own row, a pack of one sample (layout_pack), padded to the longest of the batch (naive:
    `length` None) or to `length` (constrained: longer samples dropped), then collated as packs
    are (collate_packs): the keys and shapes the family's model takes.

    Rows of 3 and 5 tokens: naive pads both to 5, constrained with length 4 keeps the first,
    padded to 4. None when no sample is usable (the step asks for the next batch).
    """

    def __init__(self, family, length: int | None = None):
        self.family, self.length = family, length

    def __call__(self, samples: list[dict]) -> dict | None:
        usable = [s for s in samples if s["drop_reason"] is None]
        if self.length is not None:
            usable = [s for s in usable if len(s["input_ids"]) <= self.length]
        if not usable:
            return None
        width = self.length or max(len(s["input_ids"]) for s in usable)
        pad = self.family.pad_token_id
        packs = [
            {**layout_pack([s], width, pad, self.family), "batch_index": 0, "dropped": {}}
            for s in usable
        ]
        return collate_packs(packs, self.family)


def make_loaders(samples: VQADataset, settings: Settings) -> dict:
    """Per strategy, a function of the round that starts that round's loader (a fresh one, so
    that no loader fetches ahead while another strategy runs)."""
    family, pin = samples.family, settings.device.startswith("cuda")
    packing = PackingConfig(
        max_length=settings.max_length,
        max_patches=family.default_max_patches,  # a patch is a quarter token: never binding here
        packs_per_batch=settings.packs_per_batch,
        strategy=PACKER,
        seed=settings.seed,
    )
    packed = PackedDataset(samples, config=packing)

    def padded(length):
        def loader(round_: int):
            generator = torch.Generator().manual_seed(settings.seed + round_)
            return DataLoader(
                samples,
                batch_size=settings.batch_size,
                shuffle=True,
                generator=generator,
                num_workers=settings.num_workers,
                collate_fn=PaddedRows(family, length),
                pin_memory=pin,
            )

        return loader

    def packed_loader(round_: int):
        packed.set_epoch(round_)
        return PackedDataLoader(packed, num_workers=settings.num_workers, pin_memory=pin)

    return {
        "naive": padded(None),
        "constrained": padded(settings.max_length),
        PACKER: packed_loader,
    }


# One step, timed -----------------------------------------------------------------------------


GLIBC = ctypes.CDLL("libc.so.6") if sys.platform == "linux" else None


def limit_malloc_caching() -> None:
    """glibc: every allocation over 1 MiB from now on gets its own mapping, returned to the
    system when freed (M_MMAP_THRESHOLD, which also stops glibc raising that threshold as it
    frees, up to 32 MiB), so that the resident set follows the tensors a CPU step holds."""
    if GLIBC is not None:
        GLIBC.mallopt(-3, 2**20)  # -3: M_MMAP_THRESHOLD


def resident_kb(field: str) -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", status).group(1))


class PeakMemory:
    """The most one step holds above what it starts with, in bytes (see the module docstring)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def start(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
            return
        if GLIBC is not None:  # the free memory malloc kept: out of the resident set, so that
            GLIBC.malloc_trim(0)  # a step reusing it counts it again (pages fault back in)
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        self.before = resident_kb("VmRSS") * 1024

    def stop(self) -> int:
        if self.cuda:
            return torch.cuda.max_memory_allocated() - self.before
        return resident_kb("VmHWM") * 1024 - self.before


def on_device(batch: dict, device: str) -> dict:
    return {
        k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()
    }


def timed_step(model, optimizer, batches, device: str, memory: PeakMemory | None = None) -> dict:
    """One optimizer step on the loader's next batch, as a trainer takes it; with `memory`, the
    step's peak too."""
    start = time.perf_counter()
    batch = next(batches)
    while batch is None:  # a padded batch with no usable sample
        batch = next(batches)
    fetched, cpu = time.perf_counter(), time.process_time()
    if memory:
        memory.start()
    batch = on_device(batch, device)
    tokens = step_label_tokens([batch], device=device)
    loss = micro_batch_loss(model, model_inputs(batch, model), batch, tokens, world_size=1)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    end = time.perf_counter()
    return {
        "seconds": end - start,
        "wait": fetched - start,
        "cpu": time.process_time() - cpu,  # this process's CPU time computing (its threads')
        "real": int(real_token_mask(batch).sum()),
        "computed": batch["input_ids"].numel(),
        "trained": int(tokens),
        "patches": len(batch.get("pixel_values", ())),  # Qwen-VL: a row per patch
        "peak": memory.stop() if memory else None,
    }


def run_strategies(model, loaders: dict, settings: Settings) -> dict:
    """Each strategy's counted steps (interleaved or side by side), then its memory step."""
    # fused: Trainer's default optimizer (adamw_torch_fused, torch >= 2.8), on a CPU too
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    run = interleaved if settings.interleave else side_by_side
    steps = run(model, optimizer, loaders, settings)
    # The peak memory of one more step each (a later epoch's first batch), apart from the timed
    # ones: on a CPU its measure changes how malloc gives memory back (limit_malloc_caching)
    if not settings.device.startswith("cuda"):
        limit_malloc_caching()
    memory = PeakMemory(settings.device)
    peaks = {}
    for name, loader in loaders.items():
        batches = iter(loader(settings.rounds))
        peaks[name] = timed_step(model, optimizer, batches, settings.device, memory)["peak"]
        del batches
    return {name: {"steps": steps[name], "peak": peaks[name]} for name in loaders}


def interleaved(model, optimizer, loaders: dict, settings: Settings) -> dict:
    """One loader per strategy, all running in their workers; a step of each in turn (the order
    reversed every other step), so that each meets the machine's load alike. The first --warmup
    steps of each are left out."""
    batches = {name: iter(loader(0)) for name, loader in loaders.items()}
    steps = {name: [] for name in loaders}
    for step in range(settings.warmup + settings.steps):
        order = list(loaders) if step % 2 == 0 else list(loaders)[::-1]
        records = {n: timed_step(model, optimizer, batches[n], settings.device) for n in order}
        if step >= settings.warmup:
            for name, record in records.items():
                steps[name].append(record)
        print_progress(f"step {step + 1}/{settings.warmup + settings.steps}", records)
    return steps


def side_by_side(model, optimizer, loaders: dict, settings: Settings) -> dict:
    """--rounds rounds, the strategies side by side (the order reversed every other round), each
    alone with a fresh loader, as in training; the first --warmup steps of each are left out."""
    steps = {name: [] for name in loaders}
    for round_ in range(settings.rounds):
        order = list(loaders) if round_ % 2 == 0 else list(loaders)[::-1]
        for name in order:
            batches = iter(loaders[name](round_))
            records = [
                timed_step(model, optimizer, batches, settings.device)
                for _ in range(settings.warmup + settings.steps)
            ]
            del batches  # its workers stop
            steps[name] += records[settings.warmup :]
            print_progress(f"round {round_ + 1}/{settings.rounds}", {name: records})
    return steps


def print_progress(where: str, records: dict) -> None:
    """Each strategy's last steps: wall-clock and CPU seconds, and the tokens they computed."""
    parts = []
    for name, rs in records.items():
        for r in rs if isinstance(rs, list) else [rs]:
            parts.append(f"{name} {r['seconds']:.1f} s (CPU {r['cpu']:.1f}, {r['computed']:,} tok)")
    print(f"  {where}: " + ", ".join(parts), flush=True)


def summarize(steps: list[dict], peak: int) -> dict:
    """A strategy's figures over its counted steps, and the peak of its memory step (bytes; see
    the module docstring). Tokens per second are the steps' tokens over the steps' time, as the
    waste is their computed over their real tokens: were a step's time its computed tokens'
    alone, packed/naive would then be the waste ratio exactly (a median of per-step rates would
    not: naive padding's widest batches are both its slowest per real token and its most
    wasteful, and a median leaves out the one but not the other)."""
    total = lambda key: sum(s[key] for s in steps)  # noqa: E731
    real_per_s = total("real") / total("seconds")
    return {
        "steps": len(steps),
        "step_s": statistics.median(s["seconds"] for s in steps),
        "real_tok_s": real_per_s,
        "computed_tok_s": total("computed") / total("seconds"),
        "waste": total("computed") / total("real"),
        "ms_per_real_token": 1000 / real_per_s,
        "wait_share": total("wait") / total("seconds"),
        "peak_gb": peak / GB,
        "real_per_step": total("real") / len(steps),
        "cpu_ms_per_real_token": 1000 * total("cpu") / total("real"),
        "trained_share": total("trained") / total("real"),
        "patches_per_real_token": total("patches") / total("real"),
    }


def compare(summary: dict) -> dict:
    """packed/naive real tok/s, and the waste ratio of the same batches."""
    naive, packed = summary["naive"], summary[PACKER]
    return {
        "speed": packed["real_tok_s"] / naive["real_tok_s"],
        "waste": naive["waste"] / packed["waste"],
    }


def matmul_shares(counts: dict, summary: dict) -> dict:
    """Where the matrix products a packed step computes on its weights go (per real token: each
    part's parameters x the positions it runs on): the decoder layers on every computed token,
    the output layer on the trained positions only (the loss runs it there), the vision tower on
    every patch. Attention's own products (the scores) left out."""
    packed = summary[PACKER]
    work = {
        "decoder layers": counts["decoder layers"] * packed["waste"],
        "output layer": counts["output layer"] * packed["trained_share"],
        "vision tower": counts["vision tower"] * packed["patches_per_real_token"],
    }
    return {part: w / sum(work.values()) for part, w in work.items()}


# Printing and the figure ---------------------------------------------------------------------


def print_table(summary: dict) -> None:
    print("| strategy | step (s) | real tok/s | computed tok/s | waste | ms / real token "
          "| loader wait | peak (GB) |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, s in summary.items():
        print(
            f"| {name} | {s['step_s']:.3f} | {s['real_tok_s']:,.0f} | {s['computed_tok_s']:,.0f} "
            f"| {s['waste']:.2f}x | {s['ms_per_real_token']:.3f} | {s['wait_share']:.1%} "
            f"| {s['peak_gb']:.2f} |"
        )


def print_cpu_time(summary: dict) -> None:
    """A CPU's check against its load: this process's CPU time per real token (median over the
    steps), which other jobs on the machine stretch far less than the wall clock."""
    cpu = {name: s["cpu_ms_per_real_token"] for name, s in summary.items()}
    print(
        "CPU time per real token (ms): " + ", ".join(f"{n} {t:.2f}" for n, t in cpu.items())
        + f"; naive/packed {cpu['naive'] / cpu[PACKER]:.2f}x"
    )  # fmt: skip


def last_line(summary: dict) -> str:
    ratios, naive, packed = compare(summary), summary["naive"], summary[PACKER]
    return (
        f"train step: packed/naive real tok/s {ratios['speed']:.2f}x (waste "
        f"{ratios['waste']:.2f}x), peak memory packed {packed['peak_gb']:.1f} GB / naive "
        f"{naive['peak_gb']:.1f} GB, loader wait {packed['wait_share']:.1%}"
    )


def draw_figure(results: dict, title: str) -> Figure:
    """Time per real token, a bar per strategy (a group of bars per attention implementation),
    the loader's wait hatched at the foot of each bar."""
    fig = Figure(figsize=(8, 4.8))
    ax = fig.subplots()
    width = 0.8 / len(results)
    for i, (attention, summary) in enumerate(results.items()):
        xs = [j + (i - (len(results) - 1) / 2) * width for j in range(len(summary))]
        times = [s["ms_per_real_token"] for s in summary.values()]
        bars = ax.bar(xs, times, width, label=attention, color=f"C{i}")
        waits = [t * s["wait_share"] for t, s in zip(times, summary.values())]
        ax.bar(xs, waits, width, fill=False, hatch="//", edgecolor="black", linewidth=0)
        ax.bar_label(bars, [f"{t:.3g}" for t in times], padding=2)
    ax.bar(0, 0, fill=False, hatch="//", edgecolor="black", label="of which: loader wait")
    first = next(iter(results.values()))
    ax.set_xticks(range(len(first)), [f"{n}\n(waste {s['waste']:.2f}x)" for n, s in first.items()])
    ax.set_xlabel("strategy (padded batches, or packs of the same token budget)")
    ax.set_ylabel("ms per real token (lower is better)")
    ax.set_title(title)
    ax.margins(y=0.15)
    ax.legend(title="attention")
    fig.tight_layout()
    return fig


def print_settings(settings: Settings, counts: dict, device_name: str) -> None:
    shown = {k: v for k, v in dataclasses.asdict(settings).items() if k != "sizes"}
    print("settings: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    text, vision = settings.sizes["text"], settings.sizes["vision"]
    print(
        f"model: Qwen2_5_VLForConditionalGeneration, {settings.layers or text['num_hidden_layers']} "
        f"decoder layers of {text['hidden_size']:,} (MLP {text['intermediate_size']:,}), vision "
        f"width {vision['hidden_size']:,}; parameters: "
        + ", ".join(f"{k} {v / 1e6:,.1f} M" for k, v in counts.items())
    )
    print(f"device: {device_name}, {os.cpu_count()} CPU cores, torch threads "
          f"{torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}\n")  # fmt: skip


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else "CPU"


def save_figure(results: dict, best: str, settings: Settings) -> None:
    ratios = compare(results[best])
    layers = settings.layers or settings.sizes["text"]["num_hidden_layers"]
    title = (
        f"One training step of Qwen2.5-VL (decoder layers: {layers}, {settings.dtype}), "
        f"{device_name(settings.device)}\npacked/naive real tok/s {ratios['speed']:.2f}x "
        f"(waste {ratios['waste']:.2f}x)"
    )
    path = REPO / settings.figure  # an absolute --figure stays as it is
    path.parent.mkdir(parents=True, exist_ok=True)
    draw_figure(results, title).savefig(path, dpi=110, bbox_inches="tight")
    print(f"Saved the figure to {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")


def main(argv=None) -> dict:
    settings = settings_of(parse_args(argv))
    if not settings.attention:
        raise SystemExit(
            f"none of the attention implementations asked for runs on {settings.device}"
        )
    started = time.perf_counter()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    # Qwen2.5-VL's processor (built offline), the embedded rows, and the three loaders
    processor = offline_processor(FAMILY)
    samples = VQADataset(load_vqa_dataset(num_rows=settings.num_rows), processor)
    loaders = make_loaders(samples, settings)
    # Each attention implementation: a fresh model (the same initial weights), every strategy
    results, counts = {}, None
    for attention in settings.attention:
        model = build_model(settings, processor.tokenizer, attention)
        if counts is None:
            counts = parameter_counts(model)
            print_settings(settings, counts, device_name(settings.device))
        runs = run_strategies(model, loaders, settings)
        del model
        results[attention] = {name: summarize(**runs[name]) for name in STRATEGIES}
        how = (
            "interleaved:" if settings.interleave else f"side by side, {settings.rounds} rounds of"
        )
        print(f"{attention}, {how} {settings.steps} counted steps a strategy")
        print_table(results[attention])
        if not settings.device.startswith("cuda"):
            print_cpu_time(results[attention])
        print()
    # The decoder layers' share, the figure, and the number the bench is about
    best = max(results, key=lambda a: results[a][PACKER]["real_tok_s"])
    shares = matmul_shares(counts, results[best])
    print("a packed step's matrix products on the weights: " + ", ".join(
        f"{part} {share:.0%}" for part, share in shares.items()))  # fmt: skip
    print(f"took {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f}")
    if settings.figure:
        save_figure(results, best, settings)
    if len(results) > 1:
        print(f"fastest packed attention: {best}")
    print(last_line(results[best]))
    return {"results": results, "best": best, "counts": counts, "settings": settings}


if __name__ == "__main__":
    main()
