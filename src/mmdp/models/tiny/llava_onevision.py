"""A tiny random LlavaOnevisionForConditionalGeneration, for tests on CPU (its processor side:
mmdp.data.families.llava_onevision)."""

import math

import transformers

from mmdp.data.families.llava_onevision import SPECIAL_TOKENS
from mmdp.models.tiny import VISION, random_model, text_config


def tiny_model(processor, seed: int = 0, attn_implementation: str = "sdpa"):
    """A randomly initialised LlavaOnevisionForConditionalGeneration, small enough for a CPU test:
    narrow SigLIP and Qwen2 towers with the processor's geometry (tile, patch, pinpoints), token
    ids aligned with its tokenizer."""
    tokenizer, image_processor = processor.tokenizer, processor.image_processor
    tile = image_processor.size["height"]
    patch = tile // math.isqrt(processor.num_image_tokens)  # 384 // 27 = SigLIP's 14
    vision = transformers.SiglipVisionConfig(
        **{**VISION, "num_hidden_layers": 2},
        image_size=tile,
        patch_size=patch,
        vision_use_head=False,
    )
    text = text_config(
        tokenizer,
        hidden_size=32,
        intermediate_size=64,
        head_dim=16,  # the other tiny language models' heads (tests share flex_attention kernels)
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )
    model_config = transformers.LlavaOnevisionConfig(
        vision_config=vision,
        text_config=transformers.Qwen2Config(**text),
        image_token_index=tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS["image_token"]),
        video_token_index=tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS["video_token"]),
        vision_feature_select_strategy=processor.vision_feature_select_strategy,
        vision_feature_layer=-1,
        image_grid_pinpoints=image_processor.image_grid_pinpoints,
        vision_aspect_ratio=processor.vision_aspect_ratio,
    )
    return random_model(
        transformers.LlavaOnevisionForConditionalGeneration,
        model_config,
        seed,
        attn_implementation,
    )
