"""What every part of stage 6 works from: the rows, their weights, which rows fit a pack and which
are held out, and the batches each strategy (naive padding, constrained padding, packing) makes
of the same rows."""

import dataclasses

import datasets
import torch
from transformers import PreTrainedTokenizerBase

from mmdp.data.padding import ConstrainedPadCollator, NaivePadCollator
from mmdp.data.reading.settings import DataSettings
from mmdp.data.reading.sources import no_progress_bars
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import UserError
from mmdp.flags import settings_of
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.models.tiny_vlm import TinyVLMConfig
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Budgets, Weights
from mmdp.planning.planner import EpochPlan, filter_rows, plan_epoch
from mmdp.report.epoch import nothing_to_do
from mmdp.training.experiments.settings import ExperimentSettings
from mmdp.weighing.weigh import weigh_rows


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
    rows = settings_of(DataSettings, settings).load()
    weights = weigh_rows(rows, tokenizer).weights
    fits = rows_that_fit(weights, settings)
    held_out, pool = hold_out(fits, weights.reasons, settings)
    num_packs = len(plan_whole_epoch(weights, settings).pack_starts) - 1
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


def rows_that_fit(weights: Weights, settings: ExperimentSettings) -> list[int]:
    """The usable rows within --max-length and --max-images, in dataset order (the planner's
    own filter, step 1)."""
    fits, dropped = filter_rows(weights, Budgets(settings.max_length, settings.max_images))
    if not len(fits):
        raise nothing_to_do(
            len(weights), dropped, f"raise --max-length ({settings.max_length} tokens a pack)"
        )
    return fits.tolist()


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


# Stage 5's loader: the only place stage 6 builds a PackedDataset.


def plan_whole_epoch(weights: Weights, settings: ExperimentSettings) -> EpochPlan:
    """Stage 5's plan of one epoch of every row, packed with --strategy, on one rank (its packs
    are what counts: on one rank no pack is left out, however many packs a batch holds)."""
    return plan_epoch(weights, packing(settings, packs_per_batch=1, seed=settings.seed))


def packed_batches(
    data: StageData, rows: list[int], settings: ExperimentSettings, *, seed: int, epoch=0
) -> list[dict]:
    """Stage 5's batches of `rows`: all of one epoch, packed with --strategy.

    PackedDataset weighs the selected rows again, as a dataset of their own: a few rows, weighed
    in a moment, so without datasets' progress bars, which would only clutter the output.
    """
    with no_progress_bars():
        dataset = PackedDataset(
            VQADataset(data.rows.select(rows), data.tokenizer),
            config=packing(settings, packs_per_batch=data.packs_per_batch, seed=seed),
        )
    dataset.set_epoch(epoch)
    return list(PackedDataLoader(dataset, num_workers=0))


def packing(settings: ExperimentSettings, *, packs_per_batch: int, seed: int) -> PackingConfig:
    """Stage 5's packing of --strategy under --max-length and --max-images."""
    return PackingConfig(
        max_length=settings.max_length,
        max_images=settings.max_images,
        packs_per_batch=packs_per_batch,
        strategy=settings.strategy,
        seed=seed,
    )


def padded_batches(samples, rows: list[int], collate, batch_size: int) -> list[dict]:
    """Stages 2 and 3: consecutive rows, batch_size at a time, padded by `collate`."""
    return [
        collate([samples[r] for r in rows[i : i + batch_size]])
        for i in range(0, len(rows), batch_size)
    ]


def strategy_batches(
    data: StageData, names, rows: list[int], settings: ExperimentSettings, seed: int, epoch=0
) -> dict:
    """The same rows as naive padding, constrained padding and packing batch them."""
    naive, constrained, packed = names
    pad_id = data.tokenizer.pad_token_id
    return {
        naive: padded_batches(data.samples, rows, NaivePadCollator(pad_id), settings.batch_size),
        constrained: padded_batches(
            data.samples,
            rows,
            ConstrainedPadCollator(pad_id, settings.max_length),
            settings.batch_size,
        ),
        packed: packed_batches(data, rows, settings, seed=seed, epoch=epoch),
    }
