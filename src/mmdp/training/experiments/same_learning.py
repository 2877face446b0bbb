"""Part 2 of stage 6, same learning: for each seed, from the same initial weights, every strategy
trains on the same samples (one step of each in turn); every --eval-every samples, the loss on
the same held-out samples, never trained on. --orders N retrains each seed's samples in N - 1
other orders: how much the order alone moves the result."""

import copy
import os
import time
from collections.abc import Callable

import numpy as np
import torch

from mmdp.errors import UserError
from mmdp.models.tiny_vlm import TinyVLM
from mmdp.training.experiments.data import StageData, packed_batches, strategy_batches
from mmdp.training.experiments.settings import ExperimentSettings
from mmdp.training.loop import train_in_turns


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
        "checkpoints": checkpoints(settings),
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
    """Every strategy from the `initial` weights on the same rows, one step of each in turn (all
    three meet the same load on a shared machine); order 0 takes the rows as drawn, another a
    seeded shuffle of them. Returns {name: training log} (mmdp.training.loop.train)."""
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
        "samples_seen": runs["checkpoints"],
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
