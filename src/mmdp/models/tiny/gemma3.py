"""A tiny random Gemma3ForConditionalGeneration, for tests on CPU (its processor side:
mmdp.data.families.gemma3)."""

import torch
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    SiglipVisionConfig,
)

from mmdp.data.families.gemma3 import PATCH_SIZE


def tiny_config(processor) -> Gemma3Config:
    """The smallest Gemma 3 that shows what packing can break: a sliding-window layer (window 16,
    shorter than the samples, longer than an image's run) and a global one, SigLIP sized to
    `processor`'s images, token ids aligned with its tokenizer."""
    tokenizer = processor.tokenizer
    side = processor.image_processor.size["height"]
    text = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],  # the default pattern has 5:1
        sliding_window=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<end_of_turn>")],
    )
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=side,
        patch_size=PATCH_SIZE,
        vision_use_head=False,
    )
    return Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=processor.image_seq_length,  # a square dividing (side / 14)^2
        image_token_index=tokenizer.image_token_id,
        boi_token_index=tokenizer.boi_token_id,
        eoi_token_index=tokenizer.eoi_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def tiny_model(processor, seed: int = 0, attn_implementation: str = "sdpa"):
    """A random Gemma3ForConditionalGeneration of tiny_config, float32, in eval mode.

    Every parameter is drawn again (normal, std 0.3): Gemma 3's own initialisation zeroes the image
    projection (Gemma3PreTrainedModel._init_weights, transformers 5.23) and its (1 + w) norm
    weights, so a fresh model feeds all-zero image embeddings and no test could tell one image from
    another.
    """
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration._from_config(
        tiny_config(processor), attn_implementation=attn_implementation, dtype=torch.float32
    )
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model.eval()
