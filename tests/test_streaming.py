"""Stage 5 from a stream (mmdp.loading.streaming): every row yielded once or counted,
ranks and workers without repeats, ranks that stop together, exact resume, and samples kept apart in
a pack.

The rows say who they are: row i's first question starts with "Row i:", so a test finds each row
in a batch by decoding it, whatever id the stream gave it.
"""

import json
import re
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import config_and_rest, tiny_vlm_losses
from datasets import Dataset, load_dataset
from doc_blocks import quoted_batch_keys

from mmdp.data.families.tiny import TinyFamily
from mmdp.data.reading.sources import FEATURES, load_vqa_dataset
from mmdp.drop_reasons import (
    HELD_WHEN_RANKS_STOPPED,
    NO_TEXTS,
    TOO_LONG,
    TOO_MANY_IMAGES,
    UNDECODABLE_IMAGE,
)
from mmdp.loading.streaming import (
    ReaderState,
    StreamingDataLoader,
    StreamingPackedDataset,
    in_turns,
)
from mmdp.models.inputs import model_inputs
from mmdp.packing.packers import STRATEGIES
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Weights
from mmdp.planning.planner import pack_buffer
from mmdp.report.pack_report import PackReport

IMAGE_SIZE = 16  # tiny images keep these tests fast; nothing here depends on the size
MAX_LENGTH = 512
MAX_IMAGES = 2  # the synthetic rows have 0 to 3 images: some are over this budget
NUM_ROWS = 150
STREAMING = "examples/pack_streaming.py"  # stage 5's packing, read as a stream


# Rows that say who they are ------------------------------------------------------------------


def numbered_rows(num_rows: int) -> list[dict]:
    """The embedded dataset's first rows, row i asking "Row i: ...", then two unusable rows."""
    rows = []
    for i, row in enumerate(load_vqa_dataset(num_rows=num_rows)):
        texts = [dict(turn) for turn in row["texts"]]
        texts[0]["user"] = f"Row {i}: {texts[0]['user']}"
        rows.append({"images": row["images"], "texts": texts})
    broken = {"bytes": b"not an image", "path": None}
    turn = {"user": f"Row {num_rows}: what is it?", "assistant": "A file.", "source": "test"}
    rows.append({"images": [broken], "texts": [turn]})  # dropped when its image is decoded
    rows.append({"images": [], "texts": []})  # no conversation
    return rows


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return numbered_rows(NUM_ROWS)


@pytest.fixture(scope="module")
def table(rows) -> Dataset:
    return Dataset.from_list(rows, features=FEATURES)


@pytest.fixture(scope="module")
def expected(rows, tokenizer) -> dict:
    """What an epoch must do with each row, found the slow way: tokenize it and decode its images."""
    used, dropped = set(), Counter()
    for i, row in enumerate(rows):
        sample = TinyFamily(tokenizer, image_size=IMAGE_SIZE).make_sample(row, i)
        if sample["drop_reason"] is not None:
            dropped[sample["drop_reason"]] += 1
        elif len(sample["input_ids"]) > MAX_LENGTH:
            dropped[TOO_LONG] += 1
        elif len(row["images"]) > MAX_IMAGES:
            dropped[TOO_MANY_IMAGES] += 1
        else:
            used.add(i)
    assert dropped[TOO_LONG] and dropped[TOO_MANY_IMAGES]  # the test data exercises each reason
    assert dropped[UNDECODABLE_IMAGE] == dropped[NO_TEXTS] == 1
    return {"used": used, "dropped": dropped}


def parquet_stream(table: Dataset, sizes: list[int], folder) -> Dataset:
    """The table as parquet files of `sizes` rows (one shard each), read with streaming=True."""
    files, start = [], 0
    for i, size in enumerate(sizes):
        path = folder / f"part-{i}.parquet"
        table.select(range(start, start + size)).to_parquet(str(path))
        files.append(str(path))
        start += size
    assert start == len(table)
    return load_dataset("parquet", data_files=files, split="train", streaming=True)


def streamed(rows, tokenizer, **kwargs) -> StreamingPackedDataset:
    defaults = {"max_length": MAX_LENGTH, "max_images": MAX_IMAGES, "packs_per_batch": 3}
    config, rest = config_and_rest(
        {**defaults, "buffer_size": 40, "image_size": IMAGE_SIZE, **kwargs}
    )
    return StreamingPackedDataset(rows, tokenizer, config=config, **rest)


def rows_in(batch: dict, tokenizer) -> list[int]:
    """The rows of a batch, in order, read from their text."""
    found = []
    for ids, real in zip(batch["input_ids"], batch["real_token_mask"]):
        found += [int(n) for n in re.findall(r"Row (\d+):", tokenizer.decode(ids[real]))]
    assert len(found) == len(batch["sample_index"])
    return found


def run_epoch(loader) -> tuple[list[dict], PackReport]:
    batches, report = [], PackReport()
    for batch in loader:
        batches.append(batch)
        report.add_batch(batch)
    report.dropped.update(loader.dropped_at_end)
    return batches, report


# 2-3. Packing one buffer, a pure function ------------------------------------------------------


def test_pack_buffer_worked_example():
    # lengths [3, 9, 6, 2, 5], budget 8, binpack: 9 is too long; FFD places 6 (new pack A),
    # 5 (no room in A: new pack B), 3 (A has 2 left, B has 3: the first with room is B),
    # 2 (A) -> A = rows [2, 3], B = rows [4, 0]
    packs, dropped = pack_buffer(
        Weights.from_lists([3, 9, 6, 2, 5], [0] * 5),
        np.random.default_rng(0),
        PackingConfig(max_length=8, max_images=0, strategy="binpack"),
    )
    assert sorted(sorted(p.tolist()) for p in packs) == [[0, 4], [2, 3]]
    assert dropped == {TOO_LONG: 1}


def test_pack_buffer_counts_each_reason_once():
    # row 0: no conversation (its length does not matter); row 1: 3 images, budget 2;
    # row 2: too long AND too many images: counted once, as too long
    weights = Weights.from_lists([0, 5, 20, 4, 4], [0, 3, 3, 1, 1], [NO_TEXTS] + [None] * 4)
    packs, dropped = pack_buffer(
        weights,
        np.random.default_rng(0),
        PackingConfig(max_length=8, max_images=2, strategy="greedy"),
    )
    assert dropped == {NO_TEXTS: 1, TOO_MANY_IMAGES: 1, TOO_LONG: 1}
    assert [sorted(p.tolist()) for p in packs] == [[3, 4]]  # 4 + 4 tokens, 1 + 1 images


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_pack_buffer_places_every_usable_row_once_under_both_budgets(strategy):
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 700, size=300)
    images = rng.integers(0, 5, size=300)
    problems = [NO_TEXTS if i % 37 == 0 else None for i in range(300)]
    weights = Weights.from_lists(lengths, images, problems)
    packs, dropped = pack_buffer(
        weights,
        np.random.default_rng(1),
        PackingConfig(max_length=512, max_images=3, strategy=strategy),
    )
    placed = np.concatenate(packs)
    usable = [i for i in range(300) if problems[i] is None and lengths[i] <= 512 and images[i] <= 3]
    assert sorted(placed.tolist()) == usable
    assert len(placed) + sum(dropped.values()) == 300
    assert all(lengths[p].sum() <= 512 and images[p].sum() <= 3 for p in packs)
    again, _ = pack_buffer(
        weights,
        np.random.default_rng(1),
        PackingConfig(max_length=512, max_images=3, strategy=strategy),
    )
    assert [p.tolist() for p in again] == [p.tolist() for p in packs]  # same buffer, same seed


def test_workers_take_turns_and_resume_in_the_same_order():
    def item(worker, n):
        return {"reader_state": ReaderState(worker), "n": n}

    def end(worker):
        return {"end_of_stream": True, "reader_state": ReaderState(worker, ended=True)}

    # the order a DataLoader delivers them in: worker 0, 1, 0, 1... and worker 1 ends first
    delivered = [item(0, "a"), item(1, "b"), item(0, "c"), end(1), item(0, "d"), end(0)]
    order = [x.get("n", "end") for x in in_turns(iter(delivered), 2, first=0)]
    assert order == ["a", "b", "c", "end", "d", "end"]
    # resumed after "a" (worker 1 is next), the workers again deliver from worker 0 first
    delivered = [item(0, "c"), item(1, "b"), item(0, "d"), end(1), end(0)]
    order = [x.get("n", "end") for x in in_turns(iter(delivered), 2, first=1)]
    assert order == ["b", "c", "end", "d", "end"]


# 1-4. An epoch over a stream -------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:a list has no shards")
@pytest.mark.parametrize(
    ("source", "workers"),
    [("list", 0), ("list", 2), ("to_iterable_dataset", 2), ("parquet", 2)],
)
@pytest.mark.docs  # its batches carry the keys the docs list
def test_epoch_yields_every_row_once_or_counts_it(
    source, workers, rows, table, expected, tokenizer, tmp_path
):
    stream = {
        "list": lambda: rows,
        "to_iterable_dataset": lambda: table.to_iterable_dataset(num_shards=4),
        "parquet": lambda: parquet_stream(table, [60, 20, 52, 20], tmp_path),
    }[source]()
    batches, report = run_epoch(StreamingDataLoader(streamed(stream, tokenizer), workers))
    found = [row for batch in batches for row in rows_in(batch, tokenizer)]
    assert sorted(found) == sorted(expected["used"])  # each usable row once
    assert report.dropped == expected["dropped"]  # each other row counted, by reason
    assert report.rows_read == len(rows)
    ids = [i for batch in batches for i in batch["sample_index"].tolist()]
    assert len(set(ids)) == len(ids)
    if source == "list":  # a plain iterable's ids are the rows' positions in it
        assert ids == found
    assert [b["batch_index"] for b in batches] == list(range(len(batches)))
    for worker in range(max(workers, 1)):  # only a worker's last batch may be short
        mine = [b for b in batches if b["reader_state"].worker == worker]
        assert all(len(b["samples_per_pack"]) == 3 for b in mine[:-1])
    # the keys of the docs' batch contract, and the streamed batches' own (tests/doc_blocks.py)
    quoted = quoted_batch_keys("tiny") | {"reader_state"}
    differ = sorted({key for b in batches for key in set(b) ^ quoted})
    assert not differ, f"a streamed batch and the docs' batch contract differ in {differ}"


def test_buffers_without_a_pack_still_report_their_drops(rows, tokenizer):
    """Buffers of 5 rows: the first two and the last hold only rows too long to pack. Their drops
    come with the next pack built, or after the last batch (loader.dropped_at_end)."""
    too_long = {"images": [], "texts": [{"user": "Q", "assistant": "w " * 600, "source": "t"}]}
    short = [row for row in rows if not row["images"]][:10]  # text-only rows, far under 512
    stream = [too_long] * 10 + short + [too_long] * 5
    loader = StreamingDataLoader(streamed(stream, tokenizer, buffer_size=5), num_workers=0)
    batches, report = run_epoch(loader)
    assert report.samples == 10 and report.dropped == {TOO_LONG: 15}
    assert batches[0]["dropped"] == {TOO_LONG: 10}  # buffers 0 and 1, with the first pack
    assert loader.dropped_at_end == {TOO_LONG: 5}  # buffer 4, after the last batch


def test_memory_is_the_buffer_not_the_stream(tokenizer):
    """Rows are read a buffer at a time: a stream that counts what was taken from it."""

    class CountingStream:
        def __init__(self, rows):
            self.rows, self.taken = rows, 0

        def __iter__(self):
            for row in self.rows:
                self.taken += 1
                yield row

    stream = CountingStream(numbered_rows(60))
    dataset = streamed(stream, tokenizer, buffer_size=25)
    first = next(iter(StreamingDataLoader(dataset, num_workers=0)))
    assert len(first["sample_index"]) > 0
    assert stream.taken == 25


@pytest.mark.parametrize(
    ("shards", "warns"),
    [
        (4, None),  # 2 shards per rank, 1 per worker
        (3, "every rank reads every row and keeps 1 in 2"),  # not a multiple of the ranks
        (1, "worker(s) per rank stay idle"),
        ("list", "reads every row and keeps 1 in 4"),
    ],
)
def test_ranks_and_workers_share_the_stream_without_repeats(
    shards, warns, rows, table, expected, tokenizer, recwarn
):
    stream = rows if shards == "list" else table.to_iterable_dataset(num_shards=shards)
    found, reports = [], []
    for rank in range(2):
        dataset = streamed(stream, tokenizer, rank=rank, world_size=2)
        batches, report = run_epoch(StreamingDataLoader(dataset, num_workers=2))
        found += [row for batch in batches for row in rows_in(batch, tokenizer)]
        reports.append(report)
    assert sorted(found) == sorted(expected["used"])  # no row twice, none lost
    merged = PackReport.merged(reports)
    assert merged.dropped == expected["dropped"] and merged.rows_read == len(rows)
    notes = [str(w.message) for w in recwarn.list if "too few shards" in str(w.message)]
    notes += [str(w.message) for w in recwarn.list if "has no shards" in str(w.message)]
    assert (warns is None) == (not notes)
    if warns:
        assert warns in notes[0]


def test_an_iterator_is_refused(rows, tokenizer):
    with pytest.raises(TypeError, match="can be read only once"):
        streamed(iter(rows), tokenizer)


def test_same_seed_same_batches_new_epoch_new_order(table, tokenizer):
    def epoch_rows(epoch, seed=0):
        loader = StreamingDataLoader(
            streamed(table.to_iterable_dataset(num_shards=2), tokenizer, seed=seed), num_workers=2
        )
        loader.set_epoch(epoch)
        return [b["sample_index"].tolist() for b in run_epoch(loader)[0]]

    first = epoch_rows(0)
    assert epoch_rows(0) == first
    other = epoch_rows(1)
    assert other != first and sorted(sum(other, [])) == sorted(sum(first, []))
    assert epoch_rows(0, seed=1) != first


# Resume --------------------------------------------------------------------------------------


# the default suite resumes the stream in 2 workers (the harder case: their turns resume too); in
# the main process with the slow group (uv run pytest -m slow)
@pytest.mark.parametrize("workers", [pytest.param(0, marks=pytest.mark.slow), 2])
def test_resume_mid_epoch_yields_exactly_the_rest(workers, table, tokenizer, tmp_path):
    def loader():
        stream = parquet_stream(table, [60, 20, 52, 20], tmp_path)
        return StreamingDataLoader(streamed(stream, tokenizer), num_workers=workers)

    epoch = run_epoch(loader())[0]
    full = [b["sample_index"].tolist() for b in epoch]
    full_inputs = [b["input_ids"] for b in epoch]
    held = []
    for cut in (1, 4, 9, len(full) - 1):
        interrupted = loader()
        seen = []
        for batch in interrupted:
            seen.append(batch["sample_index"].tolist())
            if len(seen) == cut:
                state = interrupted.state_dict()
                break
        held += [s["rows_held"] for s in state["reader_states"] if s is not None]
        # a checkpoint goes through torch.save
        torch.save(state, tmp_path / "state.pt")
        resumed = loader()
        resumed.load_state_dict(torch.load(tmp_path / "state.pt"))
        resumed.set_epoch(0)  # as a trainer does before every pass: the same epoch keeps its place
        rest = run_epoch(resumed)[0]
        assert seen + [b["sample_index"].tolist() for b in rest] == full, cut
        assert all(torch.equal(b["input_ids"], full_inputs[cut + i]) for i, b in enumerate(rest))
        assert [b["batch_index"] for b in rest] == list(range(cut, len(full)))
        if cut == 1:  # after the epoch the position resets: iterating again gives the whole epoch
            assert [b["sample_index"].tolist() for b in run_epoch(resumed)[0]] == full
    assert max(held) > 0  # some cuts were in the middle of a buffer, with packs left in it
    assert any(s is not None and s["buffer"] > 0 for s in state["reader_states"])


def test_resume_needs_the_same_workers_ranks_and_packing(table, tokenizer):
    stream = table.to_iterable_dataset(num_shards=2)
    loader = StreamingDataLoader(streamed(stream, tokenizer), num_workers=2)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(ValueError, match="num_workers 2 \\(now 1\\)"):
        StreamingDataLoader(streamed(stream, tokenizer), num_workers=1).load_state_dict(state)
    other_rank = streamed(stream, tokenizer, rank=1, world_size=2)
    with pytest.raises(ValueError, match="rank 0 \\(now 1\\)"):
        StreamingDataLoader(other_rank, num_workers=2).load_state_dict(state)
    other_buffer = streamed(stream, tokenizer, buffer_size=41)  # other buffers, other packs
    with pytest.raises(ValueError, match="buffer_size 40 \\(now 41\\)"):
        StreamingDataLoader(other_buffer, num_workers=2).load_state_dict(state)


# Ranks that stop together --------------------------------------------------------------------


def test_when_another_rank_runs_out_this_rank_counts_what_it_held(monkeypatch, rows, tokenizer):
    """Rank 1 of 2, told at step 5 that another rank has no batch: it stops after 4 batches, and
    counts the batch in hand and the rest of its workers' buffers."""
    steps = []

    def other_rank_runs_out_at_step_5(have_one, group=None, *timeout_and_step):
        steps.append(have_one)
        return have_one and len(steps) < 5

    monkeypatch.setattr(
        "mmdp.loading.streaming.all_ranks_have_a_batch",
        other_rank_runs_out_at_step_5,
    )
    dataset = streamed(rows, tokenizer, rank=1, world_size=2, buffer_size=20)
    loader = StreamingDataLoader(dataset, num_workers=2, stop_together=True)
    in_hand, count_held = [], loader.count_held

    def keep_the_batch_in_hand(batch):
        in_hand.append(batch)
        count_held(batch)

    monkeypatch.setattr(loader, "count_held", keep_the_batch_in_hand)
    batches, report = run_epoch(loader)
    assert len(batches) == 4 and len(in_hand) == 1
    held = loader.dropped_at_end[HELD_WHEN_RANKS_STOPPED]
    assert held > len(in_hand[0]["sample_index"]) > 0  # the batch in hand, and more
    # Rows read: every buffer a yielded batch (or the batch in hand) came from. Rank 1's readers
    # (2 ranks x 2 workers: readers 2 and 3 of 4) take the rows 2, 6, 10... and 3, 7, 11...
    share = [len(range(reader, len(rows), 4)) for reader in (2, 3)]
    states = [b["reader_state"] for b in batches + in_hand]
    last_buffer = [max(s.buffer for s in states if s.worker == w) for w in (0, 1)]
    assert report.rows_read == sum(min(20 * (b + 1), n) for b, n in zip(last_buffer, share))
    assert report.samples + sum(report.dropped.values()) == report.rows_read
    assert loader.state_dict()["reader_states"] == [None, None]  # the epoch is over


# The batches a model takes ---------------------------------------------------------------------


# Streamed batches have the planned ones' layout (mmdp.batch), which
# tests/test_attention.py checks under every attention implementation; two of them are enough here.
@pytest.mark.parametrize("attention", ["eager", "sdpa"], indirect=True)
def test_streamed_batches_keep_samples_apart(attention, rows, tokenizer):
    """The summed loss of a streamed batch equals that of its samples one at a time."""
    dataset = streamed(rows[:40], tokenizer, image_size=32, buffer_size=40)
    batch = next(iter(StreamingDataLoader(dataset, num_workers=0)))
    assert len(batch["pixel_values"]) >= 2 and len(batch["samples_per_pack"]) == 3
    assert set(model_inputs(batch)) - {"use_cache"} <= set(batch)
    packed, alone = tiny_vlm_losses(
        batch,
        lambda row: TinyFamily(tokenizer, image_size=32).make_sample(rows[row], row),
        tokenizer,
        attention,
    )  # a list's ids are the rows' positions
    assert abs(packed - alone) / alone < 1e-5


# examples/pack_streaming.py -------------------------------------------------------------------------


def test_pack_streaming_has_the_planned_report_keys(run_main, tmp_path):
    reports = {}
    for mode, script in (("planned", "examples/pack_planned.py"), ("streaming", STREAMING)):
        metrics = tmp_path / f"{mode}.json"
        figures = ["--out-dir", str(tmp_path)] if mode == "planned" else []  # stage 5 draws
        status, out, err = run_main(
            script, "--num-rows", "120", *figures, "--metrics-json", str(metrics)
        )
        assert status == 0, err
        reports[mode] = json.loads(metrics.read_text())
    planned, streaming = reports["planned"], reports["streaming"]
    # the same keys, but the planned run's weighing (a stream is weighed as it arrives)
    assert set(streaming) == set(planned) - {"weighing"}
    assert set(streaming["rank_balance"]) == set(planned["rank_balance"])
    assert streaming["samples"] + sum(streaming["dropped"].values()) == streaming["rows_read"]
    assert streaming["rows_read"] == 120
    assert HELD_WHEN_RANKS_STOPPED not in streaming["dropped"]  # one rank: nothing held
    assert streaming["samples"] == planned["samples"]  # the same rows made it, packed otherwise


def test_pack_streaming_says_when_nothing_is_left(run_main):
    status, _, err = run_main(STREAMING, "--num-rows", "40", "--max-length", "10")
    assert status == 2
    assert "nothing to do: none of the 40 rows read" in err.strip().splitlines()[-1]


# a torchrun job of 3 processes: the default suite checks ranks that stop together in one process
# (test_when_another_rank_runs_out_this_rank_counts_what_it_held)
@pytest.mark.slow
def test_pack_streaming_under_torchrun_unequal_shards(run_script, table, tmp_path):
    """2 ranks x 2 workers; rank 0 reads the parquet files 0 and 2 (112 rows), rank 1 the files
    1 and 3 (40 rows). Rank 1 runs out first: both stop at the same step, and what rank 0 still
    held is counted."""
    parquet_stream(table, [60, 20, 52, 20], tmp_path)
    metrics = tmp_path / "m.json"
    result = run_script(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        STREAMING,
        "--dataset",
        str(tmp_path),
        "--num-workers",
        "2",
        "--buffer-size",
        "30",
        "--packs-per-batch",
        "2",
        "--metrics-json",
        str(metrics),
        python_args=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(metrics.read_text())
    yielded = report["batches_per_rank_yielded"]
    assert len(yielded) == 2 and yielded[0] == yielded[1] > 0  # the same step on both ranks
    assert report["rank_balance"]["batches_per_rank"] == yielded
    rows = report["sample_index"]
    assert len(rows) == len(set(rows)) == report["samples"]
    assert report["samples"] + sum(report["dropped"].values()) == report["rows_read"]
    assert report["dropped"][HELD_WHEN_RANKS_STOPPED] > 0
    assert report["rows_read"] <= len(table)
