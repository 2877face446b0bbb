"""Part 3 of stage 6: real tokens per second over the seeds (median and range), what an epoch of
every row would take, and where the time goes.

Every ratio of two strategies (or two counts) is a ratio of their medians over the seeds, the
medians the printed tables show, so a reader can recompute it (medians of 4,000 and 3,200 real
tokens per second: 1.25x). The ratio seed by seed comes with it, for the spread.
"""

import math
import os
import statistics

from mmdp.models.tiny_vlm import TinyVLM
from mmdp.training.experiments.data import StageData
from mmdp.training.experiments.settings import ExperimentSettings
from mmdp.training.loop import PARTS, median_time_per_part, speed_of_run, time_logits_per_position


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
        (data.packs_per_batch, settings.max_length),
        (settings.batch_size, settings.max_length),
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
    """The ratio of two medians over the seeds, and the ratio seed by seed (the spread).

    >>> ratio_of_medians([4.0, 2.0, 9.0], [2.0, 2.0, 3.0])
    {'ratio_of_medians': 2.0, 'per_seed': [2.0, 1.0, 3.0]}
    """
    median = statistics.median(numerator) / statistics.median(denominator)
    per_seed = [p / q for p, q in zip(numerator, denominator)]
    return {"ratio_of_medians": round(median, 3), "per_seed": [round(r, 3) for r in per_seed]}


def time_per_part_columns(speed: dict, names) -> dict[str, list[float]]:
    """Where the time goes, a row per part of a step (then the total and the computed tokens),
    a value per strategy: seconds over a run, median over the seeds."""
    seconds, computed = speed["time_per_part"], speed["computed_tokens"]
    columns = {part: [seconds[n][part] for n in names] for part in PARTS}
    columns["total"] = [sum(seconds[n].values()) for n in names]
    columns["computed tokens"] = [computed[n] for n in names]
    return columns
