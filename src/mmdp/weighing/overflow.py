"""Over-long rows fitted, by choice: PackingConfig(overflow="truncate"), --overflow truncate.

By default a row over the token budget is dropped (`too_long`). With overflow="truncate" it is
kept, cut to its first max_length tokens: text is cut from the end of the conversation, as
LLaMA-Factory's `cutoff_len` and ms-swift's `truncation_strategy="right"` cut it. Two rules:

1. Never inside an image's or video's tokens. Every image and video of the row is kept whole
   (its pixels go to the model, so all its tokens must too): a row whose last image or video
   ends past max_length (`media_end`) cannot be cut and stays `too_long`.
2. Never a sample without a trained token: a row with no reply token in its first max_length
   tokens (the first is never trained in a pack) stays `too_long`.

Example (`cut_length`): max_length 8, a row of 12 tokens whose image ends at token 3 and whose
reply starts at token 5 is cut to 8; with its image ending at token 9, it is not (0).

The cut depends on the row's tokens, its family and max_length alone, so the planned weight
(`fit_over_long`, before planning) and the built sample (`truncate_sample`, when its pack is
built) are the same length: build_pack checks it.
"""

import numpy as np
import torch

from mmdp import config
from mmdp.batch import TOKEN_INPUTS
from mmdp.data.images import undecoded
from mmdp.packing.weights import Weights


def cut_length(labels: torch.Tensor, media_ends_at: int, max_length: int) -> int:
    """The length a row of `labels` is kept at: its own when it fits, max_length when it can be
    cut there (rules 1 and 2 of the module docstring), 0 when it cannot.

    >>> reply = torch.tensor([-100] * 5 + [7] * 7)  # 12 tokens, the reply from token 5
    >>> cut_length(reply, 3, max_length=8), cut_length(reply, 9, max_length=8)  # image ends 3, 9
    (8, 0)
    >>> cut_length(reply, media_ends_at=3, max_length=5)  # no trained token in the first 5
    0
    """
    if len(labels) <= max_length:
        return len(labels)
    if media_ends_at > max_length:
        return 0
    trained = bool((labels[1:max_length] != config.IGNORE_INDEX).any())
    return max_length if trained else 0


def media_end(family, input_ids: torch.Tensor) -> int:
    """Where the row's last image or video ends: the position after its last feature token or
    closing token (the family's `media_closing_tokens`: Qwen-VL's <|vision_end|>, Gemma 3's
    <end_of_image>), 0 without media. A cut at or after it keeps every image and video whole."""
    closing = family.tokenizer.convert_tokens_to_ids(list(family.media_closing_tokens))
    ids = torch.tensor([*family.feature_token_ids, *closing], dtype=input_ids.dtype)
    found = torch.isin(input_ids, ids).nonzero()
    return int(found[-1]) + 1 if len(found) else 0


def truncate_sample(sample: dict, max_length: int, family) -> dict:
    """A built sample (ModelFamily.make_sample) over max_length, cut as `cut_length` says, with
    every per-token input cut alike (position_ids along its last dimension: a token's position
    never depends on what follows it) and `truncated` True; a sample that fits is returned as it
    is, and one that cannot be cut is left over-long (build_pack refuses its planned length)."""
    if sample["drop_reason"] is not None or len(sample["input_ids"]) <= max_length:
        return sample
    length = cut_length(sample["labels"], media_end(family, sample["input_ids"]), max_length)
    if not length:
        return sample
    cut = {
        key: sample[key][:length] for key in ("input_ids", "labels", *TOKEN_INPUTS) if key in sample
    }
    if "position_ids" in sample:
        cut["position_ids"] = sample["position_ids"][..., :length]
    return {**sample, **cut, "truncated": True}


def fit_over_long(weights: Weights, dataset, config) -> tuple[Weights, np.ndarray]:
    """(weights, rows cut): what a PackedDataset of `dataset` (a VQADataset) plans from under
    `config`. With overflow="truncate", every usable row over max_length that can be cut weighs
    its cut length (`cut_length`, on the tokens the family's `tokenize` gives, read from the image
    and video headers: no pixel decoded); the rows that cannot be cut keep their length, and the
    planner drops them (`too_long`). Only the over-long rows are tokenized (a few in most
    datasets). With overflow="drop", `weights` as they are, and no row cut."""
    if config.overflow != "truncate":
        return weights, np.zeros(0, dtype=np.int64)
    max_length, family = config.max_length, dataset.family
    over = np.flatnonzero((weights.reasons == 0) & (weights.lengths > max_length))
    if not len(over):
        return weights, over
    family.read_settings()
    lengths = weights.lengths.copy()
    media = undecoded(dataset.dataset).select(over.tolist())
    for row, item in zip(over.tolist(), media):
        input_ids, labels, _, _ = family.tokenize(item["texts"], item["images"], item.get("videos"))
        lengths[row] = cut_length(labels, media_end(family, input_ids), max_length) or lengths[row]
    cut = over[lengths[over] <= max_length]
    return Weights(lengths, weights.image_counts, weights.reasons, weights.patch_counts), cut
