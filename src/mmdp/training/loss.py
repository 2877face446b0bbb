"""The loss of any mmdp batch (padded or packed), two ways, and the parts to add up across
micro-batches and ranks.

    mean_over_tokens   every label token weighs the same (transformers' loss)
    mean_over_samples  every sample weighs the same: each sample's mean, then the mean of those
    weighted_mean_over_tokens  each label token weighs its sample's loss weight (a mixture's
                       per-source weight, the batch's `loss_weights`), divided by the label tokens

Padded and packed batches of the same samples give the same value for both
(tests/test_model_and_strategies.py). For DDP and gradient accumulation, add up their parts
(`summed_loss` or `summed_weighted_loss`, and `label_tokens`; `summed_sample_means`) over ranks and micro-batches before
dividing: see mmdp.training.ddp.

Those take the logits of every position. What the trainers call instead is `batch_loss(model,
inputs, batch)`: the model's forward, then its output layer on the trained positions only (the
positions whose next label is not ignored), a chunk of positions at a time, with the loss and
every gradient of the full-logits path (the second half of this module says how, and why).
"""

import sys
from dataclasses import dataclass
from typing import Any

import torch
from packaging.version import Version
from torch import nn
from torch.utils.checkpoint import checkpoint

from mmdp import config
from mmdp.batch import real_token_mask, sample_ids


def next_token_labels(labels: torch.Tensor) -> torch.Tensor:
    """The label each position is trained to predict: logit t predicts label t + 1 (the model's
    own shift). Shifting the labels, not the logits, leaves the large logits tensor uncopied.

    >>> next_token_labels(torch.tensor([[-100, 7, 8, 9]]))
    tensor([[   7,    8,    9, -100]])
    """
    return nn.functional.pad(labels[:, 1:], (0, 1), value=config.IGNORE_INDEX)


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss of every position, [B, L], float32 (float64 logits: float64): 0 where the next
    label is ignored."""
    return nn.functional.cross_entropy(
        logits.flatten(0, 1).to(torch.promote_types(logits.dtype, torch.float32)),
        next_token_labels(labels).flatten(),
        ignore_index=config.IGNORE_INDEX,
        reduction="none",
    ).view(labels.shape)


def summed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The sum (not the mean) of the token losses, with the model's own shift: logit t predicts
    label t + 1. Sums add up across batches of any shape, which lets padded and packed batches of
    the same samples be compared, and ranks of a DDP run be normalised together. In float32 (in
    float64 for float64 logits: a reference more exact than any float32 loss)."""
    return nn.functional.cross_entropy(
        logits.flatten(0, 1).to(torch.promote_types(logits.dtype, torch.float32)),
        next_token_labels(labels).flatten(),
        ignore_index=config.IGNORE_INDEX,
        reduction="sum",
    )


def label_tokens(labels: torch.Tensor) -> int:
    """How many positions a batch trains: the denominator of the mean over label tokens."""
    return int((next_token_labels(labels) != config.IGNORE_INDEX).sum())


def mean_over_tokens(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Every label token weighs the same (what transformers computes): use it by default; a
    sample with a long reply counts more than one with a short reply, as in pretraining."""
    return summed_loss(logits, labels) / label_tokens(labels)


def mean_over_samples(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Every sample weighs the same, whatever its reply length (each sample's mean over its
    label tokens, then the mean over samples): use it when short answers must not be drowned by
    long ones. With packing it is computed per segment, never per row: a row holds several
    samples. Samples without a label token are left out.
    """
    summed, samples = summed_sample_means(logits, batch)
    return summed / samples


def summed_sample_means(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, int]:
    """The sum over samples of each sample's mean token loss, and the number of samples (the
    parts of mean_over_samples; add them up across ranks or micro-batches before dividing)."""
    labels = batch["labels"]
    trained = next_token_labels(labels) != config.IGNORE_INDEX
    # the sample a position's loss belongs to is that of the label it predicts (position t + 1)
    owner = nn.functional.pad(sample_ids(batch)[:, 1:], (0, 1), value=-1)[trained]
    losses = token_losses(logits, labels)[trained]
    ids, owner = torch.unique(owner, return_inverse=True)
    sums = torch.zeros(len(ids), device=losses.device).index_add(0, owner, losses)
    counts = torch.bincount(owner, minlength=len(ids))
    return (sums / counts).sum(), len(ids)


def summed_weighted_loss(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """sum over label tokens t of w_t * loss_t, where w_t is the batch's `loss_weights` at the
    label t predicts (its sample's weight; 1 everywhere when the batch has none). With the
    model's own shift, as summed_loss."""
    labels = batch["labels"]
    if "loss_weights" not in batch:
        return summed_loss(logits, labels)
    loss_weights = nn.functional.pad(batch["loss_weights"][:, 1:], (0, 1), value=0.0)
    return (token_losses(logits, labels) * loss_weights.to(logits.device)).sum()


def weighted_mean_over_tokens(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """sum_t w_t * loss_t / (number of label tokens): a mixture's per-source loss weights, on
    top of transformers' mean over label tokens. Weights of 1 give mean_over_tokens exactly.

    The denominator counts label tokens, not the sum of the weights: a weight then means the
    same in every batch (2.0: each of the source's tokens counts twice as much as a token of
    weight 1, whatever else the batch holds). Divided by the sum of the weights, a batch of one
    source would cancel its own weight.

    Under DDP, summed_weighted_loss takes summed_loss's place in mmdp.training.ddp's recipe, as
    mmdp.training.recipes.micro_batch_loss and MMDPTrainer's token_loss do.
    """
    return summed_weighted_loss(logits, batch) / label_tokens(batch["labels"])


# The loss over the trained positions only: what the trainers compute ---------------------------
#
# A VLM's output layer makes the largest tensor of a step: with Qwen's 151,936-token vocabulary,
# one 8,192-token pack has 1.2 G logits (5 GB in float32), yet only the replies are trained. So
# the trainers never ask the model for its logits:
#
# 1. batch_loss hooks the model's output layer (`get_output_embeddings()`, the lm_head every
#    family calls last) for one forward: the hook takes the layer's input, the final hidden
#    states [B, L, H], computes the loss from them (head_loss), and hands the layer an empty
#    slice instead, so the model computes logits for no position (its `logits` are [B, 0, V]).
# 2. head_loss applies the layer to the trained positions only (those whose next label is not
#    ignored), a chunk of positions at a time: each chunk's logits, their cross entropy in
#    float32, and their gradient (softmax minus one-hot, times the token's weight) down to the
#    hidden states and the layer's weights, at once, as Liger's fused linear cross entropy does;
#    then the chunk's logits are freed. Peak memory: one chunk's logits (LOGITS_PER_CHUNK) instead
#    of B x L x V, plus the gradients kept for backward (N x H, and V x H for the weights).
# 3. What a model applies after its output layer is applied too: a final logit softcapping
#    (final_logit_softcap). The VLM classes mmdp packs for apply nothing else: their forward in
#    transformers 5.23 ends `logits = self.lm_head(slice_logits_to_keep(hidden_states, ...))`.
#
# Why not transformers' own `logits_to_keep`: 5.23 takes a [B, L] boolean mask
# (modeling_utils.slice_logits_to_keep, "packed training"), but the model then builds the [N, V]
# logits of every trained position at once, and the loss their float32 copy and its softmax:
# memory still grows with the vocabulary times the pack. Why a hook rather than the base model
# called directly (TRL 1.16's add_fused_lm_head patches forward and calls the backbone): the
# forward stays the wrapped model's (DDP, FSDP2, PEFT, accelerate), so every wrapper runs as it
# does without mmdp; the output layer is still called, on no position, so DDP's search for unused
# parameters still finds its weight; and under FSDP2 the hook sees the weight unsharded, inside
# the forward.

# Logits of one chunk of positions (positions x vocabulary): 2**26 floats, 256 MB in float32;
# 441 positions of a 151,936-token vocabulary, 1,365 of a 49,153-token one. Smaller chunks hold
# less but launch more, smaller products: on an H200 (bench/bench_loss.py, a pack of 8,192
# tokens, hidden size 3,584), 2**24 took 1.65x the full logits' time in bfloat16, 2**26 0.72x.
LOGITS_PER_CHUNK = 2**26

# Classes that leave their text config's final_logit_softcapping unapplied: transformers 5.23's
# Gemma3ForConditionalGeneration ends at its lm_head (Gemma3ForCausalLM applies it, as Gemma 2,
# PaliGemma and Gemma 4 do).
SOFTCAP_IGNORED_BY = ("Gemma3ForConditionalGeneration",)


def trained_positions(labels: torch.Tensor) -> torch.Tensor:
    """Where a batch is trained: the positions whose next label is not ignored, bool [B, L]
    (label_tokens counts them; logit t predicts label t + 1).

    >>> trained_positions(torch.tensor([[-100, -100, 8, 9]]))
    tensor([[False,  True,  True, False]])
    """
    return next_token_labels(labels) != config.IGNORE_INDEX


def head_loss(
    head: nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    loss_weights: torch.Tensor | None = None,
    *,
    softcap: float | None = None,
    logits_per_chunk: int = LOGITS_PER_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The output layer `head` on the final hidden states [B, L, H] at the trained positions of
    `labels` [B, L] only (the model's shift: position t predicts label t + 1):

        (sum over trained positions t of w_t * loss_t: float32, 0-d, with its gradient;
         every loss_t: float32 [N], no gradient, in the order of hidden[trained_positions(labels)])

    w_t is `loss_weights` at the label t predicts (a mixture's per-source weight), 1 without.
    `softcap`: cap x tanh(logits / cap) after the layer, as the model does (final_logit_softcap).
    A plain nn.Linear (every lm_head mmdp knows) runs fused, its gradient computed chunk by chunk
    in the forward (_LinearCrossEntropy); any other layer (a LoRA-wrapped lm_head) is called on
    each chunk under activation checkpointing, its logits recomputed in the backward. Either way
    the logits are computed as the layer computes them (under autocast: in its dtype) and their
    cross entropy in float32, as `summed_loss` does with the full logits.
    """
    trained = trained_positions(labels.to(hidden.device))
    targets = next_token_labels(labels.to(hidden.device))[trained]
    weights = None
    if loss_weights is not None:
        shifted = nn.functional.pad(loss_weights[:, 1:], (0, 1), value=0.0).to(hidden.device)
        weights = shifted[trained].float()
    hidden = hidden[trained]
    vocab = getattr(head, "out_features", None)  # nn.Linear's, and PEFT's LoRA layers'
    if vocab is None:
        raise ValueError(f"{type(head).__name__} has no out_features: the vocabulary's size")
    chunk = max(1, logits_per_chunk // vocab)
    if isinstance(head, nn.Linear) and type(head).forward is nn.Linear.forward:
        device_type = hidden.device.type
        dtype = hidden.dtype
        if torch.is_autocast_enabled(device_type):  # what nn.Linear computes in under autocast
            dtype = torch.get_autocast_dtype(device_type)
        summed, losses = _LinearCrossEntropy.apply(
            hidden, head.weight, head.bias, targets, weights, softcap, chunk, dtype,
            torch.is_grad_enabled(),  # needs_input_grad says True under no_grad too
        )  # fmt: skip
        return summed, losses
    losses = _layer_losses(head, hidden, targets, softcap, chunk)
    summed = (losses * weights).sum() if weights is not None else losses.sum()
    return summed, losses.detach()


def _capped(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """cap x tanh(logits / cap), in the logits' dtype, as transformers' Gemma models write it."""
    if softcap is None:
        return logits
    return torch.tanh(logits / softcap) * softcap


class _LinearCrossEntropy(torch.autograd.Function):
    """sum_t w_t * cross_entropy(cap(hidden_t @ weight.T + bias), target_t), a chunk of positions
    at a time, with the gradient of every chunk computed as soon as its logits are (so no
    [N, V] tensor is ever held, and the logits are computed once: no recomputation in backward).

    Per chunk, in `dtype` (the layer's under autocast) with autocast off: z = h W^T + b (capped),
    then in float32: lse = logsumexp(z), loss = lse - z[target], dloss/dz = (softmax(z) -
    one_hot(target)) * w (times 1 - tanh^2 through a cap), in z's memory; cast to `dtype`, it
    gives dh = dz W and dW += dz^T h, summed over chunks in float32 (on a GPU without rounding
    each chunk's product to `dtype` first). backward() scales them by the incoming gradient.
    Without grad mode (evaluation) only the losses are computed.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, weights, softcap, chunk, dtype, grad):
        needs_hidden, needs_weight, needs_bias = (grad and n for n in ctx.needs_input_grad[:3])
        device = hidden.device
        losses = torch.empty(len(targets), dtype=torch.float32, device=device)
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if needs_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if needs_bias else None
        with torch.autocast(device.type, enabled=False):
            w = weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            for start in range(0, len(targets), chunk):
                end = min(start + chunk, len(targets))
                h, t = hidden[start:end].to(dtype), targets[start:end]
                z = torch.mm(h, w.t()) if b is None else torch.addmm(b, h, w.t())
                z = _capped(z, softcap).float()
                lse = torch.logsumexp(z, dim=-1)
                losses[start:end] = lse - z.gather(1, t[:, None]).squeeze(1)
                if not (needs_hidden or needs_weight or needs_bias):
                    continue
                # d cap tanh(x / cap) / dx = 1 - tanh^2, from the capped logits
                slope = (z / softcap).square_().neg_().add_(1) if softcap is not None else None
                dz = z.sub_(lse[:, None]).exp_()  # the softmax, in z's memory
                dz[torch.arange(end - start, device=device), t] -= 1
                if slope is not None:
                    dz.mul_(slope)
                    del slope
                if weights is not None:
                    dz.mul_(weights[start:end, None])
                dz = dz.to(dtype)
                if grad_hidden is not None:
                    grad_hidden[start:end] = torch.mm(dz, w)
                if grad_weight is not None:
                    _add_product(grad_weight, dz.t(), h)
                if grad_bias is not None:
                    grad_bias += dz.sum(dim=0)
        ctx.gradients = (grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.mark_non_differentiable(losses)
        summed = (losses * weights).sum() if weights is not None else losses.sum()
        return summed, losses

    @staticmethod
    def backward(ctx, grad_summed, grad_losses):
        gradients = [
            None if g is None else g.mul_(grad_summed).to(dtype)
            for g, dtype in zip(ctx.gradients, ctx.dtypes)
        ]
        ctx.gradients = None
        return (*gradients, None, None, None, None, None, None)


# torch.addmm(..., out_dtype=float32) from bfloat16 or float16 products: CUDA, torch >= 2.8
_PRODUCT_IN_FLOAT32 = Version(torch.__version__).release >= (2, 8)


def _add_product(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """total (float32) += a @ b, in place, without a temporary of total's size when it can."""
    if a.dtype == total.dtype:
        total.addmm_(a, b)
    elif total.device.type == "cuda" and _PRODUCT_IN_FLOAT32:
        torch.addmm(total, a, b, out_dtype=torch.float32, out=total)
    else:  # a CPU has no such kernel: the product in a's dtype, then added
        total += torch.mm(a, b)


def _layer_losses(head, hidden, targets, softcap, chunk) -> torch.Tensor:
    """Each position's loss through any output layer, a chunk at a time; under grad mode each
    chunk is checkpointed (its logits recomputed in the backward), so one chunk's logits at most
    are held."""

    def chunk_losses(h, t):
        logits = _capped(head(h), softcap).float()
        return nn.functional.cross_entropy(logits, t, reduction="none")

    grad = torch.is_grad_enabled()
    losses = []
    for start in range(0, max(len(targets), 1), chunk):  # no position: one empty chunk
        h, t = hidden[start : start + chunk], targets[start : start + chunk]
        if grad:
            losses.append(checkpoint(chunk_losses, h, t, use_reentrant=False))
        else:
            losses.append(chunk_losses(h, t))
    return torch.cat(losses)


def unwrapped_model(model) -> nn.Module:
    """The model under its wrappers (DDP, accelerate, torch.compile, PEFT): the one whose class
    defines the forward, its config and its output layer."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile
            model = model._orig_mod
        elif hasattr(model, "get_base_model"):  # PEFT
            model = model.get_base_model()
        else:
            return model


def final_logit_softcap(model) -> float | None:
    """The cap a model applies to its logits after its output layer (cap x tanh(logits / cap)),
    None if it applies none: its text config's `final_logit_softcapping`, unless its class
    ignores it (SOFTCAP_IGNORED_BY). None in the released Gemma 3 checkpoints, and in every
    other family mmdp packs for."""
    model = unwrapped_model(model)
    if not hasattr(model, "config") or type(model).__name__ in SOFTCAP_IGNORED_BY:
        return None
    return getattr(model.config.get_text_config(), "final_logit_softcapping", None)


def router_loss(model, outputs, batch: dict) -> torch.Tensor | None:
    """The mixture-of-experts term the model's own loss adds when it returns router logits
    (output_router_logits=True, in its text config or as an input): router_aux_loss_coef x
    load_balancing_loss_func(router logits, num_experts, num_experts_per_tok, real tokens), with
    the model's own function (Qwen3-VL-MoE: modeling_qwen3_vl_moe, transformers 5.23). None when
    the model returned no router logits.

    Real tokens only: the model passes its attention_mask, which excludes a padded batch's
    padding; a packed batch has no 2-D attention mask, so the model's own term would count the
    padding tail of every pack. Here the mask is the batch's real tokens (real_token_mask) in
    both cases, so a packed batch gets the term the model computes on the same samples padded
    (tests/test_loss.py).
    """
    router_logits = getattr(outputs, "router_logits", None)
    if not router_logits:
        return None
    model = unwrapped_model(model)
    balance = getattr(sys.modules[type(model).__module__], "load_balancing_loss_func", None)
    if balance is None:
        raise ValueError(
            f"{type(model).__name__} returned router logits but its module has no "
            "load_balancing_loss_func: mmdp does not know its router loss"
        )
    text = model.config.get_text_config()
    real = real_token_mask(batch).to(router_logits[0].device)
    aux = balance(router_logits, text.num_experts, text.num_experts_per_tok, real)
    return text.router_aux_loss_coef * aux


@dataclass
class BatchLoss:
    """What one forward of a batch gives a trainer (batch_loss). Add `summed` and `label_tokens`
    over micro-batches and ranks, as summed_loss and label_tokens; `over(step_tokens)` is this
    batch's share of the step's loss."""

    summed: torch.Tensor  # sum over label tokens of w_t * loss_t, float32, 0-d, with gradient
    label_tokens: int  # the trained positions (label_tokens(labels))
    router: torch.Tensor | None  # router_loss: coef x load balancing, None without router logits
    token_losses: torch.Tensor  # [label_tokens] each trained position's loss, no gradient
    trained: torch.Tensor  # [B, L] bool, trained_positions(labels): where token_losses belong
    outputs: Any  # the model's outputs; their logits cover no position ([B, 0, V])

    def over(self, step_tokens) -> torch.Tensor:
        """(summed + label_tokens x router) / step_tokens: this micro-batch's share of the mean
        over the step's label tokens (every rank's, all-reduced), plus its share of the router
        term.

        Summed over the step's micro-batches (and ranks: DDP averages, so multiply by the world
        size) it is the mean over every label token of the step, plus the router term of each
        micro-batch weighed by its label tokens: the step's mean of the model's own loss (mean
        over the batch's label tokens + coef x aux), micro-batches weighed by their label tokens
        as the tokens are. One micro-batch on one rank: exactly the model's own loss.
        (Trainer, for a model that takes no loss kwargs, and TRL's SFTTrainer average the router
        term over micro-batches unweighted, and TRL divides by the accumulation steps.)
        """
        loss = self.summed
        if self.router is not None and self.label_tokens:  # a filler has no real token: NaN
            loss = loss + self.label_tokens * self.router.to(loss.device)
        return loss / torch.as_tensor(step_tokens).to(loss.device)


def batch_loss(model, inputs: dict, batch: dict) -> BatchLoss:
    """One forward of `model` on `inputs` (model_inputs(batch, model), or vlm_inputs; their
    `labels` are left out, so the model computes no loss of its own), and `batch`'s loss over its
    trained positions only, from its output layer's input (the comment above head_loss says how):

        parts = batch_loss(model, model_inputs(batch, unwrapped), batch)
        (parts.over(step_tokens) * world_size).backward()    # micro_batch_loss does this

    The loss and every gradient equal those of the full logits (summed_weighted_loss of
    model(**inputs).logits), within float32 rounding (tests/test_loss.py, every family). Call it
    where you would call the model: under autocast, no_grad, through DDP or FSDP2 (`model`
    wrapped; its output layer is found under the wrappers). `batch` gives the labels, a
    mixture's `loss_weights` and the real tokens (for the router term).
    """
    unwrapped = unwrapped_model(model)
    head = unwrapped.get_output_embeddings()
    labels = batch["labels"]
    softcap = final_logit_softcap(unwrapped)
    taken = []

    def loss_from_hidden_states(layer, args):
        if taken:
            if taken[0] is None:  # head_loss calling a layer other than nn.Linear
                return None
            raise RuntimeError(f"{type(unwrapped).__name__} called its output layer twice")
        hidden = args[0]
        if hidden.shape[0] == 1 and hidden.shape[1] == labels.numel():  # packs laid out as one
            hidden = hidden.reshape(*labels.shape, -1)  # row (model_inputs: a hybrid model's)
        if hidden.shape[:2] != labels.shape:
            raise ValueError(
                f"the output layer got hidden states {tuple(hidden.shape)} for labels "
                f"{tuple(labels.shape)}: pass no logits_to_keep"
            )
        taken.append(None)
        taken[0] = head_loss(layer, hidden, labels, batch.get("loss_weights"), softcap=softcap)
        return (hidden[..., :0, :], *args[1:])  # the model's own logits: of no position

    handle = head.register_forward_pre_hook(loss_from_hidden_states)
    try:
        outputs = model(**{key: value for key, value in inputs.items() if key != "labels"})
    finally:
        handle.remove()
    if not taken:
        raise RuntimeError(
            f"{type(unwrapped).__name__} never called its output layer "
            f"({type(head).__name__}, from get_output_embeddings())"
        )
    summed, token_losses = taken[0]
    return BatchLoss(
        summed=summed,
        label_tokens=len(token_losses),
        router=router_loss(unwrapped, outputs, batch),
        token_losses=token_losses,
        trained=trained_positions(labels),
        outputs=outputs,
    )
