"""Stage 6's experiments (06_packing_pays_off.py, whose docstring tells its five parts): the
computing, apart from the script's printing. Every part takes the stage's settings
(ExperimentSettings, the script's flags) and what they all work from (StageData, load_data): the
rows, their weights, which fit, which are held out, and every strategy's batches of the same rows
(naive padding, constrained padding, packing).
"""

import contextlib
import copy
import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Literal

import datasets
import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from mmdp import config
from mmdp.config import setting
from mmdp.data.padding import ConstrainedPadCollator, NaivePadCollator
from mmdp.data.reading.settings import DataSettings
from mmdp.data.reading.sources import no_progress_bars
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import UserError
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.models.attention import flash_attention_on_cpu, use_attention
from mmdp.models.tiny_vlm import TinyVLM, TinyVLMConfig, vlm_inputs
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Weights
from mmdp.planning.planner import filter_rows, plan_epoch
from mmdp.report.epoch import nothing_to_do
from mmdp.training.loop import (
    median_time_per_part,
    speed_of_run,
    time_logits_per_position,
    train_in_turns,
)
from mmdp.training.loss import label_tokens, summed_loss, summed_sample_means
from mmdp.training.strategies import compare_strategies
from mmdp.weighing.weigh import weigh_rows


@dataclasses.dataclass(frozen=True)
class ExperimentSettings:
    """What the experiments read of stage 6's flags (06_packing_pays_off.py --help)."""

    data: DataSettings = DataSettings(num_rows=config.DEFAULT_NUM_ROWS)
    tokenizer: str | None = setting(
        None, "tokenizer name or path", shown="the SmolLM2 tokenizer shipped in the repo"
    )
    # the batches: padded (batch_size samples) or packed (stage 5's budgets and --strategy)
    packing: PackingConfig = setting(
        PackingConfig(), flags=("max_length", "max_images", "strategy")
    )
    batch_size: int = setting(
        config.BATCH_SIZE,
        "samples per padded batch; packed batches hold packs of about as many samples",
        min=1,
    )
    seed: int = setting(0, "random seed: the held-out rows, and the first training run", min=0)
    # 1. Same loss
    attn_implementation: Literal["eager", "sdpa", "flex_attention", "flash_attention_2"] = setting(
        "sdpa",
        "attention of the loss check; on a CPU, flash_attention_2 runs transformers' routing "
        "with reference kernels",
    )
    check_samples: int = setting(32, "samples in the loss check", min=1)
    # 2-3. Same learning, and speed
    seeds: int = setting(3, "training runs per strategy: seeds --seed, --seed + 1, ...", min=1)
    train_samples: int = setting(96, "samples each run trains on", min=1)
    orders: int = setting(
        1,
        "orders of each seed's samples to train on; more show how much the order alone moves "
        "the held-out loss",
        min=1,
    )
    eval_every: int = setting(
        32, "evaluate on the held-out samples every this many samples seen", min=1
    )
    eval_samples: int = setting(32, "held-out samples, never trained on", min=1)
    lr: float = setting(2e-3, "AdamW learning rate", above=0)
    # 4. DDP
    skip_ddp: bool = setting(False, "skip part 4 (a torchrun run of two processes)")


# What every part works from ---------------------------------------------------------------------


@dataclasses.dataclass
class StageData:
    """What every part works from: the rows, their weights, and which rows each part uses."""

    tokenizer: PreTrainedTokenizerBase
    rows: datasets.Dataset  # the --num-rows rows read, in the_cauldron's schema
    samples: VQADataset  # the same rows as tokenized samples with their images
    weights: Weights  # tokens, images and drop reason of every row, weighed once
    fits: list[int]  # the rows that are usable and fit a pack, in dataset order
    held_out: list[int]  # evaluated on, never trained on
    pool: list[int]  # what every training run draws its samples from
    num_packs: int  # packs in stage 5's epoch of every row
    vlm_config: TinyVLMConfig
    packs_per_batch: int  # packs per packed batch: about --batch-size samples
    device: str  # where the model trains: "cpu" or the GPU's name


def load_data(settings: ExperimentSettings) -> StageData:
    tokenizer = get_tokenizer(settings.tokenizer)
    rows = settings.data.load()
    weights = weigh_rows(rows, tokenizer).weights
    # the usable rows within --max-length and --max-images, in dataset order (the planner's own
    # filter, step 1)
    fits, dropped = filter_rows(weights, settings.packing.budgets)
    if not len(fits):
        hint = f"raise --max-length ({settings.packing.max_length} tokens a pack)"
        raise nothing_to_do(len(weights), dropped, hint)
    fits = fits.tolist()
    held_out, pool = hold_out(fits, weights.reasons, settings)
    # stage 5's plan of one epoch of every row, on one rank (where no pack is left out)
    whole_epoch = dataclasses.replace(settings.packing, packs_per_batch=1, seed=settings.seed)
    num_packs = len(plan_epoch(weights, whole_epoch).pack_starts) - 1
    return StageData(
        tokenizer=tokenizer,
        rows=rows,
        samples=VQADataset(rows, tokenizer),
        weights=weights,
        fits=fits,
        held_out=held_out,
        pool=pool,
        num_packs=num_packs,
        vlm_config=TinyVLMConfig(
            vocab_size=len(tokenizer), image_token_id=tokenizer.image_token_id
        ),
        # Each packed batch holds about --batch-size samples, as a padded batch does, so that
        # the learning rate means the same: packs per batch from the epoch's samples per pack.
        packs_per_batch=max(1, round(settings.batch_size * num_packs / len(fits))),
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    )


def hold_out(fits: list[int], reasons, settings: ExperimentSettings) -> tuple[list[int], list[int]]:
    """Held out: the first --eval-samples rows of a shuffle (seeded by --seed) that fit a pack.
    The pool, every other usable row in the shuffle's order (over a budget or not: constrained
    padding drops those, naive padding keeps them), is what every run of every seed trains on;
    a row no strategy can use (`reasons`, a Weights': a video for TinyVLM...) is not in it.
    """
    order = torch.randperm(
        len(reasons), generator=torch.Generator().manual_seed(settings.seed)
    ).tolist()
    fitting = set(fits)
    held_out = [i for i in order if i in fitting][: settings.eval_samples]
    held = set(held_out)
    pool = [i for i in order if i not in held and not reasons[i]]
    if len(pool) < settings.train_samples:
        raise UserError(
            f"--train-samples {settings.train_samples}: only {len(pool):,} rows are left after "
            f"holding out {len(held_out)}; lower it or raise --num-rows"
        )
    return held_out, pool


def packed_batches(
    data: StageData, rows: list[int], settings: ExperimentSettings, *, seed: int, epoch=0
) -> list[dict]:
    """Stage 5's batches of `rows`: all of one epoch, packed with --strategy (the only place
    stage 6 builds a PackedDataset).

    PackedDataset weighs the selected rows again, as a dataset of their own: a few rows, weighed
    in a moment, so without datasets' progress bars, which would only clutter the output.
    """
    with no_progress_bars():
        dataset = PackedDataset(
            VQADataset(data.rows.select(rows), data.tokenizer),
            config=dataclasses.replace(
                settings.packing, packs_per_batch=data.packs_per_batch, seed=seed
            ),
        )
    dataset.set_epoch(epoch)
    return list(PackedDataLoader(dataset, num_workers=0))


def strategy_batches(
    data: StageData, names, rows: list[int], settings: ExperimentSettings, seed: int, epoch=0
) -> dict:
    """The same rows as naive padding, constrained padding and packing batch them (padded as
    stages 2 and 3 do: consecutive rows, --batch-size at a time)."""
    pad_id = data.tokenizer.pad_token_id
    pads = (NaivePadCollator(pad_id), ConstrainedPadCollator(pad_id, settings.packing.max_length))
    size = settings.batch_size
    groups = [rows[i : i + size] for i in range(0, len(rows), size)]
    batches = {
        name: [collate([data.samples[r] for r in group]) for group in groups]
        for name, collate in zip(names[:2], pads)
    }
    return {**batches, names[2]: packed_batches(data, rows, settings, seed=seed, epoch=epoch)}


# 1. Same loss ----------------------------------------------------------------------------------


@contextlib.contextmanager
def attention(implementation: str):
    """Run transformers' code for `implementation` on this machine: FlashAttention's routing with
    mmdp's reference kernels on a CPU (correctness only), flex_attention compiled per shape."""
    import torch._dynamo

    if implementation == "flash_attention_2" and not torch.cuda.is_available():
        with flash_attention_on_cpu(implementation):
            yield
        return
    saved = torch._dynamo.config.automatic_dynamic_shapes
    # torch 2.15's CPU code for flex_attention with dynamic shapes does not compile
    torch._dynamo.config.automatic_dynamic_shapes = torch.cuda.is_available()
    try:
        yield
    finally:
        torch._dynamo.config.automatic_dynamic_shapes = saved


def check_same_loss(data: StageData, names, settings: ExperimentSettings) -> dict:
    """The loss of the same samples through each strategy's batches, and a wrong image mapping.

    The model starts with large weights (initializer_range 0.5): one initialised near zero
    barely looks at its inputs, and a mistake (masks, images) could hide.
    """
    rows = data.fits[: settings.check_samples]
    batches = strategy_batches(data, names, rows, settings, seed=settings.seed)
    vlm_config = dataclasses.replace(data.vlm_config, initializer_range=0.5)
    model = use_attention(TinyVLM(vlm_config).eval(), settings.attn_implementation)
    with attention(settings.attn_implementation), torch.no_grad():
        losses = {name: losses_of(model, batches[name]) for name in names}
        # The same packed batches with each batch's images shifted by one: every image now
        # lands on another sample's image tokens.
        wrong = 0.0
        for batch in batches[names[2]]:
            shifted = {**vlm_inputs(batch), "pixel_values": batch["pixel_values"].roll(1, dims=0)}
            wrong += float(summed_loss(model(**shifted).logits, batch["labels"]))
    summed, over_tokens, over_samples = ({n: losses[n][i] for n in names} for i in range(3))
    reference = summed[names[0]]
    return {
        **summed,
        "max_rel_diff": max_rel_diff(summed),
        "wrong_image_mapping_rel_diff": abs(wrong - reference) / reference,
        "mean_over_tokens": {**over_tokens, "max_rel_diff": max_rel_diff(over_tokens)},
        "mean_over_samples": {**over_samples, "max_rel_diff": max_rel_diff(over_samples)},
        "samples": len(rows),
        "attn_implementation": settings.attn_implementation,
    }


def losses_of(model: TinyVLM, batches: list[dict]) -> tuple[float, float, float]:
    """(The summed loss of the batches, its mean over label tokens, its mean over samples): each
    mean over all the batches at once (add up its parts over the batches, then divide)."""
    summed = sample_sum = 0.0
    tokens = samples = 0
    for batch in batches:
        logits = model(**{**vlm_inputs(batch), "labels": None}).logits
        summed += float(summed_loss(logits, batch["labels"]))
        tokens += label_tokens(batch["labels"])
        batch_sum, batch_samples = summed_sample_means(logits, batch)
        sample_sum += float(batch_sum)
        samples += batch_samples
    return summed, summed / tokens, sample_sum / samples


def max_rel_diff(values: dict) -> float:
    reference = next(iter(values.values()))
    return max(abs(v - reference) / abs(reference) for v in values.values())


# 2. Same learning, over seeds, on held-out samples ---------------------------------------------


def train_over_seeds(
    data: StageData,
    names,
    settings: ExperimentSettings,
    after_run: Callable[[int, int, dict, float], None] | None = None,
) -> dict:
    """For each seed: initial weights and a draw of training rows from the seed; every strategy
    trains from those weights on those rows and is evaluated on the same held-out batches.

    With --orders N, each seed's rows are also trained on in N - 1 other orders (for packing,
    another epoch's shuffle), the initial weights unchanged: how much the order alone moves it.
    `after_run(seed, order, logs, seconds)` is called after each run (the script prints it).
    """
    held_out = packed_batches(data, data.held_out, settings, seed=settings.seed)
    seeds = list(range(settings.seed, settings.seed + settings.seeds))
    runs = {
        "seeds": seeds,
        "runs": [],
        "logs": {name: [] for name in names},
        "load_average": [os.getloadavg()[0]],
    }
    for seed in seeds:
        draw = torch.randperm(len(data.pool), generator=torch.Generator().manual_seed(seed))
        rows = [data.pool[i] for i in draw[: settings.train_samples].tolist()]
        torch.manual_seed(seed)
        initial = TinyVLM(data.vlm_config).state_dict()
        for order in range(settings.orders):
            started = time.perf_counter()
            logs = train_one_run(data, names, settings, rows, initial, seed, order, held_out)
            for name in names:
                runs["logs"][name].append(logs[name])
            runs["runs"].append({"seed": seed, "order": order})
            if after_run is not None:
                after_run(seed, order, logs, time.perf_counter() - started)
    runs["load_average"].append(os.getloadavg()[0])
    return runs


def train_one_run(
    data: StageData, names, settings: ExperimentSettings, rows, initial, seed, order, held_out
) -> dict:
    """Every strategy from the `initial` weights on the same rows, one step of each in turn
    (mmdp.training.loop.train_in_turns: {name: training log}); order 0 takes the rows as drawn,
    another a seeded shuffle of them."""
    if order:
        rows = [rows[i] for i in np.random.default_rng([seed, order]).permutation(len(rows))]
    batches = strategy_batches(data, names, rows, settings, seed=seed, epoch=order)
    empty = [name for name in names if not batches[name]]
    if empty:
        raise UserError(
            f"nothing to do: none of seed {seed}'s {len(rows)} training samples fits "
            f"{' or '.join(empty)}'s batches; raise --train-samples or --max-length"
        )
    train_device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    models = {}
    for name in names:
        models[name] = TinyVLM(data.vlm_config).to(train_device)
        models[name].load_state_dict(copy.deepcopy(initial))
    return train_in_turns(
        {name: (models[name], batches[name]) for name in names},
        lr=settings.lr,
        checkpoints=checkpoints(settings),
        evaluate_on=held_out,
    )


def checkpoints(settings: ExperimentSettings) -> list[int]:
    """Samples seen at each evaluation: 0, every --eval-every, and the end of training."""
    return sorted({*range(0, settings.train_samples, settings.eval_every), settings.train_samples})


def summarize_learning(runs, names, settings: ExperimentSettings) -> dict:
    """The runs' logs per strategy, one entry per run: what the JSON and the figure show."""
    logs = runs["logs"]
    return {
        "seeds": runs["seeds"],
        "orders": settings.orders,
        "runs": runs["runs"],  # one per seed (and order): the rows of every per-run list below
        "samples_seen": checkpoints(settings),
        "eval_samples": settings.eval_samples,
        "eval_loss": {n: [log["eval_loss"] for log in logs[n]] for n in names},
        # a packed step may pass a checkpoint by a few samples: where each evaluation really was
        "eval_samples_seen": {n: [log["eval_samples_seen"] for log in logs[n]] for n in names},
        "eval_steps": {n: [log["eval_steps"] for log in logs[n]] for n in names},
        "train_loss": {
            n: [{"samples_seen": log["samples_seen"], "loss": log["loss"]} for log in logs[n]]
            for n in names
        },
        "steps": {n: [len(log["loss"]) for log in logs[n]] for n in names},
        "label_tokens_per_step": {n: [log["label_tokens"] for log in logs[n]] for n in names},
    }


# 3. Real tokens per second, and where the time goes ---------------------------------------------


def summarize_speed(runs, names, data: StageData, settings: ExperimentSettings) -> dict:
    """Per strategy: each run's speed (speed_of_run), the median over runs, and what one epoch of
    every row would take; the gain of packing over naive padding (ratio_of_medians)."""
    naive, constrained, packed = names
    per_seed = {n: [speed_of_run(log) for log in runs["logs"][n]] for n in names}
    steps_per_epoch = {naive: math.ceil(len(data.samples) / settings.batch_size)}
    steps_per_epoch[constrained] = steps_per_epoch[naive]
    steps_per_epoch[packed] = math.ceil(data.num_packs / data.packs_per_batch)
    rate = {n: [s["real_tokens_per_s"] for s in per_seed[n]] for n in names}
    naive_tokens = {k: [s[k] for s in per_seed[naive]] for k in ("computed_tokens", "real_tokens")}
    # The logits of a padded batch: per position, do they cost more in a large tensor?
    model = TinyVLM(data.vlm_config)
    shapes = [
        (data.packs_per_batch, settings.packing.max_length),
        (settings.batch_size, settings.packing.max_length),
    ]
    return {
        "per_strategy": {n: strategy_speed(per_seed[n], steps_per_epoch[n]) for n in names},
        "gain": {
            # packing's real tokens per second over naive padding's
            "real_tokens_per_s": ratio_of_medians(rate[packed], rate[naive]),
            # the tokens naive padding computes over the real tokens among them
            "waste": ratio_of_medians(naive_tokens["computed_tokens"], naive_tokens["real_tokens"]),
        },
        "logits_us_per_position": time_logits_per_position(model, shapes),
        # the 1-minute load average of the machine before and after training (os.getloadavg)
        "load_average": {
            "cores": os.cpu_count(),
            "before": runs["load_average"][0],
            "after": runs["load_average"][-1],
        },
        "time_per_part": {n: median_time_per_part(runs["logs"][n]) for n in names},
        "computed_tokens": {
            n: statistics.median(s["computed_tokens"] for s in per_seed[n]) for n in names
        },
    }


def strategy_speed(per_seed: list[dict], steps_per_epoch: int) -> dict:
    """A strategy's runs (speed_of_run each): the median over them, and each run's values."""
    median = {k: statistics.median(s[k] for s in per_seed) for k in per_seed[0]}
    shown = ("real_tokens", "computed_tokens", "seconds", "real_tokens_per_s", "steps")
    return {
        **{k: median[k] for k in shown},
        "steps_per_epoch": steps_per_epoch,
        "seconds_per_epoch": round(steps_per_epoch * median["seconds_per_step"], 1),
        "per_seed": {k: [s[k] for s in per_seed] for k in per_seed[0]},
    }


def ratio_of_medians(numerator: list[float], denominator: list[float]) -> dict:
    """The ratio of two medians over the seeds, and the ratio seed by seed (the spread). Every
    ratio of two strategies (or two counts) is one of these: of the medians the printed tables
    show, so a reader can recompute it.

    >>> ratio_of_medians([4.0, 2.0, 9.0], [2.0, 2.0, 3.0])
    {'ratio_of_medians': 2.0, 'per_seed': [2.0, 1.0, 3.0]}
    """
    median = statistics.median(numerator) / statistics.median(denominator)
    per_seed = [p / q for p, q in zip(numerator, denominator)]
    return {"ratio_of_medians": round(median, 3), "per_seed": [round(r, 3) for r in per_seed]}


# 5. Every strategy on one epoch, from the weights -----------------------------------------------


def compare_every_strategy(data: StageData, settings: ExperimentSettings) -> dict:
    """compare_strategies on the rows weighed once, in load_data; the figure reads "per_row"."""
    return compare_strategies(
        data.weights,
        max_length=settings.packing.max_length,
        max_images=settings.packing.max_images,
        batch_size=settings.batch_size,
        packs_per_batch=settings.batch_size,  # as many packs a batch as padding batches samples
        seed=settings.seed,
    )
