"""Collators for stages 2 and 3: pad every sample of a batch to one length.

Both take the list of dicts VQADataset returns and produce one dict of tensors:
    input_ids       int64 [B, L]   padded on the right with pad_token_id
    labels          int64 [B, L]   -100 on padding
    attention_mask  int64 [B, L]   1 on real tokens, 0 on padding: the only reliable padding
                                   marker, since SmolLM2's pad id is also its <|im_end|> token
                                   (read it with mmdp.batch.real_token_mask(batch))
    pixel_values    float [N, 3, S, S]  every image of the batch, in sample order
    sample_of_image int64 [N]      which row of the batch each image belongs to
    sample_index    int64 [B]      the dataset row of each batch row
    dropped         {reason: count} rows left out of this batch, and why
    dropped_rows    [(row, reason)]: which rows those were
    converted       {mode: count}  images converted to RGB
"""

from collections import Counter

import torch
from torch.utils.data import DataLoader

from mmdp import config
from mmdp.drop_reasons import TOO_LONG


def pad_batch(samples: list[dict], pad_token_id: int, length: int | None = None) -> dict:
    """Pad the usable samples to `length` (default: the longest of them) and stack them."""
    dropped_rows = [(s["row"], s["drop_reason"]) for s in samples if s["drop_reason"] is not None]
    samples = [s for s in samples if s["drop_reason"] is None]
    if length is None:
        length = max((len(s["input_ids"]) for s in samples), default=0)
    batch_size = len(samples)
    input_ids = torch.full((batch_size, length), pad_token_id, dtype=torch.long)
    labels = torch.full((batch_size, length), config.IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((batch_size, length), dtype=torch.long)
    for i, sample in enumerate(samples):
        n = len(sample["input_ids"])
        input_ids[i, :n] = sample["input_ids"]
        labels[i, :n] = sample["labels"]
        attention_mask[i, :n] = 1
    pixels = [s["pixel_values"] for s in samples]
    image_size = config.IMAGE_SIZE if not pixels else pixels[0].shape[-1]
    converted = Counter()
    for s in samples:
        converted.update(s["converted"])
    return {
        "input_ids": input_ids,
        "labels": labels,
        "attention_mask": attention_mask,
        "pixel_values": torch.cat(pixels or [torch.zeros(0, 3, image_size, image_size)]),
        "sample_of_image": torch.tensor(
            [i for i, s in enumerate(samples) for _ in s["pixel_values"]], dtype=torch.long
        ),
        "sample_index": torch.tensor([s["row"] for s in samples], dtype=torch.long),
        "dropped": dict(Counter(reason for _, reason in dropped_rows)),
        "dropped_rows": dropped_rows,
        "converted": dict(converted),
    }


class NaivePadCollator:
    """Stage 2: pad every sample to the longest sample of its batch."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, samples: list[dict]) -> dict:
        return pad_batch(samples, self.pad_token_id)


class ConstrainedPadCollator:
    """Stage 3: drop samples longer than max_length (counted as "too_long"), pad to max_length."""

    def __init__(self, pad_token_id: int, max_length: int):
        self.pad_token_id = pad_token_id
        self.max_length = max_length

    def __call__(self, samples: list[dict]) -> dict:
        samples = [
            {"row": s["row"], "drop_reason": TOO_LONG}
            if s["drop_reason"] is None and len(s["input_ids"]) > self.max_length
            else s
            for s in samples
        ]
        return pad_batch(samples, self.pad_token_id, length=self.max_length)


def stage3_batch(dataset, lengths, *, max_length: int, batch_size: int, seed: int) -> dict:
    """The batch stage 3 shows (assets/03.png), for stage 5's figure beside it: of the batches
    its DataLoader makes (`batch_size` samples of a shuffle seeded with `seed`), the first with a
    sample longer than `max_length`, else the first; collated by ConstrainedPadCollator.
    `lengths`, each sample's tokens (its weight), find it without tokenizing or decoding the
    other batches. (Stage 3 shows the first batch that drops a sample for any reason: on rows
    with none unusable, such as the default ones, the same batch.)"""
    # Stage 3's very batches: a DataLoader's shuffle draws once from the generator before it
    # shuffles (its workers' seed), so a plain randperm would give other batches
    generator = torch.Generator().manual_seed(seed)
    order = DataLoader(range(len(dataset)), batch_size, shuffle=True, generator=generator)
    batches = [rows.numpy() for rows in order]
    rows = next((b for b in batches if max(lengths[b]) > max_length), batches[0])
    collate = ConstrainedPadCollator(dataset.family.pad_token_id, max_length)
    return collate([dataset[int(i)] for i in rows])
