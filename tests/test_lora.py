"""LoRA through MMDPTrainer: a PEFT-wrapped tiny Qwen2.5-VL (the real class, random weights).

- only the adapter's weights train: the base model's are the same after a step;
- the packed step's gradient is the unpacked reference's for every adapter weight, the vision
  tower's adapters included (tests/torchrun_matrix.py), and a per-micro-batch mean is not;
- a run stopped at a checkpoint and resumed ends with the uninterrupted run's adapter weights
  and trains the same samples after the checkpoint: Trainer reloads the adapter
  (transformers/trainer.py:3700-3720), MMDPTrainer the loader's state.
"""

import copy
import dataclasses

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torchrun_matrix import TOLERANCE, Case, family_case, make_loader, measure_case
from transformers import TrainingArguments

from mmdp.data.reading.sources import FEATURES, load_synthetic_videos, with_videos
from mmdp.data.vqa_dataset import VQADataset
from mmdp.training.examples import EXPERT_PARAMETERS
from mmdp.training.trainer import MMDPTrainer

# The language model's query and value projections and the vision tower's fused qkv
# (Qwen2.5-VL's names). init_lora_weights=False: B is random, not 0, so A has a gradient too.
LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "qkv"],
                  init_lora_weights=False)  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def lora_case():
    """The matrix's Qwen2.5-VL case, its model wrapped by PEFT."""
    case = family_case("qwen2_5_vl")
    torch.manual_seed(0)
    model = get_peft_model(copy.deepcopy(case.model), LORA)
    return dataclasses.replace(case, name="qwen2_5_vl_lora", model=model)


def new_model(case):
    return copy.deepcopy(case.model)


def test_only_the_adapter_trains_and_its_gradient_is_the_unpacked_one(lora_case, tmp_path):
    trained = {n for n, p in lora_case.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in name for name in trained)
    assert any("visual" in name for name in trained)

    result = measure_case("trainer", lora_case, grad_accum=2, out=str(tmp_path))
    print(f"LoRA under MMDPTrainer: {result['exact']:.1e}, control {result['control']:.1e}")
    assert result["exact"] <= TOLERANCE and result["exact_vision"] <= TOLERANCE
    assert result["control"] > 1e-4

    # one real step (lr > 0): the base weights stay, the adapter's move
    model = new_model(lora_case)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    run(lora_case, model, tmp_path / "one_step", max_steps=1)
    for name, parameter in model.named_parameters():
        moved = not torch.equal(before[name], parameter.detach())
        assert moved == (name in trained), name


def run(case, model, out, max_steps: int, resume: str | None = None) -> list[list[int]]:
    """MMDPTrainer on the case's loader (1 process, 2 micro-batches a step, a checkpoint every
    step): the rows of every micro-batch trained."""
    seen = []

    class Seen(MMDPTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            seen.append(inputs["sample_index"].tolist())
            return super().training_step(model, inputs, num_items_in_batch)

    args = TrainingArguments(
        output_dir=str(out), max_steps=max_steps, gradient_accumulation_steps=2, save_steps=1,
        learning_rate=1e-2, lr_scheduler_type="constant", use_cpu=True, report_to="none",
        disable_tqdm=True,
    )  # fmt: skip
    trainer = Seen(model=model, args=args, train_loader=make_loader(case, 0, 1),
                   model_inputs=case.inputs)  # fmt: skip
    trainer.train(resume_from_checkpoint=resume)
    return seen


def adapter_weights(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_a_resumed_lora_run_restores_the_adapter_and_the_loader(lora_case, tmp_path):
    uninterrupted_model = new_model(lora_case)
    uninterrupted = run(lora_case, uninterrupted_model, tmp_path / "uninterrupted", max_steps=3)

    stopped = run(lora_case, new_model(lora_case), tmp_path / "resumed", max_steps=1)
    resumed_model = new_model(lora_case)  # the adapter as initialised: the checkpoint's must load
    resumed = run(
        lora_case, resumed_model, tmp_path / "resumed", max_steps=3,
        resume=str(tmp_path / "resumed" / "checkpoint-1"),
    )  # fmt: skip

    assert stopped == uninterrupted[:2] and resumed == uninterrupted[2:]
    expected, got = adapter_weights(uninterrupted_model), adapter_weights(resumed_model)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    # and not by chance: the adapter did move from its initial weights
    initial = adapter_weights(lora_case.model)
    assert any(not torch.equal(initial[name], expected[name]) for name in expected)


@pytest.mark.slow  # the tiny mixture of experts, each sample alone and packed: about a minute
def test_a_lora_moe_step_with_videos_is_the_unpacked_gradient(tmp_path):
    """The seed user's model, as examples/trainer.py --lora builds it (adapters on every linear
    layer and on the experts' 3-D weights), on images and videos: one MMDPTrainer step over the
    whole epoch equals each sample run alone for every adapter weight (the experts' and the
    vision tower's included), and a per-micro-batch mean does not."""
    matrix = family_case("qwen3_vl_moe")
    images = matrix.samples.dataset.select(range(8)).cast(FEATURES)  # the synthetic rows' types
    rows = with_videos(images, load_synthetic_videos(4))
    samples = VQADataset(rows, matrix.samples.family.processor)
    lengths = samples.family.weigh(rows["texts"], rows["images"], rows["videos"])[0]
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                        target_parameters=EXPERT_PARAMETERS, init_lora_weights=False)  # fmt: skip
    model = get_peft_model(copy.deepcopy(matrix.model), config)
    case = Case("qwen3_vl_moe_lora_videos", samples, model, matrix.inputs, 2 * max(lengths))
    trained = [name for name, p in model.named_parameters() if p.requires_grad]
    assert any("experts" in name for name in trained) and any("visual" in name for name in trained)
    batches = list(make_loader(case, 0, 1))
    assert sum(len(b.get("video_grid_thw", ())) for b in batches) == 4  # every clip in the step
    result = measure_case("trainer", case, grad_accum=len(batches), out=str(tmp_path))
    print(f"LoRA'd MoE with videos: {result['exact']:.1e}, control {result['control']:.1e}")
    assert result["samples"] == len(rows)
    assert result["exact"] <= TOLERANCE and result["exact_vision"] <= TOLERANCE
    assert result["control"] > 1e-4
