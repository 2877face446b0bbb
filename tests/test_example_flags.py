"""The examples' model and epoch flags (src/mmdp/training/examples.py): --model FAMILY builds the
family's real transformers class, --model-path without the Hub ends in one sentence, and
--num-train-epochs N trains every usable row exactly N times. The sentences name the flags of the
script that was run: the examples have --model-path, stage 5 --processor."""

import importlib.util
import socket
from collections import Counter

import pytest
from conftest import REPO

from mmdp.data.families import PROCESSOR_HINT, load_processor
from mmdp.errors import UserError, exit_on_user_error
from mmdp.flags import parse_flags
from mmdp.training.examples import (
    MODEL_PATH_HINT,
    TrainingSettings,
    make_loader,
    make_model,
    make_processor,
    training_steps,
)
from mmdp.training.recipes import optimizer_steps


def flags(*argv: str):
    return parse_flags(TrainingSettings, "", ["--output-dir", "-", "--num-workers", "0", *argv])


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
    assert "run without --model-path" in said and "--processor" not in said  # the example's flags


@pytest.mark.parametrize(
    ("hint", "flag"), [(MODEL_PATH_HINT, "--model-path"), (PROCESSOR_HINT, "--processor")]
)
def test_a_name_missing_from_the_cache_under_hf_hub_offline_is_one_sentence(
    monkeypatch, hint, flag
):
    """With HF_HUB_OFFLINE=1 the Hub is not asked and the local cache misses: transformers'
    OSError says so over two lines; the user reads one sentence naming the flag to drop.
    huggingface_hub reads the variable once, at import (constants.py), so its copy is set too."""
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("offline: nothing may connect")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("HF_HUB_CACHE", str(REPO / "no-such-cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(REPO / "no-such-cache"))
    with pytest.raises(UserError) as refused:
        load_processor("Qwen/Qwen2.5-VL-3B-Instruct", hint=hint)
    said = str(refused.value)
    assert "\n" not in said and said.count(". ") == 0
    assert "not in the local Hugging Face cache, and HF_HUB_OFFLINE is set" in said
    assert said.endswith(hint) and f"run without {flag}" in said


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
        args = parse_flags(TrainingSettings, "", ["--output-dir", "-", "--num-rows", "4", *argv])
        make_model(args, make_loader(args, rank=0, world_size=1)[1])
    assert exited.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in said
