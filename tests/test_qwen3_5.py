"""Qwen3.5 and Qwen3.5-MoE packed exactly: hybrid models whose linear-attention layers (Gated
DeltaNet: a causal conv of 4 taps, then a state carried along the row) restarting positions and
masks do not keep apart. Only their kernels do, given the sample bounds: flash-linear-attention's
chunk_gated_delta_rule (cu_seqlens, one row) and causal-conv1d's causal_conv1d_fn (seq_idx).

On CPU the kernels are stand-ins that keep samples apart only when handed the bounds
(tests/hybrid_kernels.py, installed through transformers' own resolution). Through
`model_inputs(batch, model)` every sample of a batch of 2 packs gets the logits, loss and gradient
it has alone, under eager and sdpa, and the MoE its router term over the real tokens; without
the kernels the model is refused in one sentence before any step. tests/test_families.py, where
qwen3_5 is one of the families, checks the weights against the processor's and holds the traps:
no seq_idx, no cu_seqlens (the samples mix: the negative controls), 3-row positions.
"""

import pytest
import torch
from conftest import two_packs_of_three
from hybrid_kernels import CAUSAL_CONV1D, linear_attention_kernels, package
from test_families import ROWS, alone_inputs, cell, turn
from test_loss import gradients, padded
from test_video import HELD_OUT
from test_video import (
    test_video_weight_is_the_processed_length_and_the_processors_own_inputs as check_video_weight,
)
from transformers.models.qwen3_5 import modeling_qwen3_5

from mmdp.batch import sample_ids
from mmdp.data.families import family_for, offline_processor, tiny_processor
from mmdp.data.families.qwen_vl import Qwen3_5, Qwen3VL
from mmdp.errors import UserError
from mmdp.models.inputs import model_inputs
from mmdp.models.tiny import tiny_model
from mmdp.training.loss import batch_loss, summed_loss


@pytest.fixture(scope="module")
def family():
    return family_for(tiny_processor("qwen3_5"))


@pytest.fixture(scope="module")
def batch(family):
    """test_families' six samples (images of several sizes, a text-only one, a 2-image one, a
    2-turn one) in two packs of three, a padding tail in each."""
    samples = [family.make_sample(row, i) for i, row in enumerate(ROWS)]
    return two_packs_of_three(family, samples), samples


@pytest.fixture
def kernels():
    """The CPU stand-ins of both kernels, installed for one test."""
    with linear_attention_kernels():
        yield


def packed_logits(model, batch: dict, inputs: dict) -> list[torch.Tensor]:
    """Each sample's logits in the packed batch, in sample order (the model's one row read as
    the batch's [B, L] rows)."""
    with torch.no_grad():
        logits = model(**{"use_cache": False, **inputs}).logits.view(*batch["input_ids"].shape, -1)
    owner = sample_ids(batch)
    return [logits[owner == i] for i in owner.unique().tolist() if i >= 0]


def alone_logits(family, model, samples) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(**alone_inputs(family, s), use_cache=False).logits[0] for s in samples]


def worst(packed: list[torch.Tensor], alone: list[torch.Tensor]) -> float:
    """The largest relative difference of any sample's logits, to that sample's largest logit."""
    return max(float((p - a).abs().max() / a.abs().max()) for p, a in zip(packed, alone))


# Without the kernels: refused, before any step -----------------------------------------------


def test_without_the_kernels_a_hybrid_model_is_refused_in_one_sentence(family, batch):
    """transformers resolved its own torch code when it imported the model's module (no package
    installed here): called with the bounds it raises from inside the layer
    (integrations/hub_kernels.py:1033-1040), called without them it mixes the samples, silently.
    model_inputs refuses first, in one sentence naming both packages."""
    batch, samples = batch
    model = tiny_model(family.processor)
    with pytest.raises(UserError) as refused:
        model_inputs(batch, model)
    said = str(refused.value)
    assert "flash-linear-attention" in said and "causal-conv1d" in said and ". " not in said
    rows = {"input_ids", "labels", "position_ids", "mm_token_type_ids", "pixel_values"}
    plain = {key: value for key, value in batch.items() if key in rows | {"image_grid_thw"}}
    with pytest.raises(ValueError, match="can't keep packed sequences apart"):
        model(**plain, cu_seq_lens_q=batch["cu_seq_lens_q"], use_cache=False)
    # positions alone: attention is kept apart, the linear layers are not
    error = worst(packed_logits(model, batch, plain), alone_logits(family, model, samples))
    print(f"transformers' torch code, no bounds: worst relative logit difference {error:.1e}")
    assert error > 1e-3


def test_a_qwen3_5_batch_without_its_model_is_refused(family, batch, kernels):
    """Without the model model_inputs cannot lay the batch out as one row nor give the conv its
    seq_idx: with one pack a batch, installed kernels would take it and mix the samples (the
    model's Qwen3_5GatedDeltaNet passes cu_seq_lens_q on, causal_conv1d_fn gets no seq_idx)."""
    batch, _ = batch
    with pytest.raises(ValueError, match=r"^a qwen3_5 batch needs its model, model_inputs\(batch"):
        model_inputs(batch)
    model_inputs(batch, tiny_model(family.processor))  # with it, laid out (no error)


def test_each_missing_kernel_is_named_and_one_that_drops_the_bounds_is_refused(family, batch):
    """With flash-linear-attention alone, causal-conv1d is named; a causal_conv1d_fn whose
    signature has no seq_idx is refused too: transformers would pass it none
    (hub_kernels.py:1050, kwargs filtered by the kernel's signature)."""
    batch, _ = batch
    model = tiny_model(family.processor)
    with linear_attention_kernels(causal_conv1d=None), pytest.raises(UserError) as refused:
        model_inputs(batch, model)
    assert "install causal-conv1d (CUDA)" in str(refused.value)

    def without_seq_idx(x, weight, bias=None, activation=None):
        return CAUSAL_CONV1D.causal_conv1d_fn(x, weight, bias, activation=activation)

    older = package("causal_conv1d", causal_conv1d_fn=without_seq_idx)
    with linear_attention_kernels(causal_conv1d=older), pytest.raises(UserError):
        model_inputs(batch, model)
    with linear_attention_kernels():
        assert model_inputs(batch, model)["seq_idx"].dtype == torch.int32


# With the kernels: packed equals alone ------------------------------------------------------


# The default suite: sdpa, dense; the slow group eager and the MoE (20-40 s each on a busy 2-core
# machine: transformers' torch recurrence, forward and backward, one sample at a time)
@pytest.mark.parametrize("moe", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("attention", [pytest.param("eager", marks=pytest.mark.slow), "sdpa"])
def test_packed_samples_get_their_logits_loss_and_gradient_alone(
    family, batch, kernels, attention, moe
):
    """Two packs of three, laid out as one row with every sample's bounds: each sample's logits
    as alone, and the batch's loss and gradient (batch_loss, what the trainers call) the sum of
    the samples' alone, within float32 rounding."""
    batch, samples = batch
    model = tiny_model(family.processor, attn_implementation=attention, moe=moe)
    inputs = model_inputs(batch, model)
    assert inputs["input_ids"].shape == (1, batch["input_ids"].numel())
    assert inputs["position_ids"].shape == (4, 1, batch["input_ids"].numel())
    assert worst(packed_logits(model, batch, inputs), alone_logits(family, model, samples)) < 1e-5

    parts = batch_loss(model, inputs, batch)
    parts.summed.backward()
    packed_grads = gradients(model)
    model.zero_grad()
    alone = sum(
        summed_loss(model(**alone_inputs(family, s), use_cache=False).logits, s["labels"][None])
        for s in samples
    )
    alone.backward()
    assert float(parts.summed.detach()) == pytest.approx(float(alone.detach()), rel=1e-5)
    for packed_grad, alone_grad in zip(packed_grads, gradients(model)):
        assert float((packed_grad - alone_grad).norm()) <= 1e-5 * float(alone_grad.norm()) + 1e-9


def test_the_varlen_kernel_takes_one_row(family, batch, kernels):
    """Why one row: the batch's two rows, with the bounds, are refused by the varlen kernel (as
    flash-linear-attention refuses them)."""
    batch, _ = batch
    model = tiny_model(family.processor)
    # the keys of any packed batch, [B, L]: a batch that names no family, passed without a model
    two_rows = model_inputs({k: v for k, v in batch.items() if k != "model_family"})
    with pytest.raises(ValueError, match="batch size is expected to be 1"):
        model(**two_rows)


def test_router_loss_counts_the_real_tokens_of_both_packs(family, batch, kernels):
    """Qwen3.5-MoE's router term (load balancing over the real tokens, mmdp.training.loss.
    router_loss) on the one-row batch of two packs equals the model's own on the same six
    samples padded."""
    batch, samples = batch
    model = tiny_model(family.processor, moe=True)
    model.config.text_config.output_router_logits = True
    with torch.no_grad():
        parts = batch_loss(model, model_inputs(batch, model), batch)
        own = model(**padded(family, samples), use_cache=False)
    coef = model.config.text_config.router_aux_loss_coef
    assert float(parts.router) == pytest.approx(float(own.aux_loss * coef), rel=1e-5)


# The family: weighed as its processor, told apart by its tokenizer --------------------------


def test_a_qwen3_5_processor_is_told_from_qwen3_vl_by_its_tokenizer_and_its_model_by_itself(
    family, batch, kernels
):
    """Both processors are Qwen3VLProcessors; Qwen3.5's tokenizer is a Qwen3_5Tokenizer. A batch
    whose family says qwen3_vl (a Qwen3.5 processor with another tokenizer) still goes to the
    model as one row: model_inputs reads the model's layers, not the batch's family."""
    assert isinstance(family, Qwen3_5)
    assert type(family_for(offline_processor("qwen3_vl"))) is Qwen3VL
    batch, _ = batch
    model = tiny_model(family.processor)
    assert model_inputs({**batch, "model_family": "qwen3_vl"}, model)["input_ids"].shape[0] == 1


def test_replies_are_labelled_in_qwen3_5s_template_whose_thinking_block_moves(family):
    """Qwen3.5's template opens only the last reply with an empty thinking block: adding a turn
    rewrites the turn before, and the replies are still found, their text and end of turn alone
    labelled (the block is the non-thinking generation prompt's, not trained)."""
    row = {"images": [cell(40, 30)], "texts": [turn("One?", "First."), turn("Two?", "Second.")]}
    sample = family.make_sample(row, 0)
    text = family.tokenizer.decode(sample["input_ids"])
    assert text.count("<think>") == 1 and "assistant\nFirst.<|im_end|>" in text
    labelled = family.tokenizer.decode(sample["labels"][sample["labels"] != -100])
    assert labelled == "First.<|im_end|>Second.<|im_end|>"


@pytest.mark.parametrize("size", HELD_OUT, ids=lambda s: "{}f-{}fps-{}x{}".format(*s))
def test_video_weights_are_the_processors(size):
    """tests/test_video.py's check, with Qwen3.5's processor (its video settings are Qwen3.5's)."""
    check_video_weight(family_for(offline_processor("qwen3_5")), size)


def test_transformers_resolves_the_kernels_when_it_imports_the_module():
    """What mmdp reads (mmdp.models.inputs.check_linear_attention): transformers' wrapper keeps
    the implementation it resolved and the parameters it will pass (hub_kernels.py:1023-1025)."""
    import inspect

    resolved = inspect.getclosurevars(modeling_qwen3_5.causal_conv1d_fn).nonlocals
    assert resolved["is_new_implementation"] is False  # no causal-conv1d here
    with linear_attention_kernels():
        resolved = inspect.getclosurevars(modeling_qwen3_5.causal_conv1d_fn).nonlocals
        assert resolved["is_new_implementation"] and "seq_idx" in resolved["applicable_params"]


# The planned loader (examples/pack_planned.py) -------------------------------------------------


@pytest.mark.slow  # the offline processors of every family (the image costs figure): ~45 s
def test_the_planned_loader_packs_for_qwen3_5_offline(run_main, tmp_path):
    status, out, err = run_main(
        "examples/pack_planned.py",
        *("--model", "qwen3_5", "--num-rows", "24", "--video-rows", "6", "--num-workers", "0"),
        *("--out-dir", str(tmp_path)),
    )
    assert status == 0, err
    assert "videos packed:    6" in out and (tmp_path / "05_qwen3_5.png").exists()


def test_the_gpu_check_says_what_it_needs_and_exits_on_a_cpu(run_main):
    """tools/check_hybrid_kernels.py compares with the real kernels on a GPU (docs/real-vlms.md);
    here, without flash-linear-attention or CUDA, it checks nothing and says why."""
    status, out, _ = run_main("tools/check_hybrid_kernels.py")
    assert status == 0 and out.strip().endswith("nothing checked")
