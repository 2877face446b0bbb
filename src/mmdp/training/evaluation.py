"""Evaluate on a packed eval split, exactly: the loss over every label token of every eval
sample on every rank, and each source's (a mixture's), as one process would compute it unpacked.

    train = PackedDataset(samples, config=config, eval_ratio=0.1)  # 90% of the rows train
    eval_loader = PackedDataLoader(train.eval_dataset())            # the other 10%, each row once
    metrics = evaluate(model, eval_loader, model_inputs, device=device)
    metrics["eval_loss"]   # sum of every eval token's loss / every eval label token, all ranks

Why not transformers' evaluation loop: Trainer.evaluation_loop averages each batch's mean loss
(prediction_step's `loss.mean()`, then the mean of the gathered losses; transformers 5.23), so
a pack of a few long replies weighs as much as a pack of many short ones, and the result moves
with the packing. Here every rank adds up summed losses and label tokens (the parts of
mmdp.training.loss.batch_loss, as training computes them: the logits of the trained positions
only, so no pack's full logits are held here either), and one all-reduce at the end divides the
sums: the same number on 1 rank or 8, packed or not (tests/test_evaluation.py: 1e-5 against each
sample run alone; the mean of batch means is off by more). The loss is every token's plain
mean: a mixture's `loss_weights`, a training choice, are not applied (each source's own loss is
reported instead).

Every rank runs every batch of its share, filler batches included (a rank without a pack in the
last step, mmdp.planning.planner): they count nothing, and under FSDP every rank's forwards
meet.
"""

import contextlib

import torch
from torch import nn

from mmdp.batch import sample_ids
from mmdp.training.loop import to_device
from mmdp.training.loss import batch_loss
from mmdp.training.recipes import all_reduced


def evaluate(
    model,
    loader,
    model_inputs,
    *,
    device=None,
    autocast=contextlib.nullcontext,
    group=None,
    prefix: str = "eval",
) -> dict[str, float]:
    """One pass over `loader` (a PackedDataLoader of an eval split, this rank's share) without
    gradients; returns, over every rank of `group` (None: the world):

        {prefix}_loss           sum of every eval token's loss / every eval label token
        {prefix}_SOURCE_loss    the same over one source's samples (a mixture's VQADataset)
        {prefix}_label_tokens, {prefix}_samples

    `model_inputs(batch, model)` picks the keys the model takes (the one training uses), given
    the model without its DDP wrapper; `device`: where the batch goes (None: where it is);
    `autocast()`: the forward's context (mixed precision). The model is put in eval mode and
    back in the mode it was in.
    """
    samples = loader.dataset.dataset
    sources = samples.sources or ()
    source_of_row = None if not sources else torch.as_tensor(samples.source_of_row).long()
    # [summed loss, label tokens, samples] of everything (column 0) and of each source
    sums = torch.zeros(3, 1 + len(sources), dtype=torch.float64)
    unwrapped = getattr(model, "module", model)  # DDP's; FSDP2 keeps the model
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in loader:
                batch = batch if device is None else to_device(batch, device)
                plain = {k: v for k, v in batch.items() if k != "loss_weights"}
                with autocast():  # the logits of the trained positions only, as in training
                    parts = batch_loss(model, model_inputs(batch, unwrapped), plain)
                sums[:, 0] += torch.tensor([float(parts.summed), parts.label_tokens, 0.0])
                sums[2, 0] += len(batch["sample_index"])
                if sources:
                    sums[:, 1:] += source_sums(parts, batch, source_of_row, len(sources))
    finally:
        model.train(was_training)
    sums = all_reduced(sums, group=group).cpu()
    names = ["", *(f"_{source.name}" for source in sources)]
    metrics = {
        f"{prefix}{name}_loss": float(sums[0, i] / sums[1, i])
        for i, name in enumerate(names)
        if sums[1, i] > 0
    }
    metrics[f"{prefix}_label_tokens"] = int(sums[1, 0])
    metrics[f"{prefix}_samples"] = int(sums[2, 0])
    return metrics


def source_sums(parts, batch: dict, source_of_row: torch.Tensor, num_sources: int):
    """[summed loss, label tokens, samples] of each source's samples in the batch: [3, sources],
    from its BatchLoss (each trained position's loss).

    A position's loss belongs to the sample of the label it predicts (position t + 1), as in
    mmdp.training.loss.summed_sample_means; the k-th sample of the batch (its k-th segment that
    is not padding) is row sample_index[k] of the dataset."""
    losses, trained = parts.token_losses, parts.trained
    ids = sample_ids({**batch, "labels": batch["labels"].to(trained.device)})
    owner = nn.functional.pad(ids[:, 1:], (0, 1), value=-1)[trained]
    segments = torch.unique(ids[ids >= 0])  # sorted: the batch's samples in order
    rows = batch["sample_index"].to(owner.device)
    source_of_sample = source_of_row.to(owner.device)[rows]
    source = source_of_sample[torch.searchsorted(segments, owner)]
    out = torch.zeros(3, num_sources, dtype=torch.float64, device=owner.device)
    out[0].index_add_(0, source, losses.to(owner.device).double())
    out[1].index_add_(0, source, torch.ones_like(source, dtype=torch.float64))
    out[2].index_add_(0, source_of_sample, torch.ones_like(source_of_sample, dtype=torch.float64))
    return out.cpu()
