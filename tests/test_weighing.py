"""Weighing rows once: the same weights as tokenizing each row, cached by everything they depend
on, in parallel, and (with pretokenize) the same samples and batches as tokenizing at load time."""

import concurrent.futures
import pickle
import time
from datetime import timedelta

import numpy as np
import pytest
import torch

from mmdp.data.conversation import count_tokens_batch, tokenize_conversation
from mmdp.data.sources import load_vqa_dataset
from mmdp.data.vqa_dataset import VQADataset
from mmdp.drop_reasons import CODE
from mmdp.models.family import TinyFamily
from mmdp.packing import weighing
from mmdp.packing.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.weighing import weigh_rows


@pytest.fixture(scope="module")
def rows():
    return load_vqa_dataset(num_rows=120)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMDP_CACHE", str(tmp_path))
    return tmp_path


def test_weights_are_each_rows_tokens_and_images(rows, tokenizer, fresh_cache):
    weights = weigh_rows(rows, tokenizer).weights
    images = [len(row["images"]) for row in rows]
    lengths, reasons = count_tokens_batch(rows["texts"], images, tokenizer)
    assert weights.lengths.tolist() == lengths
    assert weights.image_counts.tolist() == images
    assert weights.reasons.tolist() == [CODE[r] for r in reasons]
    assert weights.lengths.dtype == np.int32 and weights.reasons.dtype == np.uint8


def test_a_second_weighing_loads_the_cache_and_any_change_weighs_again(
    rows, tokenizer, fresh_cache
):
    first = weigh_rows(rows, tokenizer)
    again = weigh_rows(rows, tokenizer)
    assert first.weighed_here and not again.weighed_here
    assert np.array_equal(first.weights.lengths, again.weights.lengths)
    assert again.path.parent.parent == fresh_cache
    # anything the weights depend on changes the cache entry
    assert weigh_rows(rows.select(range(100)), tokenizer).weighed_here  # other rows
    assert weigh_rows(rows, TinyFamily(tokenizer, image_token_length=32)).weighed_here  # per image
    template = tokenizer.chat_template
    tokenizer.chat_template = template + "{# another template #}"
    try:
        assert weigh_rows(rows, tokenizer).weighed_here  # another chat template
    finally:
        tokenizer.chat_template = template
    assert not weigh_rows(rows, tokenizer).weighed_here


def test_other_local_ranks_wait_for_local_rank_0s_weights_without_a_collective(
    rows, tokenizer, fresh_cache, monkeypatch
):
    monkeypatch.setattr(weighing, "WAIT_FOR_WEIGHING", timedelta(seconds=2))
    monkeypatch.setattr(weighing, "POLL_SECONDS", 0.05)
    monkeypatch.setenv("LOCAL_RANK", "1")
    # nobody weighs: local rank 1 says what it waited for instead of hanging
    with pytest.raises(RuntimeError, match="waited .* for local rank 0 to weigh"):
        weigh_rows(rows, tokenizer)
    # local rank 0 weighs while local rank 1 waits, then rank 1 loads the same weights
    monkeypatch.setattr(weighing, "WAIT_FOR_WEIGHING", timedelta(minutes=5))
    waiting = concurrent.futures.ThreadPoolExecutor(1).submit(weigh_rows, rows, tokenizer)
    time.sleep(0.2)
    assert not waiting.done()
    monkeypatch.setenv("LOCAL_RANK", "0")
    weighed = weigh_rows(rows, tokenizer)
    loaded = waiting.result(timeout=60)
    assert weighed.weighed_here and not loaded.weighed_here
    assert np.array_equal(weighed.weights.lengths, loaded.weights.lengths)


def test_parallel_weighing_gives_the_same_weights(rows, tokenizer, fresh_cache):
    one = weigh_rows(rows, tokenizer, num_proc=1).weights
    (fresh_cache / "weights").rename(fresh_cache / "first")
    two = weigh_rows(rows, tokenizer, num_proc=2)
    assert two.weighed_here
    for name in ("lengths", "image_counts", "reasons"):
        assert np.array_equal(getattr(one, name), getattr(two.weights, name))


def test_pretokenized_rows_give_the_same_samples_and_batches(rows, tokenizer, fresh_cache):
    weighing = weigh_rows(rows, tokenizer, pretokenize=True)
    for index in (0, 7, 33):
        input_ids, labels = tokenize_conversation(
            rows[index]["texts"], len(rows[index]["images"]), tokenizer
        )
        assert weighing.tokens[index]["input_ids"] == input_ids.tolist()
        assert weighing.tokens[index]["labels"] == labels.tolist()
    samples = VQADataset(rows, tokenizer, image_size=16)
    settings = {"max_length": 512, "packs_per_batch": 4}
    plain = list(PackedDataLoader(PackedDataset(samples, **settings), num_workers=0))
    fast = list(
        PackedDataLoader(PackedDataset(samples, **settings, pretokenize=True), num_workers=2)
    )
    assert len(plain) == len(fast)
    for a, b in zip(plain, fast):
        assert a.keys() == b.keys()
        for key in a:
            same = (
                torch.equal(a[key], b[key])
                if isinstance(a[key], torch.Tensor)
                else a[key] == b[key]
            )
            assert same, key


def test_workers_receive_this_ranks_plan_not_every_rows_weights(rows, tokenizer, fresh_cache):
    dataset = PackedDataset(VQADataset(rows, tokenizer, image_size=16), packs_per_batch=2)
    expected = [
        batch["sample_index"].tolist() for batch in PackedDataLoader(dataset, num_workers=0)
    ]
    received = pickle.loads(pickle.dumps(dataset))
    assert received.weights is None and received._plan is None
    assert [
        b["sample_index"].tolist() for b in PackedDataLoader(received, num_workers=0)
    ] == expected
