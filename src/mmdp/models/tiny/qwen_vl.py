"""A tiny random Qwen2.5-VL, Qwen3-VL or Qwen3-VL-MoE of the real class, for tests on CPU (its
processor side: mmdp.data.families.qwen_vl)."""

import torch
import transformers

from mmdp.data.families.qwen_vl import SPECIAL_TOKENS


def tiny_model(processor, seed: int = 0, attn_implementation: str = "sdpa", moe: bool = False):
    """A randomly initialised model of the real class, small enough for a CPU test, its token
    ids aligned with `processor`'s tokenizer. `moe` (a Qwen3-VL processor only): the
    mixture-of-experts class, Qwen3VLMoeForConditionalGeneration (as Qwen3-VL-30B-A3B), 4
    experts of which each token takes 2, the same processor and positions as Qwen3-VL."""
    tokenizer, image_processor = processor.tokenizer, processor.image_processor
    ids = {
        f"{name}_id": tokenizer.convert_tokens_to_ids(token)
        for name, token in SPECIAL_TOKENS.items()
    }
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
        },
    }
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": image_processor.patch_size,
        "spatial_merge_size": image_processor.merge_size,
        "temporal_patch_size": image_processor.temporal_patch_size,
    }
    if isinstance(processor, transformers.Qwen3VLProcessor):
        text["head_dim"] = 16
        text["rope_parameters"] = {
            **text["rope_parameters"],
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
        }
        vision.update(num_position_embeddings=16, deepstack_visual_indexes=[0])
        model_config = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, **ids)
        model_class = transformers.Qwen3VLForConditionalGeneration
        if moe:
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
            model_config = transformers.Qwen3VLMoeConfig(
                text_config=text, vision_config=vision, **ids
            )
            model_class = transformers.Qwen3VLMoeForConditionalGeneration
    elif moe:
        raise ValueError("a mixture-of-experts tiny model needs a Qwen3-VL processor")
    else:
        vision.update(window_size=112, fullatt_block_indexes=[1])  # windows, then full attention
        model_config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
        model_class = transformers.Qwen2_5_VLForConditionalGeneration
    torch.manual_seed(seed)
    model = model_class._from_config(
        model_config, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return model.eval()
