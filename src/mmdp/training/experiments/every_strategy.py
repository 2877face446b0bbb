"""Part 5 of stage 6: every batching strategy on one epoch of every row, from the weights alone
(mmdp.training.strategies), and what --metrics-json holds of the whole stage."""

from mmdp.training.experiments.data import StageData
from mmdp.training.experiments.settings import ExperimentSettings
from mmdp.training.strategies import compare_strategies


def compare_every_strategy(data: StageData, settings: ExperimentSettings) -> dict:
    """compare_strategies on the rows weighed once, in load_data; the figure reads "per_row"."""
    return compare_strategies(
        data.weights,
        max_length=settings.max_length,
        max_images=settings.max_images,
        batch_size=settings.batch_size,
        packs_per_batch=settings.batch_size,  # as many packs a batch as padding batches samples
        seed=settings.seed,
    )


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
