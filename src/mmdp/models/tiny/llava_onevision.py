"""A tiny random LlavaOnevisionForConditionalGeneration, for tests on CPU (its processor side:
mmdp.data.families.llava_onevision)."""

import math

import torch
import transformers

from mmdp.data.families.llava_onevision import SPECIAL_TOKENS


def tiny_model(processor, seed: int = 0, attn_implementation: str = "sdpa"):
    """A randomly initialised LlavaOnevisionForConditionalGeneration, small enough for a CPU test:
    narrow SigLIP and Qwen2 towers with the processor's geometry (tile, patch, pinpoints), token
    ids aligned with its tokenizer."""
    tokenizer, image_processor = processor.tokenizer, processor.image_processor
    tile = image_processor.size["height"]
    patch = tile // math.isqrt(processor.num_image_tokens)  # 384 // 27 = SigLIP's 14
    vision = transformers.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=tile,
        patch_size=patch,
        vision_use_head=False,
    )
    text = transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,  # the other tiny language models' heads (tests share flex_attention kernels)
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model_config = transformers.LlavaOnevisionConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS["image_token"]),
        video_token_index=tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS["video_token"]),
        vision_feature_select_strategy=processor.vision_feature_select_strategy,
        vision_feature_layer=-1,
        image_grid_pinpoints=image_processor.image_grid_pinpoints,
        vision_aspect_ratio=processor.vision_aspect_ratio,
    )
    torch.manual_seed(seed)
    model = transformers.LlavaOnevisionForConditionalGeneration._from_config(
        model_config, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return model.eval()
