"""The batch contract: what a packed batch holds, how one is built and collated, and the keys a
model takes (mmdp.models.inputs). Both loaders (mmdp.loading.packed_dataset,
mmdp.loading.streaming) build their batches here, and every consumer reads them
through the functions here.

A batch of B packs, each a row of L = max_length tokens:

    input_ids        [B, L]  the samples of each pack, one after the other, then padding
    labels           [B, L]  -100 on padding, on non-reply tokens, and on the FIRST token of each
                             sample (so no sample is trained to predict the start of the next one)
    position_ids     [B, L]  restart at 0 for every sample (and for the padding run, a segment of
                             its own): eager, sdpa and flex_attention build the per-sample
                             (block-diagonal) causal mask from them
    cu_seq_lens_q/k  [S + 1] int32: where each of the S segments (samples and padding runs) starts
                             in the B * L tokens read as one flat row, then B * L. FlashAttention
                             needs them: it reads restarting position_ids only when B == 1
    max_length_q/k   int     the longest segment (a Python int, as FlashAttention takes it)
    loss_weights     [B, L]  float32, only from a mixture with loss weights: each token's
                             sample's weight (0 on padding), for
                             mmdp.training.loss.weighted_mean_over_tokens
    real_token_mask  [B, L]  bool, True on real tokens. Deliberately NOT called attention_mask: a
                             2-D attention_mask makes transformers drop the per-sample mask, and
                             samples would attend to each other. Read it with
                             `real_token_mask(batch)`, as for padded batches.
    sample_index     [n]     the dataset rows of the batch, in order; samples_per_pack [B] how
                             many in each pack, patches_per_pack [B] their vision-encoder patches
    pixel_values     [N, 3, S, S] every image, in sample order; sample_of_image [N]: the position
                             in sample_index of the sample each image belongs to
    pixel_values_videos, video_grid_thw, second_per_grid_ts   every video, in sample order (a
                             family that takes video: Qwen-VL), each whole in one pack; its
                             patches count in patches_per_pack
    batch_index, epoch       where the batch is: its number in the epoch (set by the dataset)
                             and the epoch (set by the loader, PackedDataLoader)
    dropped, converted       rows dropped while the batch was built, by reason; images
                             converted to RGB, by mode
    dropped_rows             [(row, reason)]: which rows those were (a planned loader's rows;
                             the epoch report counts them per source of a mixture)
    filler                   True only in a batch that trains nothing (`filler_batch`): a rank's
                             batch in a last step of fewer packs than ranks, or what pads an
                             epoch's last optimizer step under Trainer
    model_family, model_settings   (a real family) its name ("qwen2_5_vl"), by which
                             model_inputs asks the family what the model takes (a name, not the
                             class: a saved batch loads with torch.load(weights_only=True)), and
                             what the batch assumes of the model's config ({"vision_config.tokens_per_second": 2, ...}), which
                             model_inputs checks

Example: two packs of 8 tokens, samples of 3 and 4 tokens in the first, of 6 in the second
(tests/test_batch.py builds it from fake samples):

    position_ids   [[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 5, 0, 1]]
    cu_seq_lens_q  [0, 3, 7, 8, 14, 16]        (the padding runs are the segments 7-8 and 14-16)
    max_length_q   6

For one pack without padding these are exactly what transformers' DataCollatorWithFlattening
(return_flash_attn_kwargs=True, return_position_ids=True) returns for the same samples; a test
checks it. Unlike it, mmdp keeps fixed-length rows (a padding tail, as its own segment) and
several rows per batch.
"""

from collections import Counter

import numpy as np
import torch

from mmdp import config
from mmdp.data.families.base import VIDEO_INPUTS, VISION_INPUTS, concatenate_vision

# The per-token inputs some models take (Gemma 3, Qwen-VL): every family's `token_keys`
# (tests/test_family_dispatch.py checks it is their union), for the code that has no family.
TOKEN_INPUTS = ("token_type_ids", "mm_token_type_ids")


def build_pack(
    samples: list[dict],
    planned_lengths: list[int],
    *,
    max_length: int,
    pad_token_id: int,
    batch_index: int,
    family=None,
) -> dict:
    """One planned pack, from its samples (VQADataset items): the usable ones laid out in a row,
    the others counted in `dropped` by reason (a broken image is found only now).

    `planned_lengths` are the tokens the plan gave each sample; a sample built with another
    length would break the plan's budget, so it is an error, not a drop. `family` (the
    ModelFamily that built the samples) gives the pack its keys and shapes even when no sample
    is usable: see layout_pack.
    """
    for sample, planned in zip(samples, planned_lengths):
        if sample["drop_reason"] is None and len(sample["input_ids"]) != planned:
            raise RuntimeError(
                f"row {sample['row']}: planned {planned} tokens, tokenized "
                f"{len(sample['input_ids'])}; the tokenizer is not deterministic"
            )
    dropped_rows = [(s["row"], s["drop_reason"]) for s in samples if s["drop_reason"] is not None]
    usable = [s for s in samples if s["drop_reason"] is None]
    return {
        **layout_pack(usable, max_length, pad_token_id, family),
        "batch_index": batch_index,
        "dropped": Counter(reason for _, reason in dropped_rows),
        "dropped_rows": dropped_rows,
    }


def layout_pack(samples: list[dict], max_length: int, pad_token_id: int, family=None) -> dict:
    """Lay out usable samples (VQADataset items) one after the other in a row of max_length tokens.

    Returns one pack: the [L] tensors of the batch above (position_ids [4, L] for a model with
    4-row positions), plus `seq_lens` (the segments' lengths, the padding run included) and
    each sample's vision inputs, which the collator concatenates once per batch.

    The pack's shapes and per-token keys come from `family` (its `position_rows` and
    `token_keys`), not from the samples: a pack whose samples all failed while built (a large
    image with a sound header and broken data is often alone in its pack) is then one run of
    padding with the same keys and shapes as its neighbours, and stacks with them. Without a
    family (tests of fake samples) they come from the first sample.
    """
    seq_lens = [len(s["input_ids"]) for s in samples]
    used = sum(seq_lens)
    if used > max_length:
        raise ValueError(f"{used} tokens do not fit in a pack of max_length {max_length}")
    pad = max_length - used
    labels = [s["labels"].clone() for s in samples]
    for sample_labels in labels:
        sample_labels[0] = config.IGNORE_INDEX  # never predict a sample from the one before
    positions = [s.get("position_ids", torch.arange(n)) for s, n in zip(samples, seq_lens)]
    if family is not None:
        rows, token_keys = family.position_rows, family.token_keys
    else:
        rows = positions[0].shape[:-1] if positions else ()
        token_keys = [key for key in TOKEN_INPUTS if samples and key in samples[0]]
    # the padding run, its own segment: [pad], or [4, pad] for Qwen-VL's 4-row positions
    positions.append(torch.arange(pad).expand(*rows, pad))
    return {
        "input_ids": torch.cat(
            [*(s["input_ids"] for s in samples), torch.full((pad,), pad_token_id)]
        ),
        "labels": torch.cat([*labels, torch.full((pad,), config.IGNORE_INDEX)]),
        "position_ids": torch.cat(positions, dim=-1),
        **{
            key: torch.cat([*(s[key] for s in samples), torch.zeros(pad, dtype=torch.long)])
            for key in token_keys
        },
        "real_token_mask": torch.arange(max_length) < used,
        **token_loss_weights(samples, seq_lens, pad),
        "seq_lens": seq_lens + ([pad] if pad else []),
        "sample_index": [s["row"] for s in samples],
        "vision": [
            {key: s[key] for key in VISION_INPUTS + VIDEO_INPUTS if key in s} for s in samples
        ],
        "image_counts": [s["image_count"] for s in samples],
        "patches": sum(s["patches"] for s in samples),
        "converted": sum((Counter(s["converted"]) for s in samples), Counter()),
    }


def token_loss_weights(samples: list[dict], seq_lens: list[int], pad: int) -> dict:
    """{"loss_weights": float32 [L]}: each token gets its sample's loss weight (a mixture's
    per-source weight), 0 on padding; {} when no sample carries one."""
    if not any("loss_weight" in s for s in samples):
        return {}
    weights = [
        torch.full((n,), float(s.get("loss_weight", 1.0))) for s, n in zip(samples, seq_lens)
    ]
    return {"loss_weights": torch.cat([*weights, torch.zeros(pad)])}


def collate_packs(packs: list[dict], family=None) -> dict:
    """Stack packs (from build_pack, all of one planned batch) into a batch.

    `family` (a mmdp.data.families.base.ModelFamily) collates the vision inputs its model takes, and
    puts its name in the batch (`model_family`); without one, each vision input is concatenated
    along its first dimension, which is what TinyVLM, Qwen-VL, LLaVA-OneVision and Gemma 3 take.
    Packs marked `filler` (a rank's filler batch, mmdp.planning.planner) make a
    `filler_batch`.
    """
    batch_indices = {p["batch_index"] for p in packs}
    assert len(batch_indices) == 1, f"packs of several planned batches collated: {batch_indices}"
    max_length = len(packs[0]["input_ids"])
    cu_seq_lens, sample_of_image, samples_before = [0], [], 0
    for row, p in enumerate(packs):
        cu_seq_lens += (row * max_length + np.cumsum(p["seq_lens"])).tolist()
        for i, count in enumerate(p["image_counts"]):
            sample_of_image += [samples_before + i] * count
        samples_before += len(p["sample_index"])
    dropped = sum((Counter(p["dropped"]) for p in packs), Counter())
    converted = sum((Counter(p["converted"]) for p in packs), Counter())
    cu_seq_lens = torch.tensor(cu_seq_lens, dtype=torch.int32)
    longest = max(max(p["seq_lens"]) for p in packs)
    no_weights = torch.zeros(max_length)
    positions = [p["position_ids"] for p in packs]
    samples = [
        {**vision, "image_count": count}
        for p in packs
        for vision, count in zip(p["vision"], p["image_counts"])
    ]
    batch = {
        "input_ids": torch.stack([p["input_ids"] for p in packs]),
        "labels": torch.stack([p["labels"] for p in packs]),
        # [B, L], or [4, B, L] for Qwen-VL's 4-row positions
        "position_ids": torch.stack(positions, dim=positions[0].dim() - 1),
        **{key: torch.stack([p[key] for p in packs]) for key in TOKEN_INPUTS if key in packs[0]},
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": longest,
        "max_length_k": longest,
        "real_token_mask": torch.stack([p["real_token_mask"] for p in packs]),
        # a pack whose samples were all dropped while built has no weights: zeros
        **(
            {"loss_weights": torch.stack([p.get("loss_weights", no_weights) for p in packs])}
            if any("loss_weights" in p for p in packs)
            else {}
        ),
        "sample_index": torch.tensor(
            [r for p in packs for r in p["sample_index"]], dtype=torch.long
        ),
        "samples_per_pack": torch.tensor([len(p["sample_index"]) for p in packs], dtype=torch.long),
        "patches_per_pack": torch.tensor([p["patches"] for p in packs], dtype=torch.long),
        **(family.collate_vision(samples) if family else concatenate_vision(samples)),
        "sample_of_image": torch.tensor(sample_of_image, dtype=torch.long),
        "batch_index": batch_indices.pop(),
        "dropped": dict(dropped),
        "dropped_rows": [row for p in packs for row in p.get("dropped_rows", ())],
        "converted": dict(converted),
        # the family's name, not the family (it holds its processor) nor its class (torch.load
        # refuses to unpickle a class with weights_only=True): model_inputs looks the name up
        **(
            {"model_family": family.name, "model_settings": family.model_settings()}
            if family and family.name != "tiny"
            else {}
        ),
    }
    return filler_batch(batch) if packs[0].get("filler") else batch


def filler_batch(batch: dict) -> dict:
    """A copy of `batch` that trains nothing: every label -100 and no sample, `filler` True.

    Its loss and gradient are exactly 0 and it counts no label token, yet the model runs it as
    any batch: a rank that has no batch of its own at a step (the last step of an epoch with
    fewer packs than ranks; mmdp.planning.planner) runs it while the other ranks train, so
    that DDP's and FSDP's collectives meet, and Trainer pads an epoch's short last optimizer step
    with it (mmdp.training.trainer.LoaderForTrainer)."""
    out = dict(batch, filler=True)
    out["labels"] = torch.full_like(batch["labels"], config.IGNORE_INDEX)
    out["sample_index"] = batch["sample_index"][:0]
    out["samples_per_pack"] = torch.zeros_like(batch["samples_per_pack"])
    out["real_token_mask"] = torch.zeros_like(batch["real_token_mask"])
    out["dropped"], out["converted"] = {}, {}  # counted with the batch it copies
    out["dropped_rows"] = []
    # no sample, so no image or patch of one (the vision inputs stay: the model runs them);
    # keys a hand-built batch may leave out stay out
    if "sample_of_image" in batch:
        out["sample_of_image"] = batch["sample_of_image"][:0]
    for key in ("patches_per_pack", "loss_weights"):
        if key in batch:
            out[key] = torch.zeros_like(batch[key])
    return out


def real_token_mask(batch: dict) -> torch.Tensor:
    """Which tokens of any mmdp batch are real (True) rather than padding: bool [B, L].

    Every consumer (epoch reports, figures, tokens per second) asks this function, never a key:
    padded batches (stages 2-3) mark real tokens with `attention_mask`, which the model takes;
    packed batches (stage 5) with `real_token_mask`, because a 2-D attention_mask would undo
    their per-sample masking.
    """
    if "real_token_mask" in batch:
        return batch["real_token_mask"]
    return batch["attention_mask"].bool()


def sample_ids(batch: dict) -> torch.Tensor:
    """Which sample each token of any mmdp batch belongs to, [B, L]; -1 on padding.

    A padded batch (stages 2-3) holds one sample per row; a packed batch (stage 5) several per
    row, found from its segments (cu_seq_lens_q over the B * L tokens read as one flat row).
    Ids are unique within the batch, not consecutive. Example, one pack of 8 tokens holding
    samples of 3 and 4 tokens:

    >>> mask = torch.tensor([[True] * 7 + [False]])
    >>> sample_ids({"real_token_mask": mask, "cu_seq_lens_q": torch.tensor([0, 3, 7, 8])})
    tensor([[ 0,  0,  0,  1,  1,  1,  1, -1]])
    """
    real = real_token_mask(batch)
    if "cu_seq_lens_q" in batch:
        flat = torch.arange(real.numel(), device=real.device)
        bounds = batch["cu_seq_lens_q"][1:].to(device=real.device, dtype=torch.long)
        ids = torch.searchsorted(bounds, flat, right=True).view(real.shape)
    else:
        ids = torch.arange(real.shape[0], device=real.device)[:, None].expand(real.shape)
    return torch.where(real, ids, -1)
