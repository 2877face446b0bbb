"""The seed user's run, whole (slow group: torchrun launches of examples/trainer.py, gloo, CPU).

1. On 1, 2 and 3 ranks under a real Trainer (MMDPTrainer), TinyVLM for 2 epochs: every usable
   training row is trained exactly once per epoch (no row left out to equalise the ranks: a rank
   short of a batch trains a filler), each --log-samples line carries its batch's own epoch, and
   the eval split's exact eval_loss of the initial model is the same number on every rank count.
2. The seed user's command (docs/use-in-your-trainer.md), Qwen3-VL-MoE with LoRA on images and 24
   video clips, 3 epochs of grad-accum 16 on 2 ranks with a held-out split: every training row
   exactly 3 times, at least 60 video samples trained, and eval_loss reported.
3. The same command with Qwen3.5-MoE (its linear-attention layers on the CPU stand-ins of their
   kernels, tests/hybrid_kernels.py), smaller: every training row once per epoch, and the eval
   split's initial eval_loss on 2 ranks the same number as one process's.
"""

import json
import subprocess
import sys
from collections import Counter

import pytest
from conftest import REPO
from hybrid_kernels import linear_attention_kernels

from mmdp.flags import parse_flags
from mmdp.training.evaluation import evaluate
from mmdp.training.examples import TrainingSettings, make_eval_loader, make_loader, make_model

pytestmark = pytest.mark.slow

TINY = ["--num-rows", "40", "--num-train-epochs", "2", "--grad-accum", "2", "--eval-ratio", "0.25"]
SEED = [
    *("--model", "qwen3_vl_moe", "--lora", "--videos", "24", "--num-rows", "120"),
    *("--num-train-epochs", "3", "--grad-accum", "16", "--eval-ratio", "0.1"),
]
QWEN3_5 = [
    *("--model", "qwen3_5_moe", "--lora", "--videos", "6", "--num-rows", "40"),
    *("--num-train-epochs", "2", "--grad-accum", "4", "--eval-ratio", "0.25"),
]


def launch(out, world_size: int, flags: list[str], timeout: int) -> dict:
    """tests/torchrun_seed.py under torchrun; its files: (log lines, initial eval, result)."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(world_size), str(REPO / "tests" / "torchrun_seed.py"), str(out),
        *flags, "--num-workers", "1",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "find_unused_parameters" not in done.stderr  # DDP's warning: no unused parameter
    with open(out / "samples.jsonl") as f:
        lines = [json.loads(line) for line in f]
    read = lambda name: json.loads((out / f"{name}.json").read_text())  # noqa: E731
    return {"lines": lines, "initial_eval": read("initial_eval"), "result": read("result")}


def planned_rows(flags: list[str], world_size: int, epochs: int) -> list[list[int]]:
    """Each epoch's usable training rows, from the plan (the same on every rank)."""
    return [sorted(plan.rows.tolist()) for plan in plans(flags, world_size, epochs)]


def plans(flags: list[str], world_size: int, epochs: int) -> list:
    args = parse_flags(TrainingSettings, "", [*flags, "--output-dir", "-", "--num-workers", "0"])
    dataset = make_loader(args, rank=0, world_size=world_size)[0].dataset
    return [dataset.plan(epoch) for epoch in range(epochs)]


def check_every_row_once_per_epoch(run: dict, planned: list[list[int]]) -> None:
    for epoch, rows in enumerate(planned):
        trained = [
            r for line in run["lines"] if line["epoch"] == epoch for r in line["sample_index"]
        ]
        assert sorted(trained) == rows, epoch  # each planned row once, none missing, none twice
    assert {line["epoch"] for line in run["lines"]} == set(range(len(planned)))


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory) -> dict:
    return {w: launch(tmp_path_factory.mktemp(f"ranks{w}"), w, TINY, 900) for w in (1, 2, 3)}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_usable_row_is_trained_once_per_epoch_on_any_rank_count(tiny_runs, world_size):
    run = tiny_runs[world_size]
    planned = planned_rows(TINY, world_size, epochs=2)
    # 40 rows, 10 held out: 30 trained, or counted (over the examples' 256 tokens a pack)
    dropped = plans(TINY, world_size, epochs=1)[0].dropped
    assert len(planned[0]) + sum(dropped.values()) == 30 and set(dropped) <= {"too_long"}
    check_every_row_once_per_epoch(run, planned)
    steps = Counter((line["rank"], line["step"]) for line in run["lines"])
    assert len({rank for rank, _ in steps}) == world_size  # every rank trained
    args = parse_flags(TrainingSettings, "", [*TINY, "--output-dir", "-", "--num-workers", "0"])
    held_out = make_loader(args, rank=0, world_size=1)[0].dataset.eval_dataset().plan(0)
    assert run["result"]["evaluation"]["eval_samples"] == len(held_out.rows)  # each once


def test_the_initial_eval_loss_is_the_same_on_1_2_and_3_ranks(tiny_runs):
    losses = [tiny_runs[w]["initial_eval"]["eval_loss"] for w in (1, 2, 3)]
    tokens = {tiny_runs[w]["initial_eval"]["eval_label_tokens"] for w in (1, 2, 3)}
    print(f"initial eval_loss on 1, 2, 3 ranks: {losses}")
    assert len(tokens) == 1
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    assert losses[2] == pytest.approx(losses[0], rel=1e-6)


def test_the_seed_users_command_trains_every_row_3_times_with_videos_and_reports_eval_loss(
    tmp_path,
):
    run = launch(tmp_path, 2, SEED, 1800)
    planned = planned_rows(SEED, 2, epochs=3)
    check_every_row_once_per_epoch(run, planned)
    trained = Counter(r for line in run["lines"] for r in line["sample_index"])
    assert set(trained.values()) == {3} and len(trained) == len(planned[0])
    videos = sum(line["videos"] for line in run["lines"])
    print(f"{len(trained)} rows trained 3 times, {videos} video samples; {run['result']}")
    assert videos >= 60
    evaluation = run["result"]["evaluation"]
    assert evaluation["eval_samples"] == 144 - len(planned[0]) and evaluation["eval_loss"] > 0


def test_the_seed_users_command_with_qwen3_5_moe_trains_every_row_and_evaluates_exactly(tmp_path):
    """Qwen3.5-MoE with LoRA, images and videos, on 2 ranks: its batches laid out as one row with
    the sample bounds (mmdp.models.inputs.one_row) train every planned row once per epoch, and
    the eval split's initial eval_loss, each rank its share, is one process's to float32
    rounding (about 2 minutes on a busy 2-core machine)."""
    run = launch(tmp_path, 2, QWEN3_5, 900)
    check_every_row_once_per_epoch(run, planned_rows(QWEN3_5, 2, epochs=2))
    args = parse_flags(TrainingSettings, "", [*QWEN3_5, "--output-dir", "-", "--num-workers", "0"])
    loader, processor = make_loader(args, rank=0, world_size=1)
    with linear_attention_kernels():
        model, inputs = make_model(args, processor)
        one_process = evaluate(model, make_eval_loader(loader, args), inputs)
    print(f"initial eval on 2 ranks {run['initial_eval']}, in one process {one_process}")
    assert run["initial_eval"]["eval_label_tokens"] == one_process["eval_label_tokens"]
    assert run["initial_eval"]["eval_loss"] == pytest.approx(one_process["eval_loss"], rel=1e-6)
    assert run["result"]["evaluation"]["eval_samples"] == one_process["eval_samples"]


def test_the_examples_flags_are_the_commands():
    """The flags above parse as the examples' (a renamed flag fails here, not in a launch)."""
    for flags in (TINY, SEED, QWEN3_5):
        args = parse_flags(TrainingSettings, "", [*flags, "--output-dir", "-"])
        assert args.eval_ratio > 0
