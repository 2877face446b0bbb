"""Stage 6 (beyond the blog): does packing pay off? The same loss, the same learning on held-out
samples over several seeds, more real tokens per second, and the same gradient under DDP,
measured on a tiny vision-language model (mmdp.models.tiny_vlm.TinyVLM).

    uv run 06_packing_pays_off.py                     # 2 min 40 s on 2 CPU cores, little load
    uv run 06_packing_pays_off.py --orders 3 --skip-ddp --metrics-json /tmp/06.json
    uv run 06_packing_pays_off.py --attn-implementation flash_attention_2 --skip-ddp

1. Same loss: the loss of the same samples, images included, is the same whether they come
   naively padded, constrained-padded or packed (restarting position_ids): summed, as a mean
   over label tokens and as a mean over samples, under --attn-implementation. A wrong
   image-to-sample mapping is shown to break it.
2. Same learning? For each seed, from the same initial weights, every strategy trains on the
   same samples (one step of each in turn); every --eval-every samples, the loss on the same
   held-out samples, never trained on. --orders N retrains each seed's samples in N - 1 other
   orders: how much the order alone moves the result. assets/06.png: held-out loss against
   samples seen (mean over runs, min-max band) and against optimizer steps; training loss.
3. Real tokens per second over the seeds (median and range), and where the time goes.
4. Same gradient under DDP: one step of two ranks (torchrun, gloo) against one process.
5. Every strategy on one epoch (from lengths): assets/strategies.png.
The packed run is --strategy (default images_first_bfd) and is called by that name everywhere:
printouts, figure, JSON.
"""

import argparse
import contextlib
import copy
import dataclasses
import math
import os
import statistics
import time

import datasets
import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from mmdp import config
from mmdp.cli import (
    add_data_args,
    description,
    display_path,
    non_negative_int,
    positive_float,
    positive_int,
    print_settings,
    print_table,
)
from mmdp.data.padding import ConstrainedPadCollator, NaivePadCollator
from mmdp.data.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import UserError, exit_on_user_error
from mmdp.models.attention import flash_attention_on_cpu, use_attention
from mmdp.models.tiny_vlm import TinyVLM, TinyVLMConfig, vlm_inputs
from mmdp.packing.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.packers import STRATEGIES as PACKING_STRATEGIES
from mmdp.packing.planner import EpochPlan, Weights, plan_epoch
from mmdp.packing.weighing import weigh_rows
from mmdp.report.metrics import write_json
from mmdp.report.plots import plot_learning_curves, plot_strategies, save_figure
from mmdp.training.ddp import run_torchrun
from mmdp.training.loop import (
    PARTS,
    median_time_per_part,
    speed_of_run,
    time_logits_per_position,
    train_in_turns,
)
from mmdp.training.loss import label_tokens, summed_loss, summed_sample_means
from mmdp.training.strategies import compare_strategies

ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2")


def parse_args():
    parser = argparse.ArgumentParser(description=description(__doc__))
    add_data_args(parser)
    parser.add_argument("--tokenizer", default=None, help="default: the shipped SmolLM2 tokenizer")
    add_batching_args(parser)
    # 1. Same loss
    parser.add_argument(
        "--attn-implementation",
        choices=ATTENTION_IMPLEMENTATIONS,
        default="sdpa",
        help="attention of the loss check (default: sdpa); "
        "on a CPU, flash_attention_2 runs transformers' routing with reference "
        "kernels",
    )
    parser.add_argument(
        "--check-samples",
        type=positive_int,
        default=32,
        help="samples in the loss check (default: 32)",
    )
    # 2-3. Same learning, and speed
    add_training_args(parser)
    # 4. DDP
    parser.add_argument(
        "--skip-ddp", action="store_true", help="skip part 4 (a torchrun run of two processes)"
    )
    parser.add_argument("--metrics-json", default=None, help="write the results as JSON here")
    return parser.parse_args()


def add_batching_args(parser: argparse.ArgumentParser) -> None:
    """The packer, and the budgets that padding and packing share."""
    parser.add_argument(
        "--strategy",
        choices=PACKING_STRATEGIES,
        default="images_first_bfd",
        help="the packer to train with (default: images_first_bfd)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=config.BATCH_SIZE,
        help="samples per padded batch; packed batches hold packs of about as "
        f"many samples (default: {config.BATCH_SIZE})",
    )
    parser.add_argument(
        "--max-length",
        type=positive_int,
        default=config.MAX_LENGTH,
        help="token budget of a pack, and constrained padding's length "
        f"(default: {config.MAX_LENGTH})",
    )
    parser.add_argument(
        "--max-images",
        type=non_negative_int,
        default=config.MAX_IMAGES,
        help=f"image budget of a pack (default: {config.MAX_IMAGES})",
    )


def add_training_args(parser: argparse.ArgumentParser) -> None:
    """How many runs, on how many samples, evaluated how often."""
    parser.add_argument(
        "--seeds",
        type=positive_int,
        default=3,
        help="training runs per strategy: seeds --seed, --seed + 1, ... (default: 3)",
    )
    parser.add_argument(
        "--train-samples",
        type=positive_int,
        default=96,
        help="samples each run trains on (default: 96)",
    )
    parser.add_argument(
        "--orders",
        type=positive_int,
        default=1,
        help="orders of each seed's samples to train on (default: 1); more "
        "show how much the order alone moves the held-out loss",
    )
    parser.add_argument(
        "--eval-every",
        type=positive_int,
        default=32,
        help="evaluate on the held-out samples every this many samples seen (default: 32)",
    )
    parser.add_argument(
        "--eval-samples",
        type=positive_int,
        default=32,
        help="held-out samples, never trained on (default: 32)",
    )
    parser.add_argument(
        "--lr", type=positive_float, default=2e-3, help="AdamW learning rate (default: 0.002)"
    )


def main():
    started = time.perf_counter()
    args = parse_args()
    print_settings(args)
    torch.manual_seed(args.seed)
    data = load_data(args)
    names = ("naive", "constrained", args.strategy)
    seconds = {}

    with timed(seconds, "1. same loss"):
        check = check_same_loss(data, names, args)
        print_check(check, names, args)
    with timed(seconds, "2-3. training"):
        runs = train_over_seeds(data, names, args)
        learning = summarize_learning(runs, names, args)
        print_learning(learning, runs, names, args)
        save_learning_curves(learning, runs, names, args)
        speed = summarize_speed(runs, names, data, args)
        print_speed(speed, names, args)
        print_where_the_time_goes(speed, names)
    with timed(seconds, "4. DDP"):
        ddp = check_ddp_gradient(args)
        print_ddp(ddp)
    with timed(seconds, "5. every strategy"):
        strategies = compare_every_strategy(data, args)

    total = time.perf_counter() - started
    parts = ", ".join(f"{part} {s:.0f} s" for part, s in seconds.items())
    print(f"Stage 6 took {total // 60:.0f} min {total % 60:.0f} s ({parts}).")
    if args.metrics_json:
        metrics = {
            "loss": check,
            "learning": learning,
            "speed": speed["per_strategy"],
            "speed_gain": speed["gain"],
            "time_per_part": speed["time_per_part"],
            "logits_us_per_position": speed["logits_us_per_position"],
            "load_average": speed["load_average"],
            "ddp": ddp,
            "strategies": strategies,
            "device": data.device,
            "seconds": {**{k: round(v, 1) for k, v in seconds.items()}, "total": round(total, 1)},
        }
        print(f"Wrote the results to {display_path(write_json(metrics, args.metrics_json))}")


@contextlib.contextmanager
def timed(seconds: dict, part: str):
    start = time.perf_counter()
    yield
    seconds[part] = time.perf_counter() - start


# The data: the samples, which fit a pack, which are held out ---------------------------------


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


def load_data(args) -> StageData:
    tokenizer = get_tokenizer(args.tokenizer)
    rows = load_vqa_dataset(args.dataset, args.subset, args.split, args.num_rows)
    weights = weigh_rows(rows, tokenizer).weights
    fits = rows_that_fit(weights, args)
    held_out, pool = hold_out(fits, len(rows), args)
    num_packs = len(plan_whole_epoch(weights, args).pack_starts) - 1
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
        packs_per_batch=max(1, round(args.batch_size * num_packs / len(fits))),
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    )


def rows_that_fit(weights: Weights, args) -> list[int]:
    """The usable rows within --max-length and --max-images, in dataset order."""
    fits = np.flatnonzero(
        (weights.reasons == 0)
        & (weights.lengths <= args.max_length)
        & (weights.image_counts <= args.max_images)
    ).tolist()
    if not fits:
        raise UserError(
            f"nothing to do: none of the {len(weights):,} rows fits in a pack of max_length "
            f"{args.max_length} and max_images {args.max_images}; raise --max-length"
        )
    return fits


def hold_out(fits: list[int], num_rows: int, args) -> tuple[list[int], list[int]]:
    """Held out: the first --eval-samples rows of a shuffle (seeded by --seed) that fit a pack.
    The pool, every other row in the shuffle's order, is what every run of every seed trains on.
    """
    order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(args.seed)).tolist()
    fitting = set(fits)
    held_out = [i for i in order if i in fitting][: args.eval_samples]
    held = set(held_out)
    pool = [i for i in order if i not in held]
    if len(pool) < args.train_samples:
        raise UserError(
            f"--train-samples {args.train_samples}: only {len(pool):,} rows are left after "
            f"holding out {len(held_out)}; lower it or raise --num-rows"
        )
    return held_out, pool


# Stage 5's loader: the only place this script builds a PackedDataset.


def plan_whole_epoch(weights: Weights, args) -> EpochPlan:
    """Stage 5's plan of one epoch of every row, packed with --strategy, on one rank."""
    return plan_epoch(
        weights,
        max_length=args.max_length,
        max_images=args.max_images,
        packs_per_batch=args.batch_size,
        strategy=args.strategy,
        seed=args.seed,
    )


def packed_batches(data: StageData, rows: list[int], args, *, seed: int, epoch=0) -> list[dict]:
    """Stage 5's batches of `rows`: all of one epoch, packed with --strategy.

    PackedDataset weighs the selected rows again, as a dataset of their own: a few rows, weighed
    in a moment, so without datasets' progress bars, which would only clutter the output.
    """
    with no_progress_bars():
        dataset = PackedDataset(
            VQADataset(data.rows.select(rows), data.tokenizer),
            max_length=args.max_length,
            max_images=args.max_images,
            packs_per_batch=data.packs_per_batch,
            strategy=args.strategy,
            seed=seed,
        )
    dataset.set_epoch(epoch)
    return list(PackedDataLoader(dataset, num_workers=0))


@contextlib.contextmanager
def no_progress_bars():
    """datasets' progress bars off for a while, then as they were."""
    were_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if were_on:
            datasets.enable_progress_bars()


def padded_batches(samples, rows: list[int], collate, batch_size: int) -> list[dict]:
    """Stages 2 and 3: consecutive rows, batch_size at a time, padded by `collate`."""
    return [
        collate([samples[r] for r in rows[i : i + batch_size]])
        for i in range(0, len(rows), batch_size)
    ]


def strategy_batches(data: StageData, names, rows: list[int], args, seed: int, epoch=0) -> dict:
    """The same rows as naive padding, constrained padding and packing batch them."""
    naive, constrained, packed = names
    pad_id = data.tokenizer.pad_token_id
    return {
        naive: padded_batches(data.samples, rows, NaivePadCollator(pad_id), args.batch_size),
        constrained: padded_batches(
            data.samples, rows, ConstrainedPadCollator(pad_id, args.max_length), args.batch_size
        ),
        packed: packed_batches(data, rows, args, seed=seed, epoch=epoch),
    }


# 1. Same loss ------------------------------------------------------------------------------


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


def check_same_loss(data: StageData, names, args) -> dict:
    """The loss of the same samples through each strategy's batches, and a wrong image mapping.

    The model starts with large weights (initializer_range 0.5): one initialised near zero
    barely looks at its inputs, and a mistake (masks, images) could hide.
    """
    rows = data.fits[: args.check_samples]
    batches = strategy_batches(data, names, rows, args, seed=args.seed)
    vlm_config = dataclasses.replace(data.vlm_config, initializer_range=0.5)
    model = use_attention(TinyVLM(vlm_config).eval(), args.attn_implementation)
    with attention(args.attn_implementation), torch.no_grad():
        losses = {name: losses_of(model, batches[name]) for name in names}
        # The same packed batches with each batch's images shifted by one: every image now
        # lands on another sample's image tokens.
        wrong = 0.0
        for batch in batches[names[2]]:
            shifted = {**vlm_inputs(batch), "pixel_values": batch["pixel_values"].roll(1, dims=0)}
            wrong += float(summed_loss(model(**shifted).logits, batch["labels"]))
    summed, over_tokens, over_samples = (
        {name: losses[name][reduction] for name in names}
        for reduction in ("summed", "mean_over_tokens", "mean_over_samples")
    )
    reference = summed[names[0]]
    return {
        **summed,
        "max_rel_diff": max_rel_diff(summed),
        "wrong_image_mapping_rel_diff": abs(wrong - reference) / reference,
        "mean_over_tokens": {**over_tokens, "max_rel_diff": max_rel_diff(over_tokens)},
        "mean_over_samples": {**over_samples, "max_rel_diff": max_rel_diff(over_samples)},
        "samples": len(rows),
        "attn_implementation": args.attn_implementation,
    }


def losses_of(model: TinyVLM, batches: list[dict]) -> dict:
    """The summed loss of the batches, and its mean over label tokens and over samples: each
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
    return {
        "summed": summed,
        "mean_over_tokens": summed / tokens,
        "mean_over_samples": sample_sum / samples,
    }


def max_rel_diff(values: dict) -> float:
    reference = next(iter(values.values()))
    return max(abs(v - reference) / abs(reference) for v in values.values())


def print_check(check, names, args) -> None:
    where = "GPU" if torch.cuda.is_available() else "CPU"
    note = ""
    if args.attn_implementation == "flash_attention_2" and not torch.cuda.is_available():
        note = (
            "; no GPU: transformers' FlashAttention routing with mmdp's reference kernels, "
            "correctness only, not speed"
        )
    print(
        f"1. Loss of the same {check['samples']} samples (float32, {where}, "
        f"attention {args.attn_implementation}{note}):"
    )
    reductions = (check, check["mean_over_tokens"], check["mean_over_samples"])
    print_table(
        ["strategy", "summed", "mean/token", "mean/sample"],
        [[name, *(reduction[name] for reduction in reductions)] for name in names],
        ["", ",.4f", ".6f", ".6f"],
    )
    worst = max(reduction["max_rel_diff"] for reduction in reductions)
    ok = "OK" if worst < 1e-4 else "MISMATCH"
    print(f"   max relative difference: {worst:.1e} ({ok}: < 1e-4)")
    wrong = check["wrong_image_mapping_rel_diff"]
    verdict = "fails the check, as it must" if wrong >= 1e-4 else "NOT caught by the check"
    print(f"   the same packs with each image on the wrong sample: {wrong:.1e} ({verdict})")


# 2. Same learning, over seeds, on held-out samples ----------------------------------------------


def train_over_seeds(data: StageData, names, args) -> dict:
    """For each seed: initial weights and a draw of training rows from the seed; every strategy
    trains from those weights on those rows and is evaluated on the same held-out batches.

    With --orders N, each seed's rows are also trained on in N - 1 other orders (for packing,
    another epoch's shuffle), the initial weights unchanged: how much the order alone moves it.
    """
    held_out = packed_batches(data, data.held_out, args, seed=args.seed)
    seeds = list(range(args.seed, args.seed + args.seeds))
    print(
        f"2. Training every strategy on {args.train_samples} samples, {seeds_and_orders(args)} "
        f"(attention sdpa); held-out loss every {args.eval_every} samples:"
    )
    runs = {
        "seeds": seeds,
        "runs": [],
        "checkpoints": checkpoints(args),
        "logs": {name: [] for name in names},
        "load_average": [os.getloadavg()[0]],
    }
    for seed in seeds:
        draw = torch.randperm(len(data.pool), generator=torch.Generator().manual_seed(seed))
        rows = [data.pool[i] for i in draw[: args.train_samples].tolist()]
        torch.manual_seed(seed)
        initial = TinyVLM(data.vlm_config).state_dict()
        for order in range(args.orders):
            started = time.perf_counter()
            logs = train_one_run(data, names, args, rows, initial, seed, order, held_out)
            for name in names:
                runs["logs"][name].append(logs[name])
            runs["runs"].append({"seed": seed, "order": order})
            finals = ", ".join(f"{n} {logs[n]['eval_loss'][-1]:.3f}" for n in names)
            print(
                f"   seed {seed}"
                + (f", order {order}" if args.orders > 1 else "")
                + f": final held-out loss {finals} ({time.perf_counter() - started:.0f} s)"
            )
    runs["load_average"].append(os.getloadavg()[0])
    return runs


def train_one_run(data: StageData, names, args, rows, initial, seed, order, held_out) -> dict:
    """Every strategy from the `initial` weights on the same rows, one step of each in turn (all
    three meet the same load on a shared machine); order 0 takes the rows as drawn, another a
    seeded shuffle of them. Returns {name: training log} (mmdp.training.loop.train)."""
    if order:
        rows = [rows[i] for i in np.random.default_rng([seed, order]).permutation(len(rows))]
    batches = strategy_batches(data, names, rows, args, seed=seed, epoch=order)
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
        lr=args.lr,
        checkpoints=checkpoints(args),
        evaluate_on=held_out,
    )


def checkpoints(args) -> list[int]:
    """Samples seen at each evaluation: 0, every --eval-every, and the end of training."""
    return sorted({*range(0, args.train_samples, args.eval_every), args.train_samples})


def seeds_and_orders(args) -> str:
    seeds = f"{args.seeds} seed{'s' * (args.seeds != 1)}"
    return seeds + (f" x {args.orders} orders" if args.orders > 1 else "")


def summarize_learning(runs, names, args) -> dict:
    logs = runs["logs"]
    return {
        "seeds": runs["seeds"],
        "orders": args.orders,
        "runs": runs["runs"],  # one per seed (and order): the rows of every per-run list below
        "samples_seen": runs["checkpoints"],
        "eval_samples": args.eval_samples,
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


def print_learning(learning, runs, names, args) -> None:
    naive, _, packed = names
    final = {n: [losses[-1] for losses in learning["eval_loss"][n]] for n in names}
    seen = {n: [log["samples_seen"][-1] for log in runs["logs"][n]] for n in names}
    over = seeds_and_orders(args)
    print(
        f"   final held-out loss (mean over the label tokens of {args.eval_samples} held-out "
        f"samples) over {over}, and what the runs trained on:"
    )
    rows = []
    for n in names:
        tokens = [t for per_step in learning["label_tokens_per_step"][n] for t in per_step]
        rows.append(
            [n, statistics.mean(final[n]), min(final[n]), max(final[n])]
            + [statistics.mean(learning["steps"][n]), statistics.mean(seen[n])]
            + [statistics.mean(tokens), statistics.pstdev(tokens)]
        )
    print_table(
        ["strategy", "mean", "min", "max", "steps", "samples", "label tokens/step", "std"],
        rows,
        ["", ".3f", ".3f", ".3f", ".1f", ".1f", ".0f", ".0f"],
    )
    mean = statistics.mean(final[packed])
    inside = min(final[naive]) <= mean <= max(final[naive])
    print(
        f"   {packed}'s mean, {mean:.3f}, is {'within' if inside else 'OUTSIDE'} naive's "
        f"range over {over}; paired (same initial weights and samples), {packed} - naive: "
        + ", ".join(f"{p - q:+.3f}" for p, q in zip(final[packed], final[naive]))
    )
    if args.orders > 1:
        for n in (naive, packed):
            spreads = [
                max(final[n][i : i + args.orders]) - min(final[n][i : i + args.orders])
                for i in range(0, len(final[n]), args.orders)
            ]
            print(
                f"   the order alone (same weights and samples) moves {n}'s final loss by "
                + ", ".join(f"{d:.3f}" for d in spreads)
                + " (per seed, max - min)"
            )


def save_learning_curves(learning, runs, names, args) -> None:
    curves = {n: [(log["samples_seen"], log["loss"]) for log in runs["logs"][n]] for n in names}
    fig = plot_learning_curves(
        learning["samples_seen"],
        learning["eval_loss"],
        learning["eval_steps"],
        curves,
        f"Same learning? Held-out loss over {seeds_and_orders(args)} "
        f"(TinyVLM, {args.train_samples} samples, the same initial weights per seed)",
    )
    path = display_path(save_figure(fig, args.out_dir, "06.png"))
    print(f"   Saved the learning curves to {path}")


# 3. Real tokens per second, and where the time goes ---------------------------------------------


def summarize_speed(runs, names, data: StageData, args) -> dict:
    """Per strategy: each run's speed (speed_of_run), the median over runs, and what one epoch of
    every row would take; the gain of packing over naive padding, run by run."""
    naive, constrained, packed = names
    per_seed = {n: [speed_of_run(log) for log in runs["logs"][n]] for n in names}
    steps_per_epoch = {naive: math.ceil(len(data.samples) / args.batch_size)}
    steps_per_epoch[constrained] = steps_per_epoch[naive]
    steps_per_epoch[packed] = math.ceil(data.num_packs / data.packs_per_batch)
    ratios = {
        "real_tokens_per_s": [
            p["real_tokens_per_s"] / q["real_tokens_per_s"]
            for p, q in zip(per_seed[packed], per_seed[naive])
        ],
        "waste": [q["computed_tokens"] / q["real_tokens"] for q in per_seed[naive]],
    }
    ratios["recovered"] = [g / w for g, w in zip(ratios["real_tokens_per_s"], ratios["waste"])]
    # The logits of a padded batch: per position, do they cost more in a large tensor?
    model = TinyVLM(data.vlm_config)
    shapes = [(data.packs_per_batch, args.max_length), (args.batch_size, args.max_length)]
    return {
        "per_strategy": {n: strategy_speed(per_seed[n], steps_per_epoch[n]) for n in names},
        "gain": {k: median_and_range(v) for k, v in ratios.items()},
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


def median_and_range(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "per_seed": [round(v, 3) for v in values],
    }


def with_range(values: dict, spec: str, unit: str = "") -> str:
    """A median_and_range as text: "2.07x [1.98-2.20]" (spec ".2f", unit "x")."""
    return f"{values['median']:{spec}}{unit} [{values['min']:{spec}}-{values['max']:{spec}}]"


def print_speed(speed, names, args) -> None:
    packed = names[2]
    print(
        f"3. Speed, median over the seeds (real tok/s: also min and max); a step is "
        f"{args.batch_size} samples padded, or packs of {args.max_length} holding about as many:"
    )
    rows = []
    for n in names:
        s = speed["per_strategy"][n]
        rate = s["per_seed"]["real_tokens_per_s"]
        rows.append(
            [n, s["real_tokens_per_s"], min(rate), max(rate)]
            + [s["steps"], s["steps_per_epoch"], s["seconds_per_epoch"]]
        )
    print_table(
        ["strategy", "real tok/s", "min", "max", "steps", "steps/epoch", "s/epoch"],
        rows,
        ["", ",.0f", ",.0f", ",.0f", "", "", ".1f"],
    )
    gain = speed["gain"]
    print(
        f"   {packed} / naive real tokens per second: "
        f"{with_range(gain['real_tokens_per_s'], '.2f', 'x')}; naive padding computes "
        f"{with_range(gain['waste'], '.2f', 'x')} its real tokens; recovered "
        f"{with_range(gain['recovered'], '.0%')} of that waste"
    )


def print_where_the_time_goes(speed, names) -> None:
    packed = names[2]
    seconds, computed = speed["time_per_part"], speed["computed_tokens"]
    columns = {part: [seconds[n][part] for n in names] for part in PARTS}
    columns["total"] = [sum(seconds[n].values()) for n in names]
    columns["computed tokens"] = [computed[n] for n in names]
    rows = []
    for label, values in columns.items():
        spec = ",.0f" if label == "computed tokens" else ".2f"
        ratio = values[0] / values[2] if values[2] else float("nan")
        rows.append([label, *(f"{v:{spec}}" for v in values), f"{ratio:.2f}x"])
    print("   where the time goes (seconds over a run, median over seeds):")
    print_table(["part", *names, f"naive/{packed}"], rows)
    cost = speed["logits_us_per_position"]
    print(
        "   logits + loss, forward and backward, per position: "
        + ", ".join(f"{shape}: {us:,.0f} us" for shape, us in cost.items())
    )
    load = speed["load_average"]
    busy = max(load["before"], load["after"]) > load["cores"]
    print(
        f"   load average of this machine ({load['cores']} cores, this run's threads included): "
        f"{load['before']:.1f} before training, {load['after']:.1f} after"
        + ("; above the core count, other processes compete and timings are noisy" if busy else "")
    )


# 4. Same gradient under DDP ----------------------------------------------------------------------


def check_ddp_gradient(args) -> dict:
    """mmdp.training.ddp under torchrun: two ranks (gloo, CPU), two micro-steps each, of stage 5's
    packed batches; each normalisation's gradient against one process's over the same batches."""
    if args.skip_ddp:
        return ddp_not_run("skipped (--skip-ddp)")
    data_args = [
        f"--{name}={getattr(args, name)}"
        for name in ("dataset", "subset", "split")
        if getattr(args, name) is not None
    ]
    started = time.perf_counter()
    try:
        result = run_torchrun("--max-length", str(args.max_length), *data_args)
    except RuntimeError as error:
        return ddp_not_run(str(error))
    return {
        **result,
        "seconds": round(time.perf_counter() - started, 1),
        "command": "torchrun --standalone --nproc_per_node 2 -m mmdp.training.ddp",
    }


def ddp_not_run(reason: str) -> dict:
    return {
        "grad_rel_diff_global_tokens": None,
        "grad_rel_diff_per_rank_mean": None,
        "reason": reason,
    }


def print_ddp(ddp) -> None:
    print("4. One optimizer step of packed batches under DDP (torchrun, 2 ranks, gloo):")
    if ddp["grad_rel_diff_global_tokens"] is None:
        print(f"   {ddp['reason']}")
        return
    print(
        f"   {ddp['world_size']} ranks x {ddp['micro_steps']} micro-steps of "
        f"{ddp['packs_per_batch']} packs; label tokens per micro-batch, rank by rank: "
        f"{ddp['label_tokens_per_micro_batch']}"
    )
    same = ddp["grad_rel_diff_global_tokens"] < 1e-5
    weight = ddp["token_weight_per_rank_mean"]
    print("   gradient against one process on the same batches (relative difference):")
    print(
        f"   summed loss / label tokens all-reduced over ranks and micro-steps: "
        f"{ddp['grad_rel_diff_global_tokens']:.1e} ({'the same' if same else 'NOT the same'})"
    )
    print(
        f"   each micro-batch's own mean / micro-steps, DDP's average of ranks: "
        f"{ddp['grad_rel_diff_per_rank_mean']:.1e} (a token weighs {weight['min']:.2f}x to "
        f"{weight['max']:.2f}x what it weighs in one process)"
    )


# 5. Every strategy on one epoch ------------------------------------------------------------------


def compare_every_strategy(data: StageData, args) -> dict:
    # the rows were weighed once, in load_data
    results = compare_strategies(
        data.weights,
        max_length=args.max_length,
        max_images=args.max_images,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    print(
        f"5. One epoch of {len(data.samples):,} samples, max_length {args.max_length}, "
        f"batch size {args.batch_size}:"
    )
    per_row = ("tokens_per_row", "images_per_row", "samples_per_row")
    print_table(
        ["strategy", "utilization", "batches", "dropped"]
        + ["tokens/row", "std", "images/row", "std", "samples/row", "std"],
        [
            [name, r["utilization"], r["batches"], sum(r["dropped"].values())]
            + [r[key][stat] for key in per_row for stat in ("mean", "std")]
            for name, r in results.items()
        ],
        ["", ".1%", "", "", ".0f", ".0f", ".1f", ".1f", ".1f", ".1f"],
    )
    fig = plot_strategies(
        results,
        f"Every strategy on one epoch ({len(data.samples):,} samples, rows of {args.max_length})",
    )
    path = display_path(save_figure(fig, args.out_dir, "strategies.png"))
    print(f"   Saved the comparison to {path}")
    return {n: {k: v for k, v in r.items() if k != "per_row"} for n, r in results.items()}


if __name__ == "__main__":
    with exit_on_user_error():
        main()
