"""Weighing rows once: the same weights as tokenizing each row, cached by everything they depend
on, in parallel, and (with pretokenize) the same samples and batches as tokenizing at load time."""

import concurrent.futures
import json
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset, Features, concatenate_datasets

from mmdp.data.conversation import count_tokens_batch, tokenize_conversation
from mmdp.data.families.tiny import TinyFamily
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.vqa_dataset import VQADataset
from mmdp.drop_reasons import CODE
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.packing_config import PackingConfig
from mmdp.weighing import weigh as weighing
from mmdp.weighing.row_tokens import RowTokens
from mmdp.weighing.weigh import TOKEN_FEATURES, environment_kept, weigh_rows


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


def test_parallel_weighing_gives_the_same_weights_and_leaves_the_environment_as_it_was(
    rows, tokenizer, fresh_cache, monkeypatch
):
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    environ = os.environ
    one = weigh_rows(rows, tokenizer, num_proc=1).weights
    (fresh_cache / "weights").rename(fresh_cache / "first")
    two = weigh_rows(rows, tokenizer, num_proc=2)
    assert two.weighed_here
    for name in ("lengths", "image_counts", "reasons"):
        assert np.array_equal(getattr(one, name), getattr(two.weights, name))
    # the same os.environ (monkeypatch puts MMDP_CACHE back through it), and the process's own
    # environment, which a new process inherits, without datasets' TOKENIZERS_PARALLELISM=false
    assert os.environ is environ
    assert inherited("TOKENIZERS_PARALLELISM") == "None"
    # the trap: datasets' map with num_proc swaps os.environ for an older copy of it and leaves
    # the variable it set for its processes (datasets 5.2, arrow_dataset.py:3540-3553 and 3624)
    with environment_kept():
        rows.select(range(4)).map(lambda batch: batch, batched=True, num_proc=2)
        assert os.environ is not environ
        assert inherited("TOKENIZERS_PARALLELISM") == "false"
    assert os.environ is environ


def inherited(name: str) -> str:
    """The variable as a new process started without an explicit environment sees it."""
    command = [sys.executable, "-c", f"import os; print(os.environ.get({name!r}))"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def test_pretokenized_rows_give_the_same_samples_and_batches(rows, tokenizer, fresh_cache):
    weighing = weigh_rows(rows, tokenizer, pretokenize=True)
    for index in (0, 7, 33):
        input_ids, labels = tokenize_conversation(
            rows[index]["texts"], len(rows[index]["images"]), tokenizer
        )
        assert weighing.tokens[index]["input_ids"] == input_ids.tolist()
        assert weighing.tokens[index]["labels"] == labels.tolist()
    samples = VQADataset(rows, tokenizer, image_size=16)
    config = PackingConfig(max_length=512, packs_per_batch=4)
    plain = list(PackedDataLoader(PackedDataset(samples, config=config), num_workers=0))
    fast = list(
        PackedDataLoader(PackedDataset(samples, config=config, pretokenize=True), num_workers=2)
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


def test_row_tokens_are_the_rows_tokens_across_chunks_slices_and_a_selection():
    """RowTokens slices the Arrow buffers itself: every row must read what datasets reads, in a
    table of several chunks, one of them a slice of a larger array (its offsets do not start at
    0), through an indices mapping (a select of the rows out of order), and with its two columns
    chunked differently."""
    generator = np.random.default_rng(0)
    lengths = generator.integers(0, 40, size=90)
    whole = Dataset.from_dict(
        {
            "input_ids": [generator.integers(0, 50_000, n).tolist() for n in lengths],
            "labels": [generator.integers(-100, 50_000, n).tolist() for n in lengths],
        },
        features=Features(TOKEN_FEATURES),
    )
    # select(range) of a contiguous run slices the table: the second chunk starts at row 30
    chunked = concatenate_datasets([whole.select(range(30)), whole.select(range(30, 90))])
    assert chunked.data.column("input_ids").num_chunks == 2
    assert chunked.data.column("input_ids").chunk(1).offset == 30
    shuffled = chunked.select(generator.permutation(90))
    # and the two columns cut in different places (a table put together column by column)
    ids, labels = (whole.select_columns([name]) for name in ("input_ids", "labels"))
    cut_apart = concatenate_datasets(
        [
            concatenate_datasets([ids.select(range(30)), ids.select(range(30, 90))]),
            concatenate_datasets([labels.select(range(50)), labels.select(range(50, 90))]),
        ],
        axis=1,
    )
    chunks = [cut_apart.data.column(name).chunk(0) for name in ("input_ids", "labels")]
    assert [len(chunk) for chunk in chunks] == [30, 50]
    for tokens in (chunked, shuffled, cut_apart):
        row_tokens = RowTokens(tokens)
        received = pickle.loads(pickle.dumps(row_tokens))  # as a spawned DataLoader worker
        for reader in (row_tokens, received):
            assert len(reader) == 90
            for row in range(90):
                input_ids, labels = reader[row]
                assert input_ids.tolist() == tokens[row]["input_ids"]
                assert labels.tolist() == tokens[row]["labels"]
    with pytest.raises(IndexError):
        RowTokens(chunked)[90]


def test_workers_receive_this_ranks_plan_not_every_rows_weights(rows, tokenizer, fresh_cache):
    dataset = PackedDataset(
        VQADataset(rows, tokenizer, image_size=16), config=PackingConfig(packs_per_batch=2)
    )
    expected = [
        batch["sample_index"].tolist() for batch in PackedDataLoader(dataset, num_workers=0)
    ]
    received = pickle.loads(pickle.dumps(dataset))
    assert received.weights is None and received._plan is None
    assert [
        b["sample_index"].tolist() for b in PackedDataLoader(received, num_workers=0)
    ] == expected


def two_nodes(tmp_path, caches: list) -> list[dict]:
    """torchrun twice on this machine, as two "nodes" of 1 rank each (--nnodes 2), each with its
    own cache folder (its own machine) holding the embedded dataset; returns what each rank
    weighed and ended with."""
    dataset = load_vqa_dataset(num_rows=300).cache_files[0]["filename"]
    for cache in caches:
        if not cache.exists():
            shutil.copytree(Path(dataset).parent, cache / Path(dataset).parent.name)
    port = str(29500 + os.getpid() % 1000)
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc-per-node",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                str(Path(__file__).parent / "weigh_on_two_nodes.py"),
                str(tmp_path / "out"),
            ],
            env={**os.environ, "MMDP_CACHE": str(cache)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node, cache in enumerate(caches)
    ]
    logs = [process.communicate(timeout=300)[0] for process in processes]
    assert all(process.returncode == 0 for process in processes), logs
    return [json.loads((tmp_path / f"out.{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow  # two torchrun jobs: about a minute on an idle 2-core machine
def test_two_nodes_weigh_half_each_and_end_with_the_same_weights(tmp_path):
    caches = [tmp_path / "node0", tmp_path / "node1"]
    cold = two_nodes(tmp_path, caches)
    assert [r["weighed"] for r in cold] == [150, 150]
    assert cold[0]["weights"] == cold[1]["weights"]
    # node 1 loses its cache: node 0 (warm) weighs nothing, node 1 weighs every row, no hang
    shutil.rmtree(caches[1])
    half_warm = two_nodes(tmp_path, caches)
    assert [r["weighed"] for r in half_warm] == [0, 300]
    assert half_warm[0]["weights"] == half_warm[1]["weights"] == cold[0]["weights"]


def test_a_truncated_or_edited_cache_is_weighed_again(rows, tokenizer, fresh_cache, capsys):
    first = weigh_rows(rows, tokenizer)
    saved = first.path / "weights.npz"
    saved.write_bytes(saved.read_bytes()[:100])  # truncated
    again = weigh_rows(rows, tokenizer)
    assert again.weighed_here and "do not match their checksum" in capsys.readouterr().out
    assert np.array_equal(again.weights.lengths, first.weights.lengths)
    (again.path / "manifest.json").write_text('{"rows": 1, "sha256": "edited"}')  # edited
    assert weigh_rows(rows, tokenizer).weighed_here


@pytest.fixture(scope="module")
def two_jobs():
    """Two new interpreters (spawn), as two jobs are: a fork of this pytest process, which has
    compiled kernels and started threads by now, once died abruptly in the slow group
    (BrokenProcessPool, fresh clone, 2026-11-26). Both tests below use the same two: each
    interpreter imports torch and transformers once (10-20 s of CPU)."""
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=spawn) as jobs:
        yield jobs


@pytest.mark.slow  # two processes, each importing mmdp
@pytest.mark.parametrize("pretokenize", [False, True])
def test_two_jobs_weighing_at_once_end_with_the_same_complete_weights(
    two_jobs, fresh_cache, pretokenize
):
    """Pre-tokenized, each job writes its tokens to a scratch folder of its own: when both used
    `KEY.map`, one job's start deleted the other's half-written tokens (FileNotFoundError in 1
    of 4 pairs, before mmdp.weighing.cache.scratch_path)."""
    done = list(two_jobs.map(weigh_in_a_new_process, [str(fresh_cache)] * 2, [pretokenize] * 2))
    assert done[0][2] != done[1][2]  # each job in a process of its own
    assert done[0][:2] == done[1][:2]
    assert len(list((fresh_cache / "weights").iterdir())) == 1  # one cache, no partial left


def weigh_in_a_new_process(cache: str, pretokenize: bool) -> tuple[list[int], list | None, int]:
    os.environ["MMDP_CACHE"] = cache
    from mmdp.data.reading.sources import load_vqa_dataset
    from mmdp.data.tokenizer import get_tokenizer

    weighed = weigh_rows(
        load_vqa_dataset(None, num_rows=300), get_tokenizer(), pretokenize=pretokenize
    )
    tokens = weighed.tokens["input_ids"] if pretokenize else None
    return weighed.weights.lengths.tolist(), tokens, os.getpid()
