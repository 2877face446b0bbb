"""Gemma 3's and Gemma 4's attention masks for packed rows, built by mmdp (the families'
processor side is mmdp.data.families.gemma3 and .gemma4): model_inputs(batch, model) passes them
as attention_mask."""

import torch
from transformers.masking_utils import (
    and_masks,
    blockwise_overlay,
    create_causal_mask,
    sliding_window_overlay,
)
from transformers.models.gemma3.modeling_gemma3 import get_block_sequence_ids_for_mask


def packed_attention_masks(batch: dict, model) -> dict:
    """The attention masks of a packed Gemma 3 or Gemma 4 batch, right for every sample of every
    row: pass them as attention_mask (mmdp.models.inputs.model_inputs does); Gemma3Model and
    Gemma4Model use a dict as is (their forward).

    What each model builds for a sample alone (create_masks_for_vision_model in modeling_gemma3
    and modeling_gemma4, transformers 5.23), an image block being one image's (or one video
    frame's) run of soft tokens:

        Gemma 3   full layers: OR(causal, block)   sliding layers: AND(window, OR(causal, block))
        Gemma 4   full layers: causal              sliding layers: the same as Gemma 3's
                  (with use_bidirectional_attention="vision", the 26B and 31B models; the
                  smaller ones have none, and every layer is causal: Gemma4Model.forward)

    Why mmdp builds them: transformers 5.23 builds the sliding-window mask wrong in packed rows.
    It hands the image blocks to create_causal_mask as an or_mask_function, and create_causal_mask
    wraps it in its packed-sequence function (in masking_utils.create_causal_mask), which calls it
    with the positions INSIDE each sample (remap_positions_for_packed_sequence) where the blocks
    are indexed by row position (blockwise_overlay). So every sample that does not start its row
    takes its blocks from where the row's first sample has its images: its own images turn causal
    and some of its text sees later text.

    Under FlashAttention both masks are None (masking_utils.flash_attention_mask): harmless. The
    masks are made on the batch's device: move the batch to the model's first.
    """
    if model is None:
        raise ValueError(
            f"a {batch['model_family']} batch needs its model, model_inputs(batch, model): mmdp "
            "builds its attention masks itself, because transformers 5.23 builds its "
            "sliding-window mask wrong in packed rows"
        )
    if model.config.model_type != "gemma4":
        types = batch["token_type_ids"]
        blocks = get_block_sequence_ids_for_mask(types, device=types.device)
        return masks_with_image_blocks(model, batch["position_ids"], blocks)
    from transformers.models.gemma4.modeling_gemma4 import get_block_sequence_ids_for_mask as ids

    bidirectional = model.config.get_text_config().use_bidirectional_attention
    if bidirectional not in ("vision", None):
        raise ValueError(
            f"mmdp packs Gemma 4 with causal text; this model's use_bidirectional_attention is "
            f"{bidirectional!r}, not 'vision' or None"
        )
    types = batch["mm_token_type_ids"] * (bidirectional == "vision")  # all 0: no image blocks
    blocks = ids(types, device=types.device)  # images' and video frames' runs
    return masks_with_image_blocks(model, batch["position_ids"], blocks, full_blocks=False)


def masks_with_image_blocks(
    model, position_ids: torch.Tensor, blocks: torch.Tensor, *, full_blocks: bool = True
) -> dict:
    """The two masks (see packed_attention_masks) for rows whose samples restart `position_ids`,
    `blocks` [B, L] an id per image run, -1 elsewhere; the image blocks in the full-attention
    layers too with `full_blocks` (Gemma 3).

    Built over the row's positions, where the blocks are indexed: causal, OR the token's image
    block, AND the token's own sample, AND (sliding layers) the window. No position_ids go to
    create_causal_mask, so that it calls the functions with row positions, never positions inside
    a sample. A block never leaves its sample: ids restarting in each sample are as good as ids
    numbered along the row."""
    text_config = model.config.get_text_config()
    sample = (position_ids == 0).cumsum(-1)  # each token's sample (or padding run) in its row

    def same_sample(batch_idx, head_idx, q_idx, kv_idx):
        return sample[batch_idx, q_idx] == sample[batch_idx, kv_idx]

    images = blockwise_overlay(blocks)
    window = and_masks(sliding_window_overlay(text_config.sliding_window), same_sample)
    arguments = {
        "config": text_config,
        # read for its batch size, length, dtype and device only (_preprocess_mask_arguments,
        # create_causal_mask: transformers 5.23)
        "inputs_embeds": torch.empty(*blocks.shape, 0, dtype=model.dtype, device=blocks.device),
        "attention_mask": None,
        "past_key_values": None,
        "position_ids": None,
    }
    return {
        "full_attention": create_causal_mask(
            **arguments,
            or_mask_function=images if full_blocks else None,
            and_mask_function=same_sample,
        ),
        "sliding_attention": create_causal_mask(
            **arguments, or_mask_function=images, and_mask_function=window
        ),
    }
