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
3. Real tokens per second over the seeds (median and range), and where the time goes. Packing's
   gain over naive padding is the ratio of the two medians the table shows.
4. Same gradient under DDP: one step of two ranks (torchrun, gloo) against one process.
5. Every strategy on one epoch (from lengths): assets/strategies.png.
The packed run is --strategy (default images_first_bfd) and is called by that name everywhere:
printouts, figure, JSON.
"""

import argparse
import contextlib
import statistics
import time

import torch

from mmdp import (
    ExperimentSettings,
    StageData,
    check_ddp_gradient,
    check_same_loss,
    compare_every_strategy,
    config,
    final_losses,
    load_data,
    order_spreads,
    stage_metrics,
    summarize_learning,
    summarize_speed,
    time_per_part_columns,
    train_over_seeds,
)
from mmdp.errors import exit_on_user_error
from mmdp.flags import (
    add_batch_size_arg,
    add_budget_args,
    add_data_args,
    add_strategy_arg,
    description,
    display_path,
    positive_float,
    positive_int,
    settings_of,
)
from mmdp.report import (
    plot_learning_curves,
    plot_strategies,
    print_settings,
    print_table,
    save_figure,
    write_json,
)

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
    add_strategy_arg(parser, help="the packer to train with")
    add_batch_size_arg(
        parser,
        help="samples per padded batch; packed batches hold packs of about as many samples",
    )
    add_budget_args(
        parser,
        max_length=config.MAX_LENGTH,
        max_length_help="token budget of a pack, and constrained padding's length "
        f"(default: {config.MAX_LENGTH})",
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
    settings = settings_of(ExperimentSettings, args)  # what the experiments read of the flags
    torch.manual_seed(args.seed)
    data = load_data(settings)
    names = ("naive", "constrained", args.strategy)
    seconds = {}

    with timed(seconds, "1. same loss"):
        check = check_same_loss(data, names, settings)
        print_check(check, names, args)
    with timed(seconds, "2-3. training"):
        print(
            f"2. Training every strategy on {args.train_samples} samples, "
            f"{seeds_and_orders(args)} (attention sdpa); held-out loss every "
            f"{args.eval_every} samples:"
        )
        runs = train_over_seeds(data, names, settings, after_run=print_run(names, args))
        learning = summarize_learning(runs, names, settings)
        print_learning(learning, runs, names, args)
        save_learning_curves(learning, runs, names, args)
        speed = summarize_speed(runs, names, data, settings)
        print_speed(speed, names, args)
        print_where_the_time_goes(speed, names)
    with timed(seconds, "4. DDP"):
        ddp = check_ddp_gradient(settings)
        print_ddp(ddp)
    with timed(seconds, "5. every strategy"):
        strategies = compare_every_strategy(data, settings)
        print_every_strategy(strategies, data, args)

    total = time.perf_counter() - started
    parts = ", ".join(f"{part} {s:.0f} s" for part, s in seconds.items())
    print(f"Stage 6 took {total // 60:.0f} min {total % 60:.0f} s ({parts}).")
    if args.metrics_json:
        seconds["total"] = total
        metrics = stage_metrics(check, learning, speed, ddp, strategies, data.device, seconds)
        print(f"Wrote the results to {display_path(write_json(metrics, args.metrics_json))}")


@contextlib.contextmanager
def timed(seconds: dict, part: str):
    start = time.perf_counter()
    yield
    seconds[part] = time.perf_counter() - start


# 1. Same loss ------------------------------------------------------------------------------------


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


def print_run(names, args):
    """What to print after each training run: its final held-out loss per strategy."""

    def after_run(seed: int, order: int, logs: dict, seconds: float) -> None:
        finals = ", ".join(f"{n} {logs[n]['eval_loss'][-1]:.3f}" for n in names)
        print(
            f"   seed {seed}"
            + (f", order {order}" if args.orders > 1 else "")
            + f": final held-out loss {finals} ({seconds:.0f} s)"
        )

    return after_run


def seeds_and_orders(args) -> str:
    seeds = f"{args.seeds} seed{'s' * (args.seeds != 1)}"
    return seeds + (f" x {args.orders} orders" if args.orders > 1 else "")


def print_learning(learning, runs, names, args) -> None:
    naive, _, packed = names
    final = final_losses(learning)
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
            print(
                f"   the order alone (same weights and samples) moves {n}'s final loss by "
                + ", ".join(f"{d:.3f}" for d in order_spreads(final[n], args.orders))
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
    gain, waste = speed["gain"]["real_tokens_per_s"], speed["gain"]["waste"]
    print(
        f"   {packed} / naive real tokens per second, the ratio of the medians above: "
        f"{gain['ratio_of_medians']:.2f}x (seed by seed {min(gain['per_seed']):.2f}x to "
        f"{max(gain['per_seed']):.2f}x); naive padding computes "
        f"{waste['ratio_of_medians']:.2f}x its real tokens"
    )


def print_where_the_time_goes(speed, names) -> None:
    packed = names[2]
    rows = []
    for label, values in time_per_part_columns(speed, names).items():
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
    )
    if busy:
        print("   above the core count: other processes compete, and the timings are noisy")


# 4. Same gradient under DDP ----------------------------------------------------------------------


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


def print_every_strategy(results: dict, data: StageData, args) -> None:
    print(
        f"5. One epoch of {len(data.samples):,} samples, max_length {args.max_length}, "
        f"{args.batch_size} samples a padded batch, {args.batch_size} packs a packed one:"
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


if __name__ == "__main__":
    with exit_on_user_error():
        main()
