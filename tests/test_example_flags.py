"""The examples' model and epoch flags (src/mmdp/training/examples.py): --model FAMILY builds the
family's real transformers class, --model-path without the Hub ends in one sentence, and
--num-train-epochs N trains every usable row exactly N times."""

import importlib.util
from collections import Counter

import pytest
from conftest import REPO

from mmdp.errors import exit_on_user_error
from mmdp.training.examples import (
    make_loader,
    make_model,
    make_processor,
    training_flags,
    training_steps,
)
from mmdp.training.recipes import optimizer_steps


def flags(*argv: str):
    return training_flags("").parse_args(["--output-dir", "-", "--num-workers", "0", *argv])


def test_num_train_epochs_trains_every_usable_row_once_per_epoch():
    args = flags("--num-rows", "20", "--num-train-epochs", "3", "--grad-accum", "2")
    loader, _ = make_loader(args, rank=0, world_size=1)
    steps = optimizer_steps(loader, args.grad_accum)
    trained = Counter()
    for _ in range(training_steps(args, loader)):
        trained.update(row for batch in next(steps) for row in batch["sample_index"].tolist())
    usable = {row for epoch in range(3) for row in loader.dataset.plan(epoch).rows.tolist()}
    assert trained == {row: 3 for row in usable}
    # and nothing of epoch 2 is left: the loader stands at its end, or at epoch 3's start
    dataset = loader.dataset
    assert (dataset.epoch, dataset.batches_done) in ((2, dataset.num_batches()), (3, 0))
    assert training_steps(flags("--max-steps", "5", "--num-train-epochs", "3"), loader) == 5


def test_model_qwen3_vl_moe_is_the_seed_users_class():
    args = flags("--model", "qwen3_vl_moe", "--num-rows", "4")
    loader, processor = make_loader(args, rank=0, world_size=1)
    model, inputs = make_model(args, processor)
    assert type(model).__name__ == "Qwen3VLMoeForConditionalGeneration" and model.training
    assert type(processor).__name__ == "Qwen3VLProcessor"
    assert inputs(next(iter(loader)), model)["use_cache"] is False


def test_model_path_without_the_hub_ends_in_one_sentence(monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    spec = importlib.util.spec_from_file_location("example_trainer", REPO / "examples/trainer.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    argv = ["--output-dir", "-", "--model-path", "Qwen/Qwen2.5-VL-3B-Instruct"]
    with pytest.raises(SystemExit) as exited, exit_on_user_error():
        example.main(argv)
    assert exited.value.code == 2
    said = capsys.readouterr().err.strip()
    assert said.count("\n") == 0 and said.startswith("error: processor 'Qwen/Qwen2.5-VL-3B")
    assert "out of reach" in said


def test_lora_puts_adapters_on_the_language_model_the_vision_tower_and_the_experts():
    args = flags("--model", "qwen3_vl_moe", "--lora", "--num-rows", "4")
    model, _ = make_model(args, make_processor(args))
    trained = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in name for name in trained)
    for part in ("language_model", "visual", "mlp.experts"):  # the experts' 3-D weights too
        assert any(part in name for name in trained), part


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--videos", "2"), "--videos: the tiny family takes no video"),
        (("--lora",), "--lora needs a transformers model"),
        (("--eval-ratio", "1"), "must be at least 0 and below 1"),
    ],
)
def test_flags_that_cannot_apply_are_one_sentence(argv, says, capsys):
    with pytest.raises(SystemExit) as exited, exit_on_user_error():
        args = training_flags("").parse_args(["--output-dir", "-", "--num-rows", "4", *argv])
        make_model(args, make_loader(args, rank=0, world_size=1)[1])
    assert exited.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in said
