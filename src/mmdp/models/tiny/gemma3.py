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
from mmdp.models.tiny import VISION, random_model, text_config


def tiny_model(processor, seed: int = 0, attn_implementation: str = "sdpa"):
    """The smallest Gemma 3 that shows what packing can break, float32, in eval mode: a
    sliding-window layer (window 16, shorter than the samples, longer than an image's run) and a
    global one, SigLIP sized to `processor`'s images, token ids aligned with its tokenizer.

    Every parameter is drawn again (normal, std 0.3): Gemma 3's own initialisation zeroes the image
    projection (Gemma3PreTrainedModel._init_weights, transformers 5.23) and its (1 + w) norm
    weights, so a fresh model feeds all-zero image embeddings and no test could tell one image from
    another.
    """
    tokenizer = processor.tokenizer
    text = text_config(
        tokenizer,
        layer_types=["sliding_attention", "full_attention"],  # the default pattern has 5:1
        sliding_window=16,
        head_dim=16,
        query_pre_attn_scalar=16,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<end_of_turn>")],
    )
    vision = SiglipVisionConfig(
        **VISION,
        image_size=processor.image_processor.size["height"],
        patch_size=PATCH_SIZE,
        vision_use_head=False,
    )
    config = Gemma3Config(
        text_config=Gemma3TextConfig(**text),
        vision_config=vision,
        mm_tokens_per_image=processor.image_seq_length,  # a square dividing (side / 14)^2
        image_token_index=tokenizer.image_token_id,
        boi_token_index=tokenizer.boi_token_id,
        eoi_token_index=tokenizer.eoi_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = random_model(Gemma3ForConditionalGeneration, config, seed, attn_implementation)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model
