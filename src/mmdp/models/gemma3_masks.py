"""Gemma 3's attention masks for packed rows, built by mmdp (the family's processor side is
mmdp.data.families.gemma3): model_inputs(batch, model) passes them as attention_mask."""

import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.models.gemma3.modeling_gemma3 import get_block_sequence_ids_for_mask


def packed_attention_masks(batch: dict, model) -> dict:
    """The attention masks of a packed Gemma 3 batch, right for every sample of every row: pass
    them as attention_mask (mmdp.models.inputs.model_inputs does); Gemma3Model uses a dict as is
    (Gemma3Model.forward).

    Why: transformers 5.23 builds the sliding-window layers' mask wrong in packed rows.
    create_masks_for_vision_model (in modeling_gemma3) hands each image's bidirectional block to
    create_causal_mask as an or_mask_function, and create_causal_mask wraps it in its
    packed-sequence function (in masking_utils.create_causal_mask), which calls it with the
    positions INSIDE each sample (remap_positions_for_packed_sequence) where the blocks are indexed
    by row position (blockwise_overlay). So every sample that does not start its row takes its
    blocks from where the row's first sample has its images: its own images turn causal and some of
    its text sees later text. The full-attention mask is right (block_sequence_ids=, applied after
    the packed wrapping, in create_causal_mask), and so is this sliding mask, built the same way
    (create_sliding_window_causal_mask). That gives OR(AND(window, causal), image block) where the
    model means AND(window, OR(causal, image block)): the same whenever an image's run fits in the
    window (256 soft tokens; windows of 512 or 1024 in every Gemma 3), which is checked.

    Under FlashAttention both masks are None (masking_utils.flash_attention_mask): harmless. The
    masks are made on the batch's device: move the batch to the model's first.
    """
    if model is None:
        raise ValueError(
            "a Gemma 3 batch needs its model, model_inputs(batch, model): mmdp builds its "
            "attention masks itself, because transformers 5.23 builds Gemma 3's sliding-window "
            "mask wrong in packed rows"
        )
    text_config = model.config.get_text_config()
    if text_config.sliding_window < model.config.mm_tokens_per_image:
        raise ValueError(
            f"an image run of {model.config.mm_tokens_per_image} tokens does not fit in the "
            f"sliding window of {text_config.sliding_window}: mmdp's Gemma 3 masks would be wrong"
        )
    token_type_ids = batch["token_type_ids"]
    blocks = get_block_sequence_ids_for_mask(token_type_ids, device=token_type_ids.device)
    return masks_with_image_blocks(model, batch["position_ids"], blocks)


def masks_with_image_blocks(model, position_ids: torch.Tensor, blocks: torch.Tensor) -> dict:
    """Gemma 3's two masks for rows whose samples restart `position_ids`: causal within each
    sample (window or not), and bidirectional within each image block of `blocks` [B, L] (an id
    per image run, -1 elsewhere). The ids must be numbered along the whole row, as
    get_block_sequence_ids_for_mask numbers them (transformers 5.23): blocks are
    matched by id across the row (masking_utils.blockwise_overlay), so ids restarting in each sample
    would let one sample's images see another's (tests/test_families.py's trap)."""
    text_config = model.config.get_text_config()
    arguments = {
        "config": text_config,
        # read for its batch size, length, dtype and device only (_preprocess_mask_arguments,
        # create_causal_mask: transformers 5.23)
        "inputs_embeds": torch.empty(*blocks.shape, 0, dtype=model.dtype, device=blocks.device),
        "attention_mask": None,
        "past_key_values": None,
        "position_ids": position_ids,
        "block_sequence_ids": blocks,
    }
    return {
        "full_attention": create_causal_mask(**arguments),
        "sliding_attention": create_sliding_window_causal_mask(**arguments),
    }
