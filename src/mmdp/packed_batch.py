"""What a packed batch is: one pack laid out in a row, packs collated into a batch, and the keys a
model takes. Shared by the planned loader (mmdp.packed_dataset) and the streaming one
(mmdp.streaming).

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
    real_token_mask  [B, L]  bool, True on real tokens. Deliberately NOT called attention_mask: a
                             2-D attention_mask makes transformers drop the per-sample mask, and
                             samples would attend to each other. Read it with
                             mmdp.collate.real_token_mask(batch), as for padded batches.
    sample_index     [n]     the dataset rows of the batch, in order; samples_per_pack [B] how
                             many in each row
    images           [N, 3, S, S] every image, in sample order; sample_of_image [N]: the position
                             in sample_index of the sample each image belongs to
    batch_index, dropped, converted   where the batch is in the epoch; rows dropped while it was
                             built, by reason; images converted to RGB, by mode

Example: two packs of 8 tokens, samples of 3 and 4 tokens in the first, of 6 in the second:

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
from mmdp.attention import check_transformers

# The keys of a packed batch that a Hugging Face causal LM takes, under every attention
# implementation: eager, sdpa and flex_attention use position_ids and ignore the rest; FlashAttention
# uses cu_seq_lens_* and max_length_* (its varlen kernels).
MODEL_INPUTS = (
    "input_ids", "labels", "position_ids",
    "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
)  # fmt: skip


def layout_pack(samples: list[dict], max_length: int, pad_token_id: int, image_size: int) -> dict:
    """Lay out usable samples (VQADataset items) one after the other in a row of max_length tokens.

    Returns one pack: the [L] tensors of the batch above, plus `seq_lens` (the segments' lengths,
    the padding run included) and the images per sample, which `collate_packs` concatenates once.
    """
    seq_lens = [len(s["input_ids"]) for s in samples]
    used = sum(seq_lens)
    if used > max_length:
        raise ValueError(f"{used} tokens do not fit in a pack of max_length {max_length}")
    pad = max_length - used
    labels = [s["labels"].clone() for s in samples]
    for sample_labels in labels:
        sample_labels[0] = config.IGNORE_INDEX  # never predict a sample from the one before
    converted = Counter()
    for s in samples:
        converted.update(s["converted"])
    return {
        "input_ids": torch.cat(
            [*(s["input_ids"] for s in samples), torch.full((pad,), pad_token_id)]
        ),
        "labels": torch.cat([*labels, torch.full((pad,), config.IGNORE_INDEX)]),
        "position_ids": torch.cat([torch.arange(n) for n in seq_lens + [pad]]),
        "real_token_mask": torch.arange(max_length) < used,
        "seq_lens": seq_lens + ([pad] if pad else []),
        "sample_index": [s["row"] for s in samples],
        "images": [s["images"] for s in samples],
        "sample_of_image": [i for i, s in enumerate(samples) for _ in range(len(s["images"]))],
        "image_size": image_size,
        "converted": converted,
    }


def collate_packs(packs: list[dict]) -> dict:
    """Stack packs (from layout_pack, each with its batch_index and dropped) into a batch."""
    max_length = len(packs[0]["input_ids"])
    cu_seq_lens, sample_of_image, samples_before = [0], [], 0
    for row, p in enumerate(packs):
        cu_seq_lens += (row * max_length + np.cumsum(p["seq_lens"])).tolist()
        sample_of_image += [samples_before + i for i in p["sample_of_image"]]
        samples_before += len(p["sample_index"])
    dropped, converted = Counter(), Counter()
    for p in packs:
        dropped.update(p["dropped"])
        converted.update(p["converted"])
    batch_indices = {p["batch_index"] for p in packs}
    assert len(batch_indices) == 1, f"packs of several planned batches collated: {batch_indices}"
    cu_seq_lens = torch.tensor(cu_seq_lens, dtype=torch.int32)
    max_segment = max(max(p["seq_lens"]) for p in packs)
    image_size = packs[0]["image_size"]
    return {
        "input_ids": torch.stack([p["input_ids"] for p in packs]),
        "labels": torch.stack([p["labels"] for p in packs]),
        "position_ids": torch.stack([p["position_ids"] for p in packs]),
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": max_segment,
        "max_length_k": max_segment,
        "real_token_mask": torch.stack([p["real_token_mask"] for p in packs]),
        "sample_index": torch.tensor(
            [r for p in packs for r in p["sample_index"]], dtype=torch.long
        ),
        "samples_per_pack": torch.tensor([len(p["sample_index"]) for p in packs], dtype=torch.long),
        "images": torch.cat(
            [images for p in packs for images in p["images"]]
            or [torch.zeros(0, 3, image_size, image_size)]
        ),
        "sample_of_image": torch.tensor(sample_of_image, dtype=torch.long),
        "batch_index": batch_indices.pop(),
        "dropped": dict(dropped),
        "converted": dict(converted),
    }


def model_inputs(batch: dict) -> dict:
    """The keys of a packed batch that a Hugging Face causal LM takes. Call

        model(**model_inputs(batch), use_cache=False)

    and each sample sees only itself, under eager, sdpa, flex_attention and FlashAttention alike
    (see the README's three traps for why use_cache=False and no attention_mask). Raises on a
    transformers too old to build the per-sample mask from position_ids.
    """
    check_transformers()
    return {key: batch[key] for key in MODEL_INPUTS}
