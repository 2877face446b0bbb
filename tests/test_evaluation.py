"""Exact packed evaluation: an eval split held out by ratio (deterministic, disjoint from the
training rows, the same on every rank) and MMDPTrainer.evaluate's eval_loss, checked against
every eval sample run alone through a tiny random Qwen2.5-VL (the real class), as a whole and
per source of a mixture; Trainer's way (the mean of each batch's mean) is the control."""

import copy

import numpy as np
import pytest
import torch
from test_families import alone_inputs
from torchrun_matrix import family_case
from transformers import TrainingArguments

from mmdp.data.mixture import MixedRows, Mixture, Source
from mmdp.data.reading.settings import DataSettings
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.packing_config import PackingConfig
from mmdp.planning.planner import eval_split
from mmdp.training.loss import label_tokens, mean_over_tokens, summed_loss
from mmdp.training.trainer import NO_EVAL_DATASET, NO_EVAL_LOADER, MMDPTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SOURCES = ("even", "odd")  # the matrix rows, by number, as two sources
RATIO = 0.25  # 36 rows: 18 a source, round(4.5) = 4 of each held out


@pytest.fixture(scope="module")
def case():
    """The trainer matrix's Qwen2.5-VL rows (36, 0-2 images each) as a mixture of two sources,
    a quarter of them held out for evaluation, and the tiny model."""
    matrix = family_case("qwen2_5_vl")
    rows = matrix.samples.dataset
    mixture = Mixture(tuple(Source(name, DataSettings("synthetic:count"), 0.5) for name in SOURCES))
    mixed = MixedRows(rows, np.arange(len(rows), dtype=np.int16) % 2, mixture)
    samples = VQADataset(rows, matrix.samples.family.processor, mixture=mixed)
    config = PackingConfig(max_length=matrix.max_length, packs_per_batch=2)
    train = PackedDataset(samples, config=config, eval_ratio=RATIO, rank=0, world_size=1)
    return matrix, samples, train


def trainer_for(case, tmp_path, **arguments):
    matrix, _, train = case
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True,
        learning_rate=1e-2, lr_scheduler_type="constant", **arguments,
    )  # fmt: skip
    return MMDPTrainer(
        model=copy.deepcopy(matrix.model),
        args=args,
        train_loader=PackedDataLoader(train, num_workers=0),
        eval_loader=PackedDataLoader(train.eval_dataset(), num_workers=0),
        model_inputs=matrix.inputs,
    )


def test_the_eval_split_is_held_out_by_ratio_the_same_on_every_rank_and_disjoint(case):
    _, samples, train = case
    held_out = eval_split(36, RATIO, seed=0, source_of_row=samples.source_of_row)
    assert held_out.sum() == 8 and np.bincount(samples.source_of_row[held_out]).tolist() == [4, 4]
    assert (held_out == eval_split(36, RATIO, seed=0, source_of_row=samples.source_of_row)).all()
    other_seed = eval_split(36, RATIO, seed=1, source_of_row=samples.source_of_row)
    assert not (held_out == other_seed).all()
    for world_size in (1, 2):  # each split's rows over the ranks: every row once, no row in both
        rows = {"train": [], "eval": []}
        for rank in range(world_size):
            config = train.config
            mine = PackedDataset(
                samples, config=config, eval_ratio=RATIO, rank=rank, world_size=world_size
            )
            rows["train"] += mine.plan(0).for_rank(rank).rows.tolist()
            rows["eval"] += [
                r
                for step, batch in enumerate(mine.eval_dataset().plan(0).for_rank(rank).packs())
                if not mine.eval_dataset().plan(0).for_rank(rank).is_filler(step)
                for r in batch.tolist()
            ]
        assert sorted(rows["eval"]) == np.flatnonzero(held_out).tolist()
        usable = set(range(36)) - set(np.flatnonzero(held_out).tolist())
        assert sorted(rows["train"]) == sorted(usable)  # no matrix row is over a budget
    assert (
        train.settings()["split"] == "train" and train.eval_dataset().settings()["split"] == "eval"
    )


def test_the_eval_dataset_reuses_the_weighing_and_the_training_seeds_held_out_rows(case):
    _, samples, train = case
    held_out = train.eval_dataset(PackingConfig(max_length=train.max_length, seed=7))
    assert held_out.weighing is train.weighing  # nothing weighed again
    # another seed would hold out other rows (the control): the training seed drew them
    assert (held_out.split == ~train.split).all() and held_out.seed == train.seed == 0
    other = PackedDataset(samples, config=PackingConfig(seed=7), eval_ratio=RATIO, held_out=True)
    assert not (other.split == held_out.split).all()
    with pytest.raises(ValueError, match="needs a PackedDataset made with eval_ratio"):
        held_out.eval_dataset()
    with pytest.raises(TypeError):  # everything after the dataset is a keyword
        PackedDataset(samples, train.config)


def reference(model, samples, rows) -> tuple[float, int]:
    """Every sample alone, as the model takes it unpacked: (summed loss, label tokens)."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for row in rows:
            sample = samples[row]
            inputs = alone_inputs(samples.family, sample)
            logits = model(**inputs, use_cache=False).logits
            total += float(summed_loss(logits, sample["labels"][None]))
            tokens += label_tokens(sample["labels"][None])
    return total, tokens


def test_eval_loss_is_every_eval_tokens_mean_per_source_too_not_a_mean_of_batch_means(
    case, tmp_path
):
    matrix, samples, train = case
    trainer = trainer_for(case, tmp_path)
    metrics = trainer.evaluate()
    model = trainer.model.eval()
    held_out = np.flatnonzero(~train.split)
    total, tokens = reference(model, samples, held_out)
    print(f"eval_loss {metrics['eval_loss']:.6f}, unpacked {total / tokens:.6f}")
    assert metrics["eval_loss"] == pytest.approx(total / tokens, rel=1e-5)
    assert metrics["eval_label_tokens"] == tokens and metrics["eval_samples"] == len(held_out)
    for s, name in enumerate(SOURCES):
        mine = held_out[samples.source_of_row[held_out] == s]
        source_total, source_tokens = reference(model, samples, mine)
        assert metrics[f"eval_{name}_loss"] == pytest.approx(source_total / source_tokens, rel=1e-5)
    assert metrics["eval_even_loss"] != pytest.approx(metrics["eval_odd_loss"], rel=1e-4)

    # the control, Trainer's evaluation_loop: the mean of each batch's mean loss
    with torch.no_grad():
        means = [
            float(mean_over_tokens(model(**matrix.inputs(batch, model)).logits, batch["labels"]))
            for batch in trainer.eval_loader
        ]
    print(f"mean of batch means {np.mean(means):.6f}")
    assert len(means) > 1 and abs(np.mean(means) - total / tokens) > 1e-3


@pytest.mark.slow  # 2 epochs of training: 9 s on a quiet 2-core machine
def test_eval_strategy_epoch_evaluates_at_each_loader_epochs_end_once(case, tmp_path):
    trainer = trainer_for(
        case, tmp_path, num_train_epochs=2, eval_strategy="epoch", save_strategy="no"
    )
    trainer.train()
    evaluations = [e for e in trainer.state.log_history if "eval_loss" in e]
    steps = [e["step"] for e in evaluations]
    assert steps == [trainer.state.global_step // 2, trainer.state.global_step]  # not twice
    assert [e["epoch"] for e in evaluations] == [1.0, 2.0]
    assert evaluations[0]["eval_loss"] != evaluations[1]["eval_loss"]  # the model learned


def test_an_eval_dataset_or_an_eval_strategy_without_a_loader_is_one_sentence(case, tmp_path):
    matrix, _, train = case
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    loader = PackedDataLoader(train, num_workers=0)
    with pytest.raises(ValueError, match="eval_dataset") as said:
        MMDPTrainer(model=matrix.model, args=args, train_loader=loader, eval_dataset=[1])
    assert str(said.value) == NO_EVAL_DATASET
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", eval_strategy="steps"
    )
    with pytest.raises(ValueError) as said:
        MMDPTrainer(model=matrix.model, args=args, train_loader=loader)
    assert str(said.value) == NO_EVAL_LOADER
