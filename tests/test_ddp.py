"""Packed DDP, same gradient as one process (mmdp.training.ddp, stage 6's DDP check).

Fast: two ranks' step, in this process: each rank's micro-batches with the recipe's loss (the
summed token loss x world size / the step's label tokens on every rank, micro_batch_loss), then
the ranks' gradients averaged as DDP averages them, is one process's gradient on all the
batches; each rank's own mean loss is not (the ranks hold unequal label tokens).

Slow: the same under torchrun with DDP itself, 2 ranks (gloo, CPU): mmdp.training.ddp's step
(`torchrun ... -m mmdp.check_ddp` alone), run in tests/torchrun_trainers.py's launch with the
trainers' checks (each launch starts 3 processes that import torch and transformers: 20-30 s).
"""

import copy
import json

import pytest
import torch

from mmdp.data.vqa_dataset import VQADataset
from mmdp.flags import parse_flags
from mmdp.models.tiny_vlm import TinyVLM, TinyVLMConfig, vlm_inputs
from mmdp.training.ddp import DdpSettings, rank_batches, relative_difference
from mmdp.training.loss import label_tokens, summed_loss
from mmdp.training.recipes import micro_batch_loss

# in this process, one pack of 256 tokens a micro-batch: a quarter of the logits to compute
SMALL = ["--num-rows", "64", "--micro-steps", "2", "--packs-per-batch", "1", "--max-length", "256"]
WORLD_SIZE = 2


def whole_gradient(model) -> torch.Tensor:
    """Every parameter's gradient, flattened, zeros where it has none (a rank whose batches
    hold no image leaves the vision encoder without one; DDP then reduces zeros for it)."""
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]
    return torch.cat([grad.flatten() for grad in grads])


def averaged_over_ranks(model, batches: dict, loss_of) -> torch.Tensor:
    """Each rank's gradient on its own micro-batches (loss_of(replica, batch, rank)), then their
    mean: what DDP's all-reduce leaves on every rank."""
    gradients = []
    for rank, mine in batches.items():
        replica = copy.deepcopy(model)
        for batch in mine:
            loss_of(replica, batch, rank).backward()
        gradients.append(whole_gradient(replica))
    return torch.stack(gradients).mean(dim=0)


def test_two_ranks_step_is_one_process_gradient_only_with_tokens_counted_over_all_ranks(
    tokenizer, one_thread
):
    args = parse_flags(DdpSettings, "", SMALL)
    samples = VQADataset(args.data.load(), tokenizer)
    torch.manual_seed(args.seed)
    vlm_config = TinyVLMConfig(vocab_size=len(tokenizer), image_token_id=tokenizer.image_token_id)
    model = TinyVLM(vlm_config).train()
    batches = {r: rank_batches(samples, args, r, WORLD_SIZE) for r in range(WORLD_SIZE)}
    tokens = [sum(label_tokens(b["labels"]) for b in mine) for mine in batches.values()]
    assert tokens[0] != tokens[1]  # packs hold as many tokens, not as many label tokens

    # the reference: one process, every rank's batches, summed loss / all their label tokens
    reference = copy.deepcopy(model)
    for batch in batches[0] + batches[1]:
        logits = reference(**vlm_inputs(batch)).logits
        (summed_loss(logits, batch["labels"]) / sum(tokens)).backward()
    expected = whole_gradient(reference)

    step_tokens = torch.tensor(float(sum(tokens)))  # what step_label_tokens all-reduces

    def recipe(replica, batch, rank):
        return micro_batch_loss(replica, vlm_inputs(batch), batch, step_tokens, WORLD_SIZE)

    def per_rank_mean(replica, batch, rank):  # each micro-batch's own mean, / micro-steps
        return replica(**vlm_inputs(batch)).loss / len(batches[rank])

    assert relative_difference(averaged_over_ranks(model, batches, recipe), expected) < 1e-5
    # negative control: tokens weigh unequally, and the gradient is another one
    assert relative_difference(averaged_over_ranks(model, batches, per_rank_mean), expected) > 1e-2


@pytest.mark.slow  # in the trainers' torchrun launch (tests/conftest.py)
def test_packed_ddp_matches_one_process_only_with_tokens_counted_over_all_ranks(
    trainers_under_torchrun,
):
    result = json.loads((trainers_under_torchrun / "ddp" / "ddp.json").read_text())
    assert result["world_size"] == 2 and result["micro_steps"] == 2
    tokens = result["label_tokens_per_rank"]
    assert tokens[0] != tokens[1]  # packs hold as many tokens, not as many label tokens
    # summed loss / label tokens all-reduced over ranks and micro-steps: one process's gradient
    assert result["grad_rel_diff_global_tokens"] < 1e-5
    # each rank's own mean, averaged by DDP: tokens weigh unequally, and the gradient is
    # another one (by how much depends on how unequal the ranks' label tokens are)
    weight = result["token_weight_per_rank_mean"]
    assert weight["min"] < 0.9 and weight["max"] > 1.1
    assert result["grad_rel_diff_per_rank_mean"] > 1e-2
