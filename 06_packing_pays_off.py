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

import contextlib
import dataclasses
import statistics
import time

import torch

from mmdp import config
from mmdp.errors import exit_on_user_error
from mmdp.flags import Figures, command_line, flag_values, parse_flags
from mmdp.report import (
    display_path,
    plot_learning_curves,
    plot_strategies,
    print_settings,
    print_table,
    save_figure,
    write_json,
)
from mmdp.training.ddp import DdpSettings, run_torchrun
from mmdp.training.experiments import (
    ExperimentSettings,
    StageData,
    check_same_loss,
    compare_every_strategy,
    load_data,
    summarize_learning,
    summarize_speed,
    train_over_seeds,
)


@dataclasses.dataclass(frozen=True)
class Stage6Settings:
    """The experiments' settings (mmdp.training.experiments), and where the results go."""

    experiments: ExperimentSettings = ExperimentSettings()
    figures: Figures = Figures()
    metrics_json: str | None = config.setting(None, "write the results as JSON here")


def main(argv=None):
    started = time.perf_counter()
    flags = parse_flags(Stage6Settings, __doc__, argv)
    print_settings(flag_values(flags))
    settings = flags.experiments  # what the experiments read of the flags
    torch.manual_seed(settings.seed)
    data = load_data(settings)
    names = ("naive", "constrained", settings.packing.strategy)
    seconds = {}

    with timed(seconds, "1. same loss"):
        check = check_same_loss(data, names, settings)
        print_check(check, names, settings)
    with timed(seconds, "2-3. training"):
        print(
            f"2. Training every strategy on {settings.train_samples} samples, "
            f"{seeds_and_orders(settings)} (attention sdpa); held-out loss every "
            f"{settings.eval_every} samples:"
        )
        runs = train_over_seeds(data, names, settings, after_run=print_run(names, settings))
        learning = summarize_learning(runs, names, settings)
        print_learning(learning, runs, names, settings)
        save_learning_curves(learning, runs, names, settings, flags.figures.out_dir)
        speed = summarize_speed(runs, names, data, settings)
        print_speed(speed, names, settings)
        print_where_the_time_goes(speed, names)
    with timed(seconds, "4. DDP"):
        ddp = check_ddp_gradient(settings)
        print_ddp(ddp)
    with timed(seconds, "5. every strategy"):
        strategies = compare_every_strategy(data, settings)
        print_every_strategy(strategies, data, settings, flags.figures.out_dir)

    total = time.perf_counter() - started
    parts = ", ".join(f"{part} {s:.0f} s" for part, s in seconds.items())
    print(f"Stage 6 took {total // 60:.0f} min {total % 60:.0f} s ({parts}).")
    if flags.metrics_json:
        seconds["total"] = total
        metrics = stage_metrics(check, learning, speed, ddp, strategies, data.device, seconds)
        print(f"Wrote the results to {display_path(write_json(metrics, flags.metrics_json))}")


@contextlib.contextmanager
def timed(seconds: dict, part: str):
    start = time.perf_counter()
    yield
    seconds[part] = time.perf_counter() - start


# 1. Same loss ------------------------------------------------------------------------------------


def print_check(check, names, settings) -> None:
    where = "GPU" if torch.cuda.is_available() else "CPU"
    note = ""
    if settings.attn_implementation == "flash_attention_2" and not torch.cuda.is_available():
        note = (
            "; no GPU: transformers' FlashAttention routing with mmdp's reference kernels, "
            "correctness only, not speed"
        )
    print(
        f"1. Loss of the same {check['samples']} samples (float32, {where}, "
        f"attention {settings.attn_implementation}{note}):"
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


def print_run(names, settings):
    """What to print after each training run: its final held-out loss per strategy."""

    def after_run(seed: int, order: int, logs: dict, seconds: float) -> None:
        finals = ", ".join(f"{n} {logs[n]['eval_loss'][-1]:.3f}" for n in names)
        print(
            f"   seed {seed}"
            + (f", order {order}" if settings.orders > 1 else "")
            + f": final held-out loss {finals} ({seconds:.0f} s)"
        )

    return after_run


def seeds_and_orders(settings) -> str:
    seeds = f"{settings.seeds} seed{'s' * (settings.seeds != 1)}"
    return seeds + (f" x {settings.orders} orders" if settings.orders > 1 else "")


def final_losses(learning: dict) -> dict[str, list[float]]:
    """Each strategy's final held-out loss, run by run (in the order of learning["runs"])."""
    return {n: [losses[-1] for losses in per_run] for n, per_run in learning["eval_loss"].items()}


def order_spreads(final: list[float], orders: int) -> list[float]:
    """How much the order alone moves a strategy's final loss: max - min over each seed's
    `orders` runs (runs go seed after seed, each seed's orders together)."""
    return [
        max(final[i : i + orders]) - min(final[i : i + orders])
        for i in range(0, len(final), orders)
    ]


def print_learning(learning, runs, names, settings) -> None:
    naive, _, packed = names
    final = final_losses(learning)
    seen = {n: [log["samples_seen"][-1] for log in runs["logs"][n]] for n in names}
    over = seeds_and_orders(settings)
    print(
        f"   final held-out loss (mean over the label tokens of {settings.eval_samples} held-out "
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
    if settings.orders > 1:
        for n in (naive, packed):
            print(
                f"   the order alone (same weights and samples) moves {n}'s final loss by "
                + ", ".join(f"{d:.3f}" for d in order_spreads(final[n], settings.orders))
                + " (per seed, max - min)"
            )


def save_learning_curves(learning, runs, names, settings, out_dir: str) -> None:
    curves = {n: [(log["samples_seen"], log["loss"]) for log in runs["logs"][n]] for n in names}
    fig = plot_learning_curves(
        learning["samples_seen"],
        learning["eval_loss"],
        learning["eval_steps"],
        curves,
        f"Same learning? Held-out loss over {seeds_and_orders(settings)} "
        f"(TinyVLM, {settings.train_samples} samples, the same initial weights per seed)",
    )
    path = display_path(save_figure(fig, out_dir, "06.png"))
    print(f"   Saved the learning curves to {path}")


# 3. Real tokens per second, and where the time goes ---------------------------------------------


def print_speed(speed, names, settings) -> None:
    packed = names[2]
    print(
        f"3. Speed, median over the seeds (real tok/s: also min and max); a step is "
        f"{settings.batch_size} samples padded, or packs of {settings.packing.max_length} holding about as many:"
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
    # a row per part of a step (mmdp.training.loop.PARTS), then the total and the computed tokens,
    # a value per strategy
    seconds, computed = speed["time_per_part"], speed["computed_tokens"]
    columns = {part: [seconds[n][part] for n in names] for part in seconds[names[0]]}
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
    )
    if busy:
        print("   above the core count: other processes compete, and the timings are noisy")


# 4. Same gradient under DDP ----------------------------------------------------------------------


def check_ddp_gradient(settings: ExperimentSettings) -> dict:
    """mmdp.check_ddp (mmdp.training.ddp's step) under torchrun: two ranks (gloo, CPU), two micro-steps each, of stage 5's
    packed batches of the same rows (its own --num-rows), each normalisation's gradient against
    one process's over the same batches."""
    if settings.skip_ddp:
        return ddp_not_run("skipped (--skip-ddp)")
    defaults = DdpSettings()
    ddp = dataclasses.replace(
        defaults,
        data=dataclasses.replace(settings.data, num_rows=defaults.data.num_rows),
        packing=dataclasses.replace(defaults.packing, max_length=settings.packing.max_length),
    )
    started = time.perf_counter()
    try:
        result = run_torchrun(*command_line(ddp))
    except RuntimeError as error:
        return ddp_not_run(str(error))
    return {
        **result,
        "seconds": round(time.perf_counter() - started, 1),
        "command": "torchrun --standalone --nproc_per_node 2 -m mmdp.check_ddp",
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


def print_every_strategy(results: dict, data: StageData, settings, out_dir: str) -> None:
    print(
        f"5. One epoch of {len(data.samples):,} samples, max_length {settings.packing.max_length}, "
        f"{settings.batch_size} samples a padded batch, {settings.batch_size} packs a packed one:"
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
        f"Every strategy on one epoch ({len(data.samples):,} samples, rows of {settings.packing.max_length})",
    )
    path = display_path(save_figure(fig, out_dir, "strategies.png"))
    print(f"   Saved the comparison to {path}")


def stage_metrics(check, learning, speed, ddp, strategies, device: str, seconds: dict) -> dict:
    """What --metrics-json holds: every part's results, and the seconds each part took."""
    return {
        "loss": check,
        "learning": learning,
        "speed": speed["per_strategy"],
        "speed_gain": speed["gain"],
        "time_per_part": speed["time_per_part"],
        "logits_us_per_position": speed["logits_us_per_position"],
        "load_average": speed["load_average"],
        "ddp": ddp,
        "strategies": {
            n: {k: v for k, v in r.items() if k != "per_row"} for n, r in strategies.items()
        },
        "device": device,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
    }


if __name__ == "__main__":
    with exit_on_user_error():
        main()
