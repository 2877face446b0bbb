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
"""

import torch
from torch import nn

from mmdp import config
from mmdp.packing.batch import sample_ids


def next_token_labels(labels: torch.Tensor) -> torch.Tensor:
    """The label each position is trained to predict: logit t predicts label t + 1 (the model's
    own shift). Shifting the labels, not the logits, leaves the large logits tensor uncopied.

    >>> next_token_labels(torch.tensor([[-100, 7, 8, 9]]))
    tensor([[   7,    8,    9, -100]])
    """
    return nn.functional.pad(labels[:, 1:], (0, 1), value=config.IGNORE_INDEX)


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss of every position, [B, L], float32: 0 where the next label is ignored."""
    return nn.functional.cross_entropy(
        logits.flatten(0, 1).float(),
        next_token_labels(labels).flatten(),
        ignore_index=config.IGNORE_INDEX,
        reduction="none",
    ).view(labels.shape)


def summed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The sum (not the mean) of the token losses, with the model's own shift: logit t predicts
    label t + 1. Sums add up across batches of any shape, which lets padded and packed batches of
    the same samples be compared, and ranks of a DDP run be normalised together."""
    return nn.functional.cross_entropy(
        logits.flatten(0, 1).float(),
        next_token_labels(labels).flatten(),
        ignore_index=config.IGNORE_INDEX,
        reduction="sum",
    )


def label_tokens(labels: torch.Tensor) -> int:
    """How many positions a batch trains: the denominator of the mean over label tokens."""
    return int((next_token_labels(labels) != config.IGNORE_INDEX).sum())


def mean_over_tokens(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Every label token weighs the same (what transformers computes): use it by default; a
    sample with a long reply counts more than one with a short reply, as in pretraining.

    Padded and packed batches of the same samples give the same value.
    """
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

    DDP-exact form (as mmdp.training.ddp for summed_loss): add up summed_weighted_loss over
    micro-batches, all-reduce label_tokens over ranks and micro-batches, and backward
    summed_weighted_loss * world_size / tokens on each micro-batch. The trainers do it:
    mmdp.training.recipes.micro_batch_loss (given the batch) and MMDPTrainer's token_loss.
    """
    return summed_weighted_loss(logits, batch) / label_tokens(batch["labels"])
