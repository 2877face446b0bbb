"""A tiny random SmolVLM or Idefics3 of the real class, for tests on CPU (its processor side:
mmdp.data.families.smolvlm)."""

import math

import torch
import transformers

from mmdp.data.families.smolvlm import PATCH_SIZES, Idefics3, SmolVLM


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
    text = {
        "model_type": "llama",
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.convert_tokens_to_ids(family.end_of_turn),
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": tile,
        "patch_size": patch_size,
    }
    model_config = family.config_class(
        text_config=text,
        vision_config=vision,
        scale_factor=scale_factor,
        image_token_id=tokenizer.convert_tokens_to_ids(family.feature_token),
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = family.model_class._from_config(
        model_config, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return model.eval()
