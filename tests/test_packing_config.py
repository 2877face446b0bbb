"""One PackingConfig for both loaders and the planner (the only way to give them budgets: the
loose keywords max_length=..., seed=... are gone), and one resume check for both loaders."""

import dataclasses
import warnings

import numpy as np
import pytest

from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.loading.streaming import StreamingDataLoader, StreamingPackedDataset
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Weights
from mmdp.planning.planner import pack_buffer, plan_epoch

CONFIG = PackingConfig(max_length=8, max_images=2, packs_per_batch=2, strategy="binpack", seed=3)
WEIGHTS = Weights.from_lists([3, 6, 2, 5, 7, 1, 4, 4, 9], [0, 1, 2, 0, 1, 3, 0, 1, 0])


def test_the_config_is_what_plans_and_loose_keywords_are_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the config itself: no warning
        plan = plan_epoch(WEIGHTS, CONFIG)
    assert plan.batch_starts.tolist() == [0, 2, 4, 5]
    assert plan.dropped == {"too_long": 1, "too_many_images": 1}
    shorter = plan_epoch(WEIGHTS, dataclasses.replace(CONFIG, max_length=6))  # the config is read
    assert shorter.dropped == {"too_long": 2, "too_many_images": 1}
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_length'"):
        plan_epoch(WEIGHTS, max_length=8)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_length'"):
        pack_buffer(WEIGHTS, np.random.default_rng(0), max_length=8)
    with pytest.raises(ValueError, match="buffer_size must be positive"):
        PackingConfig(buffer_size=0)


def test_a_buffer_packs_as_the_planner_does():
    packs, dropped = pack_buffer(WEIGHTS, np.random.default_rng(0), CONFIG)
    assert sorted(sum((p.tolist() for p in packs), [])) == sorted(
        plan_epoch(WEIGHTS, CONFIG).rows.tolist()
    )
    assert dropped == plan_epoch(WEIGHTS, CONFIG).dropped


@pytest.fixture(scope="module")
def rows():
    return load_vqa_dataset(num_rows=60)


def test_both_loaders_save_the_config_and_refuse_another_one_the_same_way(rows, tokenizer):
    config = PackingConfig(max_length=512, packs_per_batch=2, buffer_size=30)
    planned = PackedDataLoader(
        PackedDataset(VQADataset(rows, tokenizer), config=config), num_workers=0
    )
    stream = rows.to_iterable_dataset(num_shards=1)
    streamed = StreamingDataLoader(
        StreamingPackedDataset(stream, tokenizer, config=config), num_workers=0
    )
    for loader in (planned, streamed):
        assert loader.dataset.max_length == 512 and loader.dataset.config is config
        state = loader.state_dict()
        assert {k: state[k] for k in dataclasses.asdict(config)} == dataclasses.asdict(config)
    other = dataclasses.replace(config, seed=1)
    for loader, state in (
        (
            PackedDataLoader(
                PackedDataset(VQADataset(rows, tokenizer), config=other), num_workers=0
            ),
            planned.state_dict(),
        ),
        (
            StreamingDataLoader(
                StreamingPackedDataset(stream, tokenizer, config=other), num_workers=0
            ),
            streamed.state_dict(),
        ),
    ):
        with pytest.raises(
            ValueError, match=r"cannot resume: the state was saved with seed 0 \(now 1\)"
        ):
            loader.load_state_dict(state)
