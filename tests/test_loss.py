"""The loss over the trained positions only (mmdp.training.loss.batch_loss, what the trainers
compute): the loss and every parameter's gradient of the full logits, without building them.

- TinyVLM, and every real family in the slow group: within 1e-6 (relative: the loss, the whole
  gradient, every entry against the largest) of the full logits' cross entropy computed in
  float64, the reference (the float32 one, the trainers' path before, rounds more: 4.8e-6 on
  Gemma 3's gradient; every other family within 1e-6 of it too), a mixture's loss weights
  included; the logits of the label positions themselves (unshifted: the easy mistake) are the
  negative control.
- bf16 autocast within bfloat16's rounding; no_grad; any output layer (not a plain nn.Linear); a
  final logit softcap applied where the model's class applies it, and only there.
- The MoE router term: the model's own loss (mean over label tokens + router_aux_loss_coef x
  load balancing over the real tokens) on the same samples padded, with output_router_logits;
  the packed batch's own term (padding counted) and the loss without the term are the controls;
  in the slow group, two ranks x two micro-batches give one process's gradient of the
  micro-batches' own model losses, weighed by their label tokens.
"""

import copy

import pytest
import torch
from conftest import PACKED_LENGTH
from torch import nn

from mmdp import config
from mmdp.batch import build_pack, collate_packs
from mmdp.data.families import family_for, tiny_processor
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.models.inputs import model_inputs
from mmdp.models.tiny import tiny_model
from mmdp.models.tiny_vlm import TinyVLM, TinyVLMConfig, vlm_inputs
from mmdp.packing.packing_config import PackingConfig
from mmdp.training.loss import (
    batch_loss,
    head_loss,
    label_tokens,
    summed_weighted_loss,
    token_losses,
    trained_positions,
)
from mmdp.training.recipes import micro_batch_loss

TOLERANCE = 1e-6  # float32, relative: loss, whole gradient, and every entry (of the largest)


def gradients(model) -> list[torch.Tensor]:
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]


def differences(loss, grads, ref_loss, ref_grads) -> dict:
    """Relative differences: the loss; the whole gradient (norm); every gradient entry, relative
    to the largest entry of the model's (some exact gradients are 0, a key bias's: softmax
    ignores it, and their rounding noise has no size of its own to be relative to)."""
    scale = max(float(g.abs().max()) for g in ref_grads)
    delta = [(g.double() - r.double()) for g, r in zip(grads, ref_grads)]
    return {
        "loss": abs(float(loss.detach()) - float(ref_loss)) / abs(float(ref_loss)),
        "gradient": float(torch.cat([d.flatten() for d in delta]).norm())
        / float(torch.cat([r.double().flatten() for r in ref_grads]).norm()),
        "entry": max(float(d.abs().max()) for d in delta) / scale,
    }


def full_logits_steps(model, inputs, batch, dtypes=(torch.float64, torch.float32)) -> dict:
    """Today's path: the model's full logits (float32), summed_weighted_loss, the gradient of
    every parameter; with the cross entropy in float64 (the reference: float32's log-softmax
    rounds more than the model around it) and in float32 (the trainers' path before)."""
    model = copy.deepcopy(model)
    logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits
    params = list(model.parameters())
    steps = {}
    for dtype in dtypes:
        loss = summed_weighted_loss(logits.to(dtype), batch)
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        steps[dtype] = (loss.detach(), [torch.zeros_like(p) if g is None else g
                                        for p, g in zip(params, grads)])  # fmt: skip
    return steps


def trained_positions_step(model, inputs, batch):
    model = copy.deepcopy(model)
    parts = batch_loss(model, inputs, batch)
    parts.summed.backward()
    return parts, gradients(model)


# TinyVLM ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_vlm_batch(tokenizer):
    """TinyVLM and one batch of a pack of 256 tokens from the synthetic rows, with a mixture's
    loss weights (1 or 3 per sample, 0 on padding)."""
    samples = VQADataset(load_vqa_dataset(num_rows=8), tokenizer)
    packing = PackingConfig(max_length=256, packs_per_batch=1, seed=0)
    batch = next(iter(PackedDataLoader(PackedDataset(samples, config=packing), num_workers=0)))
    generator = torch.Generator().manual_seed(0)
    weights = 1.0 + 2.0 * torch.randint(0, 2, (int(batch["sample_index"].numel()) + 1,),
                                        generator=generator).float()  # fmt: skip
    from mmdp.batch import sample_ids

    owner = sample_ids(batch)
    batch["loss_weights"] = torch.where(owner >= 0, weights[owner.clamp(min=0)], 0.0)
    torch.manual_seed(0)
    vlm_config = TinyVLMConfig(vocab_size=len(tokenizer), image_token_id=tokenizer.image_token_id)
    return TinyVLM(vlm_config).train(), batch


def test_loss_over_trained_positions_is_the_full_logits_loss_and_gradient(tiny_vlm_batch):
    model, batch = tiny_vlm_batch
    inputs = vlm_inputs(batch)
    parts, grads = trained_positions_step(model, inputs, batch)
    assert parts.outputs.logits.shape[1] == 0  # the model computed logits for no position
    assert parts.label_tokens == label_tokens(batch["labels"]) < batch["labels"].numel() / 2
    ref_loss, ref_grads = full_logits_steps(model, inputs, batch, [torch.float64])[torch.float64]
    diff = differences(parts.summed, grads, ref_loss, ref_grads)
    print(f"TinyVLM, against the full logits' cross entropy in float64: {diff}")
    assert max(diff.values()) < TOLERANCE, diff


def test_loss_token_by_token_under_no_grad_and_not_at_the_labels_own_positions(tiny_vlm_batch):
    """Under no_grad: each trained position's loss, in the order of trained_positions, and no
    gradient. The negative control: the logits of the positions that hold a label (labels !=
    -100, as `logits_to_keep=labels != -100` would keep), not of those that predict one."""
    model, batch = tiny_vlm_batch
    with torch.no_grad():
        parts = batch_loss(model, vlm_inputs(batch), batch)
        logits = model(**{**vlm_inputs(batch), "labels": None}).logits
    assert not parts.summed.requires_grad
    expected = token_losses(logits, batch["labels"])[trained_positions(batch["labels"])]
    torch.testing.assert_close(parts.token_losses, expected, rtol=1e-6, atol=1e-6)

    at_labels = batch["labels"] != config.IGNORE_INDEX
    losses = nn.functional.cross_entropy(
        logits[at_labels], batch["labels"][at_labels], reduction="none"
    )
    wrong = float((losses * batch["loss_weights"][at_labels]).sum())
    print(f"at the labels' own positions: {wrong:.2f}, predicting them: {float(parts.summed):.2f}")
    assert abs(wrong - float(parts.summed)) / float(parts.summed) > 1e-2


def test_loss_under_bf16_autocast_is_the_full_logits_one_within_bf16():
    """As accelerate's bf16 (mmdp.training.recipes.mixed_precision): the output layer in
    bfloat16, the cross entropy in float32; they differ by bfloat16's rounding (8 bits) only.
    A tiny Llama: CPUs without bfloat16 units emulate it, slowly."""
    from conftest import tiny_llama

    model = tiny_llama(vocab_size=3000).train()
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3000, (2, 64), generator=generator)
    labels[:, :20] = config.IGNORE_INDEX
    inputs = {"input_ids": labels.clamp(min=0), "use_cache": False}
    batch = {"labels": labels, "loss_weights": torch.rand(2, 64, generator=generator) + 0.5}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        parts, grads = trained_positions_step(model, inputs, batch)
        ref_loss, ref_grads = full_logits_steps(model, inputs, batch)[torch.float32]
    assert parts.outputs.logits.dtype == torch.bfloat16 and parts.summed.dtype == torch.float32
    diff = differences(parts.summed, grads, ref_loss, ref_grads)
    print(f"a tiny Llama under bf16 autocast: {diff}")
    assert diff["loss"] < 1e-3 and diff["gradient"] < 1e-2 and diff["entry"] < 1e-2


def test_loss_through_any_output_layer_checkpoints_chunks():
    """A layer that is not a plain nn.Linear (a LoRA-wrapped or quantized lm_head: a subclass
    with a forward of its own) is called on each chunk, its logits recomputed in the backward:
    the same losses and gradients, 3 positions a chunk."""

    class OwnForward(nn.Linear):
        def forward(self, hidden):
            return super().forward(hidden)

    torch.manual_seed(0)
    hidden = torch.randn(2, 9, 8, requires_grad=True)
    labels = torch.randint(0, 50, (2, 9))
    labels[:, :3] = config.IGNORE_INDEX
    layer = OwnForward(8, 50)
    summed, losses = head_loss(layer, hidden, labels, logits_per_chunk=150)
    summed.backward()
    got = (hidden.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone())
    hidden.grad, layer.weight.grad, layer.bias.grad = None, None, None
    expected = token_losses(layer(hidden), labels)
    expected.sum().backward()
    torch.testing.assert_close(losses, expected[trained_positions(labels)])
    torch.testing.assert_close(got, (hidden.grad, layer.weight.grad, layer.bias.grad))


def test_loss_refuses_logits_to_keep(tiny_vlm_batch):
    model, batch = tiny_vlm_batch
    with pytest.raises(ValueError, match="pass no logits_to_keep"):
        batch_loss(model, {**vlm_inputs(batch), "logits_to_keep": 1}, batch)


# A final logit softcap ---------------------------------------------------------------------------


def tiny_gemma3_text(softcap):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    text = Gemma3TextConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        final_logit_softcapping=softcap, initializer_range=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    return Gemma3ForCausalLM(text).train()


def test_loss_applies_the_final_logit_softcap_where_the_model_does():
    """Gemma3ForCausalLM caps its logits (cap x tanh(logits / cap)) after the output layer: the
    loss over trained positions does too; without the cap (the control), another loss."""
    model = tiny_gemma3_text(softcap=3.0)
    labels = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    labels[:, :4] = config.IGNORE_INDEX
    batch = {"labels": labels, "real_token_mask": torch.ones(2, 12, dtype=torch.bool)}
    inputs = {"input_ids": labels.clamp(min=0), "use_cache": False}
    parts, grads = trained_positions_step(model, inputs, batch)
    ref_loss, ref_grads = full_logits_steps(model, inputs, batch)[torch.float64]
    diff = differences(parts.summed, grads, ref_loss, ref_grads)
    assert max(diff.values()) < TOLERANCE, diff
    with torch.no_grad():
        model.config.final_logit_softcapping = None
        uncapped = float(batch_loss(model, inputs, batch).summed)
    capped = float(parts.summed.detach())
    print(f"capped {capped:.3f}, the cap left out {uncapped:.3f}")
    assert abs(uncapped - capped) / capped > 1e-2


# Every family (slow: a tiny model of each real class) -------------------------------------------

FAMILIES = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "smolvlm", "llava_onevision", "gemma3")


def family_model(name: str, **config_changes):
    moe = name == "qwen3_vl_moe"
    family = family_for(tiny_processor("qwen3_vl" if moe else name))
    model = tiny_model(family.processor, **({"moe": True} if moe else {})).train()
    for key, value in config_changes.items():
        setattr(model.config.get_text_config(), key, value)
    return family, model


def packed(family, samples: list[dict], packs: list[list[int]]) -> dict:
    """The samples in the given packs (indices), each padded to PACKED_LENGTH, collated."""
    rows = []
    for indices in packs:
        chosen = [samples[i] for i in indices]
        rows.append(
            build_pack(
                chosen,
                [len(s["input_ids"]) for s in chosen],
                max_length=PACKED_LENGTH,
                pad_token_id=family.pad_token_id,
                batch_index=0,
            )
        )
    return collate_packs(rows, family)


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_loss_over_trained_positions_is_the_full_logits_one_for_every_family(name):
    from test_families import ROWS

    # Gemma 3's VLM class leaves its text config's cap unapplied: so must the loss
    family, model = family_model(
        name, **({"final_logit_softcapping": 3.0} if name == "gemma3" else {})
    )
    samples = [family.make_sample(row, i) for i, row in enumerate(ROWS)]
    batch = packed(family, samples, [[0, 1, 2], [3, 4, 5]])
    batch["loss_weights"] = torch.where(batch["real_token_mask"], 1.0 + (batch["labels"] % 3), 0.0)
    inputs = model_inputs(batch, model)
    parts, grads = trained_positions_step(model, inputs, batch)
    for dtype, (ref_loss, ref_grads) in full_logits_steps(model, inputs, batch).items():
        diff = differences(parts.summed, grads, ref_loss, ref_grads)
        print(f"{name}, against the full logits in {dtype}: " + ", ".join(
            f"{k} {v:.1e}" for k, v in diff.items()))  # fmt: skip
        if dtype == torch.float64 or name != "gemma3":
            assert max(diff.values()) < TOLERANCE, (name, dtype, diff)


# The MoE router term -----------------------------------------------------------------------------


def padded(family, samples: list[dict]) -> dict:
    """The samples as one batch padded on the right, with an attention mask: what the model's
    own loss takes unpacked (it computes its own positions from the mask)."""
    length = max(len(s["input_ids"]) for s in samples)

    def pad(key, value):
        return torch.stack([
            nn.functional.pad(s[key], (0, length - len(s[key])), value=value) for s in samples
        ])  # fmt: skip

    batch = {
        "input_ids": pad("input_ids", family.pad_token_id),
        "labels": pad("labels", config.IGNORE_INDEX),
        "attention_mask": torch.stack(
            [
                nn.functional.pad(
                    torch.ones(len(s["input_ids"]), dtype=torch.long),
                    (0, length - len(s["input_ids"])),
                )
                for s in samples
            ]
        ),  # fmt: skip
    }
    batch.update({key: pad(key, 0) for key in family.token_keys})
    batch.update(family.collate_vision(samples))
    return batch


@pytest.fixture(scope="module")
def moe():
    """The tiny Qwen3-VL-MoE asked for its router logits (output_router_logits=True in its text
    config), and test_families' six samples."""
    from test_families import ROWS

    family, model = family_model("qwen3_vl_moe", output_router_logits=True)
    samples = [family.make_sample(row, i) for i, row in enumerate(ROWS)]
    return family, model, samples


def test_router_loss_is_the_models_own_on_the_same_samples_padded(moe):
    family, model, samples = moe
    batch = packed(family, samples, [[0, 1, 2]])
    with torch.no_grad():
        parts = batch_loss(model, model_inputs(batch, model), batch)
    ours = parts.over(parts.label_tokens)  # one micro-batch: the mean over its label tokens
    with torch.no_grad():
        own = model(**padded(family, samples[:3]), use_cache=False)
    coef = model.config.text_config.router_aux_loss_coef
    # the model's own term on the packed batch: no 2-D attention mask, the padding tail counted
    with torch.no_grad():
        counting_padding = model(**model_inputs(batch, model)).aux_loss * coef
    without_router = parts.summed / parts.label_tokens
    print(
        f"the model's own loss, padded {float(own.loss):.6f}, ours {float(ours):.6f}, without "
        f"the router term {float(without_router):.6f}; router term ours {float(parts.router):.4e}"
        f", the model's own padded {float(own.aux_loss * coef):.4e}, packed "
        f"{float(counting_padding):.4e}"
    )
    assert abs(float(ours) - float(own.loss)) / float(own.loss) < TOLERANCE
    assert abs(float(parts.router) / float(own.aux_loss * coef) - 1) < TOLERANCE
    assert abs(float(counting_padding) / float(own.aux_loss * coef) - 1) > 1e-3  # the control
    assert abs(float(without_router) - float(own.loss)) > 1e-4  # the term the loss used to drop


def test_router_loss_adds_nothing_to_a_filler(moe):
    """A filler (every label ignored, no real token: MMDPTrainer's epoch ends) has a NaN load
    balance (0 / 0); its loss must still be exactly 0."""
    family, model, samples = moe
    batch = packed(family, samples, [[0, 1]])
    batch["labels"] = torch.full_like(batch["labels"], config.IGNORE_INDEX)
    batch["real_token_mask"] = torch.zeros_like(batch["real_token_mask"])
    parts = batch_loss(model, model_inputs(batch, model), batch)
    assert float(parts.over(1).detach()) == 0.0


@pytest.mark.slow
def test_router_loss_two_ranks_give_one_processs_gradient_of_the_models_own_losses(moe):
    """2 ranks x 2 micro-batches, micro_batch_loss, the ranks' gradients averaged as DDP does:
    one process's gradient of sum over micro-batches of (their label tokens / the step's) x
    the model's own loss on each, padded; micro-batches of unequal label tokens."""
    family, model, samples = moe
    ranks = [[[0, 1], [2]], [[3], [4, 5]]]  # rank -> micro-batches -> samples (one pack each)
    tokens = torch.tensor(float(sum(label_tokens(samples[i]["labels"][None])
                                    for mine in ranks for mb in mine for i in mb)))  # fmt: skip
    expected = copy.deepcopy(model)
    for mine in ranks:
        for mb in mine:
            share = sum(label_tokens(samples[i]["labels"][None]) for i in mb) / tokens
            (
                share * expected(**padded(family, [samples[i] for i in mb]), use_cache=False).loss
            ).backward()
    averaged = None
    for mine in ranks:
        replica = copy.deepcopy(model)
        for mb in mine:
            batch = packed(family, samples, [mb])
            micro_batch_loss(replica, model_inputs(batch, replica), batch, tokens, 2).backward()
        grads = torch.cat([g.flatten() for g in gradients(replica)]) / 2
        averaged = grads if averaged is None else averaged + grads
    reference = torch.cat([g.flatten() for g in gradients(expected)])
    difference = float((averaged - reference).norm() / reference.norm())
    print(f"2 ranks x 2 micro-batches against one process: {difference:.1e}")
    assert difference < 1e-5
