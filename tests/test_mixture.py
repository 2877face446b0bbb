"""Mixtures of sources (mmdp.data.mixture): shares realised per rank and overall, the same plan
on every rank and for a seed, label policies, per-token loss weights and the weighted loss."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mmdp import config
from mmdp.batch import collate_packs, layout_pack
from mmdp.data.mixture import (
    Source,
    apply_source_rules,
    last_turn_labels,
    mixture_from_dict,
)
from mmdp.data.reading.settings import DataSettings
from mmdp.errors import UserError
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Weights
from mmdp.planning.planner import plan_epoch
from mmdp.planning.source_shares import MixturePlan, choose_rows
from mmdp.report.sources import source_report
from mmdp.training.loss import mean_over_tokens, weighted_mean_over_tokens

ASKED = np.array([0.5, 0.3, 0.2])


def three_sources(num_rows: int, seed: int = 0):
    """Long multimodal rows (source 0), medium ones (1), short text-only ones (2), in equal
    numbers: by rows each would be a third, by tokens source 0 would be over half."""
    rng = np.random.default_rng(seed)
    source = rng.integers(0, 3, num_rows).astype(np.int16)
    mean = np.array([300, 60, 30])[source]
    lengths = np.minimum(rng.geometric(1 / mean) + np.where(source == 2, 10, 64), 600)
    return Weights.from_lists(lengths, np.where(source == 2, 0, 1)), source


def token_shares(rows, source, weights) -> np.ndarray:
    tokens = np.bincount(source[rows], weights.lengths[rows], minlength=3)
    return tokens / tokens.sum()


@pytest.mark.parametrize(("world_size", "seed"), [(1, 0), (2, 0), (2, 1), (4, 2)])
def test_asked_50_30_20_by_tokens_is_realised_within_one_point_per_rank_and_overall(
    world_size, seed
):
    weights, source = three_sources(8000, seed)
    mixture = MixturePlan(source, ASKED, "tokens", None, seed)
    plan = plan_epoch(
        weights,
        PackingConfig(max_length=512, max_images=8, packs_per_batch=8, seed=seed),
        world_size=world_size,
        mixture=mixture,
    )
    overall = token_shares(plan.rows, source, weights)
    assert np.abs(overall - ASKED).max() < 0.01
    for rank in range(world_size):
        mine = token_shares(plan.for_rank(rank).rows, source, weights)
        assert np.abs(mine - ASKED).max() < 0.01, (rank, mine)
    # negative control: the same rows without the mixture are far from 50/30/20
    plain = plan_epoch(
        weights, PackingConfig(max_length=512, max_images=8, packs_per_batch=8, seed=seed)
    )
    assert np.abs(token_shares(plain.rows, source, weights) - ASKED).max() > 0.05


def test_the_plan_is_the_same_for_a_seed_and_on_every_rank_another_for_another_epoch():
    weights, source = three_sources(3000)

    def plan(seed, epoch):
        mixture = MixturePlan(source, ASKED, "tokens", None, seed)
        config = PackingConfig(max_length=512, max_images=8, packs_per_batch=4, seed=seed)
        return plan_epoch(weights, config, world_size=2, epoch=epoch, mixture=mixture).rows

    assert plan(0, 0).tolist() == plan(0, 0).tolist()
    assert plan(0, 1).tolist() != plan(0, 0).tolist()
    assert plan(1, 0).tolist() != plan(0, 0).tolist()


def test_by_rows_and_an_epoch_size_that_repeats_the_small_source():
    # source 0: rows 0-3 (10 tokens), source 1: rows 4-5 (20 tokens); 12 rows asked 50/50 by rows:
    # 6 of each, so source 0 is read once and a half (4 + 2) and source 1 three times (2 + 2 + 2).
    source = np.array([0, 0, 0, 0, 1, 1])
    lengths = np.array([10, 10, 10, 10, 20, 20])
    rows = choose_rows(
        np.arange(6),
        source,
        np.ones(6),
        np.array([0.5, 0.5]),
        epoch_size=12,
        rng=np.random.default_rng(0),
    )
    assert np.bincount(source[rows]).tolist() == [6, 6]
    assert np.bincount(rows, minlength=6)[4:].tolist() == [3, 3]
    assert sorted(np.bincount(rows, minlength=6)[:4].tolist()) == [1, 1, 2, 2]
    # by tokens instead: 50/50 of the default epoch (no row repeated) is 40 tokens each
    rows = choose_rows(
        np.arange(6),
        source,
        lengths,
        np.array([0.5, 0.5]),
        epoch_size=None,
        rng=np.random.default_rng(0),
    )
    assert sorted(rows.tolist()) == [0, 1, 2, 3, 4, 5]


def test_last_turn_keeps_only_the_last_reply():
    # two replies (5, 6) and (8, 9), each closed by its end-of-turn token 2
    labels = torch.tensor([-100, -100, 5, 6, 2, -100, -100, 8, 9, 2])
    assert last_turn_labels(labels).tolist() == [-100] * 7 + [8, 9, 2]
    one_reply = torch.tensor([-100, 5, 2])
    assert last_turn_labels(one_reply).tolist() == [-100, 5, 2]
    sample = {"labels": labels, "drop_reason": None}
    every = apply_source_rules(sample, Source("a", DataSettings("x"), 1.0, loss_weight=0.5))
    assert every["labels"].tolist() == labels.tolist() and every["loss_weight"] == 0.5
    last = apply_source_rules(sample, Source("b", DataSettings("x"), 1.0, labels="last_turn"))
    assert last["labels"].tolist() == [-100] * 7 + [8, 9, 2]


def fake_sample(row: int, length: int, labels: list[int], weight: float) -> dict:
    return {
        "row": row,
        "input_ids": torch.arange(length),
        "labels": torch.tensor(labels),
        "image_count": 0,
        "patches": 0,
        "converted": {},
        "loss_weight": weight,
    }


def test_loss_weights_reach_the_batch_per_token_and_weigh_the_loss_as_documented():
    # One pack of 8 tokens: sample A (3 tokens, weight 2.0), sample B (4 tokens, weight 0.5),
    # one padding token. Labels: A trains its positions 1, 2; B its positions 1, 2, 3 (a pack
    # sets every sample's first label to -100 anyway).
    a = fake_sample(0, 3, [-100, 1, 0], 2.0)
    b = fake_sample(1, 4, [-100, 1, 1, 0], 0.5)
    pack = {**layout_pack([a, b], 8, pad_token_id=0), "batch_index": 0, "dropped": {}}
    batch = collate_packs([pack])
    assert batch["loss_weights"].tolist() == [[2.0, 2.0, 2.0, 0.5, 0.5, 0.5, 0.5, 0.0]]
    # Vocabulary of 2. Logit t predicts label t + 1. Logits [0, 0] give loss ln 2 whatever the
    # label; logits [0, ln 3] give label 1 probability 3/4: loss ln(4/3).
    logits = torch.zeros(1, 8, 2)
    logits[0, [0, 3, 4], 1] = math.log(3)  # predicting A's label 1, B's labels 1 and 1
    # label tokens: A pos 1 (label 1, from logit 0: ln 4/3), A pos 2 (label 0, logit 1: ln 2),
    # B pos 1 (label 1, logit 3: ln 4/3), B pos 2 (label 1, logit 4: ln 4/3), B pos 3 (label 0,
    # logit 5: ln 2). Weighted: 2 (ln 4/3 + ln 2) + 0.5 (2 ln 4/3 + ln 2), over 5 label tokens.
    ln43, ln2 = math.log(4 / 3), math.log(2)
    expected = (2 * (ln43 + ln2) + 0.5 * (2 * ln43 + ln2)) / 5
    assert weighted_mean_over_tokens(logits, batch).item() == pytest.approx(expected, rel=1e-6)
    # negative control: without the weights it is the plain mean over the 5 label tokens
    plain = (3 * ln43 + 2 * ln2) / 5
    unweighted = {k: v for k, v in batch.items() if k != "loss_weights"}
    assert weighted_mean_over_tokens(logits, unweighted).item() == pytest.approx(plain, rel=1e-6)
    assert mean_over_tokens(logits, batch["labels"]).item() == pytest.approx(plain, rel=1e-6)
    assert abs(expected - plain) > 0.05


def test_a_pack_of_samples_without_a_mixture_carries_no_loss_weights():
    sample = fake_sample(0, 3, [-100, 1, 0], 1.0)
    del sample["loss_weight"]
    pack = {**layout_pack([sample], 4, pad_token_id=0), "batch_index": 0, "dropped": {}}
    assert "loss_weights" not in collate_packs([pack])
    assert config.IGNORE_INDEX == -100


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({}, "no sources"),
        ({"sources": [{"dataset": "synthetic:count"}]}, "needs 'dataset' and 'share'"),
        ({"sources": [{"dataset": "x", "share": 0}]}, "not > 0"),
        ({"sources": [{"dataset": "x", "share": 1, "labels": "first"}]}, "labels 'first'"),
        ({"sources": [{"dataset": "x", "share": 1, "weight": 2}]}, "unknown key(s) weight"),
        ({"share_by": "bytes", "sources": [{"dataset": "x", "share": 1}]}, "share_by is 'bytes'"),
        (
            {"sources": [{"dataset": "x", "share": 1}, {"dataset": "x", "share": 1}]},
            "share a name",
        ),
    ],
)
def test_a_bad_mixture_is_one_sentence(spec, says):
    with pytest.raises(UserError, match=None) as error:
        mixture_from_dict(spec, "m.json")
    assert says in str(error.value)


def test_the_per_source_report_counts_rows_over_the_patch_budget():
    """Under a patch budget each source's drops are judged on patches, as the plan's are: rows of
    2 images x 100 patches are over max_patches=150, rows of 1 image are not (a report that
    judged image counts against max_patches would call every row usable)."""
    mixture = mixture_from_dict(
        {"sources": [{"dataset": "a", "share": 1}, {"dataset": "b", "share": 1}]}
    )
    source = np.array([0, 0, 0, 1, 1, 1], dtype=np.int16)
    images = [2, 1, 1, 1, 2, 2]
    weights = Weights.from_lists([50] * 6, images, patch_counts=[100 * n for n in images])
    config = PackingConfig(max_length=512, max_images=4, max_patches=150, packs_per_batch=1)
    plan = MixturePlan(source, mixture.shares(), "rows", None, 0)
    epoch = plan_epoch(weights, config, mixture=plan)
    report = source_report(
        SimpleNamespace(mixture=mixture), plan, weights, [epoch.rows.tolist()],
        budgets=config.budgets,
    )  # fmt: skip
    assert [r["dropped"].get("too_many_patches", 0) for r in report] == [1, 2]
    assert [r["dropped"].get("left_out_by_mixture", 0) for r in report] == [1, 0]  # 1:1 by rows
    assert sum(r["samples"] for r in report) == len(epoch.rows) == 2
