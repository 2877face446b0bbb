"""Use it in the trainer you already have: transformers' Trainer, accelerate, a plain torchrun loop.

Fast: the loaders refuse other loaders in one sentence (accelerator.prepare, accelerate's
skip_first_batches, torchdata's StatefulDataLoader, a plain DataLoader over an owned dataset);
how optimizer steps group the micro-batches, epoch after epoch; the sample log of a resumed
run; what MMDPTrainer checks and hands to Trainer.

Slow (`uv run pytest -m slow`; one torchrun launch for the three ways and the trainer matrix,
tests/torchrun_trainers.py):
each way's example under torchrun with 2 processes (tests/torchrun_checks.py): equal
micro-batch and step counts on both ranks, no sample twice and none missing over 2 epochs, the
gradient of 2 ranks x 2 micro-batches equal to one process's, and runs resumed from the
uninterrupted run's checkpoint in epoch 1 (saved while 2 workers read ahead), with 0 and 2
workers, equal to the run that never stopped.
"""

import importlib
import json
import os
import sys
from argparse import Namespace
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator, skip_first_batches
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader
from torchrun_checks import WAYS
from transformers import Trainer, TrainingArguments

from mmdp.batch import collate_packs
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import MissingExtra
from mmdp.flags import parse_flags
from mmdp.loading.guards import PREPARE_REFUSED, STATEFUL_REFUSED
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.loading.streaming import StreamingDataLoader, StreamingPackedDataset
from mmdp.packing.packing_config import PackingConfig
from mmdp.training.examples import SampleLog, TrainingSettings, make_loader, tiny_vlm
from mmdp.training.recipes import (
    EPOCH_END,
    batches_forever,
    check_launched_processes,
    load_loader_state,
    optimizer_steps,
    save_loader_state,
)
from mmdp.training.trainer import LoaderForTrainer, check_arguments, token_loss

IMAGE_SIZE = 16
CONFIG = PackingConfig(max_length=256, packs_per_batch=2)


@pytest.fixture(scope="module")
def samples(tokenizer):
    return VQADataset(load_vqa_dataset(num_rows=60), tokenizer, image_size=IMAGE_SIZE)


def planned(samples, num_workers=0, **kwargs):
    dataset = PackedDataset(samples, config=CONFIG, **kwargs)
    return PackedDataLoader(dataset, num_workers=num_workers)


def streamed(tokenizer, num_workers=0):
    rows = load_vqa_dataset(num_rows=20).to_iterable_dataset(num_shards=2)
    return StreamingDataLoader(
        StreamingPackedDataset(
            rows, tokenizer, config=PackingConfig(max_length=256), image_size=IMAGE_SIZE
        ),
        num_workers=num_workers,
    )


# The loaders refuse other loaders, in one sentence ------------------------------------------


def test_accelerator_prepare_refuses_our_loaders_in_one_sentence(samples, tokenizer):
    # accelerate reads loader._is_accelerate_prepared first (accelerate/accelerator.py:2715)
    accelerator = Accelerator(cpu=True)
    for loader in (planned(samples), streamed(tokenizer)):
        with pytest.raises(TypeError) as refused:
            accelerator.prepare(loader)
        assert str(refused.value) == PREPARE_REFUSED
        assert "prepare only the model and the optimizer" in PREPARE_REFUSED
        assert PREPARE_REFUSED.count(". ") == 0  # one sentence


# Negative controls: what accelerate and Trainer do to our batches without the refusal. A
# PackedDataset in a plain DataLoader (no PackedDataLoader owns it, so nothing refuses) is what
# Trainer(train_dataset=...) builds.


def plain(samples, **kwargs):
    dataset = PackedDataset(samples, config=CONFIG, **kwargs)
    return DataLoader(dataset, batch_size=2, collate_fn=collate_packs)


def test_without_the_refusal_accelerate_dispatch_cuts_every_tensor_to_the_batch_size(samples):
    # dispatch is the default for an IterableDataset (accelerate/data_loader.py:1117); each
    # tensor is then sliced to dim 0 of the first key (data_loader.py:930, find_batch_size in
    # accelerate/utils/operations.py:244-264), in one process too
    own = next(iter(plain(samples)))
    dispatched = next(iter(Accelerator(cpu=True).prepare(plain(samples))))
    assert len(own["cu_seq_lens_q"]) == 5 and len(own["pixel_values"]) == 4  # 2 packs, 4 samples
    assert len(dispatched["cu_seq_lens_q"]) == 2  # 2 of the 5 boundaries left
    assert len(dispatched["pixel_values"]) == 2  # 2 of the 4 images, without an error
    assert torch.equal(dispatched["input_ids"], own["input_ids"])  # the tokens still all there


def test_without_the_refusal_accelerate_shards_our_sharded_packs_again(samples):
    # dispatch_batches=False on 2 processes: IterableDatasetShard (accelerate/data_loader.py:1236)
    # keeps 1 pack in 2 of what rank 0's plan already gave rank 0
    own = [i for b in plain(samples, rank=0, world_size=2) for i in b["sample_index"].tolist()]
    prepared = prepare_data_loader(
        plain(samples, rank=0, world_size=2),
        num_processes=2,
        process_index=0,
        put_on_device=False,
        dispatch_batches=False,
    )
    trained = [i for b in prepared for i in b["sample_index"].tolist()]
    assert set(trained) < set(own) and len(trained) <= len(own) // 2 + 2


def test_without_mmdps_trainer_the_plain_trainer_strips_the_pack_keys(samples, tokenizer, tmp_path):
    # Trainer(train_dataset=PackedDataset): remove_unused_columns=True (the default) wraps the
    # collator to drop what model.forward does not name (transformers/trainer.py:1019-1022),
    # and the loader is prepared (trainer.py:1051), so dispatched as above
    model, _ = tiny_vlm(tokenizer, seed=0)
    dataset = PackedDataset(samples, config=CONFIG)
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to="none")
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collate_packs)
    with pytest.raises(KeyError):
        next(iter(trainer.get_train_dataloader()))


def first_batch(loader):
    """next(iter(loader)), the iterator's workers stopped as soon as it returns or raises. Left to
    the garbage collector, a failed iterator (held in a reference cycle by its error's traceback)
    may find its queues closed first: its workers then never hear they should stop, and each is
    killed only after torch's 5 s wait (dataloader.py:1652-1656). An iterator inside a generator
    (accelerate's skip_first_batches) is out of reach here and still waits (10 s in all)."""
    batches = iter(loader)
    try:
        return next(batches)
    finally:
        if hasattr(batches, "_shutdown_workers"):  # not with num_workers=0: nothing to stop
            batches._shutdown_workers()


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_other_dataloaders_over_an_owned_dataset_are_refused(samples, tokenizer, num_workers):
    loader = planned(samples, num_workers=num_workers)
    others = {
        # what Trainer's resume calls (accelerate/data_loader.py:1463-1466)
        "skip_first_batches": lambda: skip_first_batches(loader, 2),
        "a plain DataLoader": lambda: DataLoader(
            loader.dataset, batch_size=2, collate_fn=collate_packs, num_workers=num_workers
        ),
        "StatefulDataLoader": lambda: StatefulDataLoader(
            loader.dataset, batch_size=2, collate_fn=collate_packs, num_workers=num_workers
        ),
    }
    for other in others.values():
        with pytest.raises(RuntimeError, match="iterate the PackedDataLoader itself"):
            first_batch(other())
    stream = streamed(tokenizer, num_workers)
    with pytest.raises(RuntimeError, match="iterate the StreamingDataLoader itself"):
        first_batch(DataLoader(stream.dataset, batch_size=None, num_workers=num_workers))
    # and the loaders themselves still work after it
    assert len(list(loader)) == len(loader) and len(list(stream)) > 0


# with workers: slow group, as above (two workers started for one batch)
@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_statefuldataloader_cannot_save_a_packed_datasets_position(samples, num_workers):
    # torchdata saves the dataset's state_dict inside each worker (worker.py:46-52), where our
    # position never advances: a resume would restart the epoch. So the dataset has none.
    dataset = PackedDataset(samples, config=CONFIG)
    loader = StatefulDataLoader(
        dataset, batch_size=2, collate_fn=collate_packs, num_workers=num_workers
    )
    with pytest.raises((TypeError, RuntimeError), match="save PackedDataLoader.state_dict"):
        batches = iter(loader)
        next(batches)
        loader.state_dict()
    assert "StatefulDataLoader" in STATEFUL_REFUSED


# Optimizer steps, epoch after epoch ------------------------------------------------------------


class FakeLoader:
    """Epochs of `batches` integers (epoch e: 10 e, 10 e + 1, ...), resumable at `start`."""

    def __init__(self, batches: int, planned: bool = True, start: int = 0):
        self.batches, self.start = batches, start
        self.dataset = SimpleNamespace(epoch=0)
        if planned:
            self.dataset.num_batches = lambda: batches

    def __iter__(self):
        for b in range(self.start, self.batches):
            yield 10 * self.dataset.epoch + b
        self.start = 0

    def set_epoch(self, epoch):
        self.dataset.epoch = epoch


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def test_a_planned_epoch_ends_with_a_short_step_as_in_trainer():
    # 5 batches an epoch, 2 per step: steps of 2, 2 and 1 batches (transformers/trainer.py:1862-1873)
    steps = optimizer_steps(FakeLoader(5), grad_accum=2)
    assert take(steps, 6) == [[0, 1], [2, 3], [4], [10, 11], [12, 13], [14]]


def test_a_stream_runs_as_one_endless_pass_of_full_steps():
    steps = optimizer_steps(FakeLoader(5, planned=False), grad_accum=2)
    assert take(steps, 5) == [[0, 1], [2, 3], [4, 10], [11, 12], [13, 14]]


def test_the_loader_moves_to_its_next_epoch_before_the_short_step_is_yielded():
    loader = FakeLoader(5)
    steps = optimizer_steps(loader, grad_accum=2)
    take(steps, 3)  # the short step [4]: a checkpoint now must say "epoch 1, from its start"
    assert loader.dataset.epoch == 1


def test_a_pass_resumed_at_its_very_end_goes_on_with_the_next_epoch():
    # a checkpoint after the epoch's last full step: the resumed pass has nothing left
    loader = FakeLoader(4, start=4)
    assert take(optimizer_steps(loader, grad_accum=2), 2) == [[10, 11], [12, 13]]
    assert list(batches_forever(FakeLoader(0))) == []  # no data: it ends
    assert list(batches_forever(FakeLoader(0), epoch_ends=True)) == [EPOCH_END, EPOCH_END]


# Checkpoints and the sample log ---------------------------------------------------------------


def test_the_loader_state_goes_to_one_file_per_rank_and_comes_back(samples, tmp_path):
    loader = planned(samples)
    batches = iter(loader)
    take(batches, 3)
    save_loader_state(loader, str(tmp_path), rank=1)
    assert os.listdir(tmp_path) == ["mmdp_loader_state_rank1.pt"]
    resumed = planned(samples)
    load_loader_state(resumed, str(tmp_path), rank=1)
    assert resumed.state_dict() == loader.state_dict()
    assert (resumed.state_dict()["epoch"], resumed.state_dict()["batches_done"]) == (0, 3)
    with pytest.raises(FileNotFoundError, match="no mmdp loader state for rank 0"):
        load_loader_state(resumed, str(tmp_path), rank=0)


def test_a_resumed_sample_log_drops_the_steps_after_its_checkpoint(tmp_path):
    path = str(tmp_path / "samples.jsonl")
    batch = {"sample_index": torch.tensor([3, 1]), "epoch": 4}
    log = SampleLog(path, rank=0, video_rows={1, 7})
    for step in (1, 2, 3):
        log.write(step, 0, batch)
    SampleLog(path, rank=0, resumed_step=2)  # the run stopped after step 3, resumes from 2
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    line = {"rank": 0, "micro_step": 0, "epoch": 4, "sample_index": [3, 1], "videos": 1}
    assert lines == [{**line, "step": step} for step in (1, 2)]


# What MMDPTrainer hands to Trainer ---------------------------------------------------------------


def test_trainer_sees_one_endless_pass_whose_epochs_end_in_whole_steps(samples, tokenizer):
    loader = planned(samples)
    view = LoaderForTrainer(loader, grad_accum=2)
    with pytest.raises(TypeError, match="max_steps"):  # Trainer runs max_steps as one pass
        len(view)
    batches = loader.dataset.num_batches()
    first_epoch = take(iter(view), batches + batches % 2)
    assert [b.get("filler", False) for b in first_epoch].count(True) == batches % 2
    assert loader.dataset.epoch == 1  # moved on before the filler: a checkpoint resumes there
    with pytest.raises(TypeError, match="max_steps"):
        len(LoaderForTrainer(streamed(tokenizer)))


def test_trainer_arguments_that_break_resume_or_the_loss_are_refused(samples):
    loader = planned(samples, rank=0, world_size=2)
    good = Namespace(
        ignore_data_skip=False, average_tokens_across_devices=True, world_size=2, n_gpu=0,
        eval_strategy="no", max_steps=4, num_train_epochs=1.0,
    )  # fmt: skip
    check_arguments(good, loader, replicas=2)
    with pytest.raises(ValueError, match="ignore_data_skip"):
        check_arguments(Namespace(**{**vars(good), "ignore_data_skip": True}), loader, 2)
    with pytest.raises(ValueError, match="average_tokens_across_devices"):
        check_arguments(
            Namespace(**{**vars(good), "average_tokens_across_devices": False}), loader, 2
        )
    # Trainer on a CPU-only machine without use_cpu=True runs each process alone
    with pytest.raises(ValueError, match="use_cpu=True"):
        check_arguments(Namespace(**{**vars(good), "world_size": 1}), loader, replicas=1)


def test_processes_that_would_train_alone_are_refused(monkeypatch):
    # torchrun started 2 processes; accelerate on a CPU-only machine without cpu=True runs each
    # alone (accelerate/state.py:769-813), and so does Trainer without use_cpu=True
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="Accelerator\\(cpu=True\\)"):
        check_launched_processes(1)
    check_launched_processes(2)


def test_token_loss_is_the_summed_loss_over_the_steps_label_tokens():
    torch.manual_seed(0)
    logits = torch.randn(1, 4, 7)
    labels = torch.tensor([[-100, 2, 5, 1]])
    # positions 0-2 predict labels 2, 5, 1; mean over the 3 would divide by 3, the step has 12
    expected = torch.nn.functional.cross_entropy(logits[0, :3], labels[0, 1:], reduction="sum")
    assert torch.allclose(
        token_loss({"logits": logits}, labels, num_items_in_batch=12), expected / 12
    )
    with pytest.raises(ValueError, match="labels"):
        token_loss({"logits": logits}, labels)


def test_the_examples_loader_shards_by_the_rank_it_is_given():
    args = parse_flags(
        TrainingSettings,
        "",
        ["--output-dir", "-", "--num-rows", "52", "--max-length", "256", "--num-workers", "0"],
    )
    ranks = [make_loader(args, rank=r, world_size=2)[0] for r in (0, 1)]
    assert [len(loader) for loader in ranks] == [5, 5]


# Each way under torchrun, 2 processes ----------------------------------------------------------

STEPS_PER_EPOCH = 3  # 5 batches per rank and epoch, 2 per step: 2, 2, 1 (torchrun_checks.py)


@pytest.fixture(scope="module", params=WAYS)
def checked(request, trainers_under_torchrun):
    """(way, its folder, its results) from tests/torchrun_trainers.py's launch (conftest.py)."""
    out = trainers_under_torchrun / "checks" / request.param
    with open(out / "results.json") as f:
        return request.param, out, json.load(f)


def read_log(path) -> list[dict]:
    """A --log-samples file, in (rank, step, micro-step) order: ranks append concurrently."""
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    return sorted(lines, key=lambda x: (x["rank"], x["step"], x["micro_step"]))


@pytest.mark.slow
def test_each_way_trains_every_planned_sample_once_per_epoch_and_resumes_exactly(checked):
    way, out, results = checked
    uninterrupted = read_log(out / "uninterrupted.jsonl")

    # the same micro-batches and steps on both ranks (a rank waiting for the other would have
    # hit the process group's timeout)
    per_rank = [
        [(x["step"], x["micro_step"]) for x in uninterrupted if x["rank"] == r] for r in (0, 1)
    ]
    assert per_rank[0] == per_rank[1]
    assert [m for _, m in per_rank[0]] == [0, 1, 0, 1, 0, 0, 1, 0, 1, 0]  # 2, 2, 1 per epoch

    # over both ranks, each epoch trains every row of its plan once: no repeat, none missing
    args = parse_flags(
        TrainingSettings,
        "",
        ["--output-dir", "-", "--num-rows", "52", "--max-length", "256", "--num-workers", "0"],
    )
    dataset = make_loader(args, rank=0, world_size=2)[0].dataset
    for epoch in (0, 1):
        steps = range(epoch * STEPS_PER_EPOCH + 1, (epoch + 1) * STEPS_PER_EPOCH + 1)
        rows = [i for x in uninterrupted if x["step"] in steps for i in x["sample_index"]]
        plan = dataset.plan(epoch)
        assert sorted(rows) == sorted(plan.rows.tolist()), epoch
        assert len(rows) + sum(plan.dropped.values()) == 52  # the rest is counted as dropped

    # resumed from step 4's checkpoint (epoch 1, written while 2 workers read ahead), with 0
    # and 2 workers: the same stream of samples and the same weights
    runs = results["runs"]
    for workers in (0, 2):
        name = f"resumed_{workers}_workers"
        resumed = read_log(out / f"{name}.jsonl")
        # the first 4 steps' lines kept from the copy, steps 5 and 6 written by the resumed run
        assert resumed == uninterrupted, (way, workers)
        assert runs[name]["step"] == 6
        assert runs[name]["digest"] == runs["uninterrupted"]["digest"], (way, workers)
        assert runs[name]["loss"] == pytest.approx(runs["uninterrupted"]["loss"], rel=1e-6)


@pytest.mark.slow
def test_each_ways_gradient_is_one_process_gradient_and_the_per_batch_mean_is_not(checked):
    way, _, results = checked
    gradients = results["gradients"]  # relative difference to one process on the same batches
    if way == "trainer":
        assert gradients["token_loss"] <= 1e-5
        # Qwen2.5-VL and Qwen3-VL set accepts_loss_kwargs=False: token_loss holds all the same
        assert gradients["token_loss_no_loss_kwargs"] <= 1e-5
        assert gradients["per_micro_batch_mean_no_loss_kwargs"] > 1e-2
    else:
        assert gradients["recipe"] <= 1e-5
        assert gradients["per_micro_batch_mean"] > 1e-2
    if way == "torchrun":
        assert gradients.get("fsdp2_recipe", 1.0) <= 1e-5, gradients.get("fsdp2_error")
        # data-parallel groups of one process each: both are rank 0 of 1 and read the same
        assert gradients["group_rank_and_size"] == [0, 1]
        assert gradients["groups_read_the_same_batches"]


@pytest.mark.slow
def test_accelerate_refuses_our_loaders_on_both_ranks_without_a_hang(checked):
    way, _, results = checked
    if way != "accelerate":
        pytest.skip("accelerate only")
    for said in results["gradients"]["refusals_per_rank"]:  # both ranks got past the refusals
        assert said["prepare"] == f"TypeError: {PREPARE_REFUSED}"
        assert said["prepare_stream"] == f"TypeError: {PREPARE_REFUSED}"
        # accelerate's own wrappers, as prepare_data_loader builds them: dispatcher, shard
        for wrapper in ("dispatched", "sharded"):
            assert said[wrapper].startswith("RuntimeError: this PackedDataset belongs to")


@pytest.mark.slow
def test_trainer_on_a_stream_resumes_exactly_across_stream_epochs(checked):
    way, _, results = checked
    if way != "trainer":
        pytest.skip("Trainer only")
    for stream in results["stream_per_rank"]:
        uninterrupted, resumed = stream["uninterrupted"], stream["resumed"]
        assert uninterrupted["stream_epoch"] >= 2  # 8 steps ran through several stream epochs
        assert len(uninterrupted["seen"]) == 16  # 8 steps of 2 micro-batches, on each rank
        # resumed at step 5: the micro-batches of steps 6-8, exactly
        assert resumed["seen"] == uninterrupted["seen"][2 * stream["resumed_at"] :]
        assert resumed["digest"] == uninterrupted["digest"]


def test_mmdp_trainer_without_accelerate_is_one_sentence_at_its_import(monkeypatch):
    """Without accelerate, transformers' Trainer imports, and fails later in TrainingArguments
    with its own install line; mmdp.training.trainer says which extra, when imported. (Here
    transformers.trainer was imported with accelerate, as this file's imports show; in a fresh
    process where accelerate is not installed, the same sentence ends examples/trainer.py.)"""
    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate fails
    monkeypatch.delitem(sys.modules, "mmdp.training.trainer", raising=False)  # imported again
    with pytest.raises(MissingExtra, match="MMDPTrainer .* needs accelerate, which mmdp's "
                       "accelerate extra installs"):  # fmt: skip
        importlib.import_module("mmdp.training.trainer")
