"""A tiny random SmolVLM or Idefics3 of the real class, for tests on CPU (its processor side:
mmdp.data.families.smolvlm)."""

import math

import transformers

from mmdp.data.families.smolvlm import PATCH_SIZES, Idefics3, SmolVLM
from mmdp.models.tiny import VISION, random_model, text_config


def tiny_model(processor, seed: int = 0, attn_implementation: str = "sdpa"):
    """A randomly initialised model of the real class, small enough for a CPU test, its token
    ids and its tiles aligned with `processor`: the vision encoder reads tiles of the
    processor's side in the patches of PATCH_SIZES, and its pixel shuffle leaves the processor's
    image_seq_len tokens a tile (SmolVLMConnector.pixel_shuffle, transformers 5.23)."""
    family = Idefics3 if isinstance(processor, transformers.Idefics3Processor) else SmolVLM
    tokenizer, tile = processor.tokenizer, processor.image_processor.max_image_size["longest_edge"]
    patch_size = PATCH_SIZES[tile]
    patches_per_side = tile // patch_size
    scale_factor = math.isqrt(patches_per_side**2 // processor.image_seq_len)
    if (patches_per_side // scale_factor) ** 2 != processor.image_seq_len:
        raise ValueError(f"no pixel shuffle gives {processor.image_seq_len} tokens a tile")
    text = text_config(
        tokenizer,
        model_type="llama",
        max_position_embeddings=8192,
        eos_token_id=tokenizer.convert_tokens_to_ids(family.end_of_turn),
    )
    model_config = family.config_class(
        text_config=text,
        vision_config={**VISION, "image_size": tile, "patch_size": patch_size},
        scale_factor=scale_factor,
        image_token_id=tokenizer.convert_tokens_to_ids(family.feature_token),
        tie_word_embeddings=False,
    )
    return random_model(family.model_class, model_config, seed, attn_implementation)
