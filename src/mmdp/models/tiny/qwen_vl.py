"""A tiny random Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, Qwen3.5 or Qwen3.5-MoE of the real class,
for tests on CPU (its processor side: mmdp.data.families.qwen_vl)."""

import torch
import transformers

from mmdp.data.families import family_for
from mmdp.data.families.qwen_vl import SPECIAL_TOKENS, Qwen2_5_VL, Qwen3_5
from mmdp.models.tiny import random_model, text_config

# Qwen3.5's text model: a Gated DeltaNet layer (linear attention: a causal conv of 4 taps, then a
# state carried along the row) before a gated attention layer, as the released models interleave
# them 3:1, and weights large enough for a sample's leak into the next to show in the loss.
QWEN3_5_TEXT = {
    "layer_types": ["linear_attention", "full_attention"],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "initializer_range": 0.1,
}


def tiny_model(processor, seed: int = 0, attn_implementation: str = "sdpa", moe: bool = False):
    """A randomly initialised model of the real class, small enough for a CPU test, its token
    ids aligned with `processor`'s tokenizer. `moe` (a Qwen3-VL or Qwen3.5 processor): the
    mixture-of-experts class, Qwen3VLMoeForConditionalGeneration (as Qwen3-VL-30B-A3B) or
    Qwen3_5MoeForConditionalGeneration, 4 experts of which each token takes 2, the same processor
    and positions as the dense class."""
    tokenizer, image_processor = processor.tokenizer, processor.image_processor
    ids = {
        f"{name}_id": tokenizer.convert_tokens_to_ids(token)
        for name, token in SPECIAL_TOKENS.items()
    }
    text = text_config(
        tokenizer,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    )
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
        vision["num_position_embeddings"] = 16
        if moe:
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
        if isinstance(family_for(processor), Qwen3_5):
            text.update(QWEN3_5_TEXT)
            # the released heads rotate a quarter of 256 dims; these rotate all 16 (mRoPE 4+2+2)
            text["rope_parameters"]["partial_rotary_factor"] = 1.0
            classes = (transformers.Qwen3_5Config, transformers.Qwen3_5ForConditionalGeneration,
                       transformers.Qwen3_5MoeConfig, transformers.Qwen3_5MoeForConditionalGeneration)  # fmt: skip
        else:
            vision["deepstack_visual_indexes"] = [0]
            classes = (transformers.Qwen3VLConfig, transformers.Qwen3VLForConditionalGeneration,
                       transformers.Qwen3VLMoeConfig, transformers.Qwen3VLMoeForConditionalGeneration)  # fmt: skip
        config_class, model_class = classes[2:] if moe else classes[:2]
        model_config = config_class(text_config=text, vision_config=vision, **ids)
    elif moe:
        raise ValueError("a mixture-of-experts tiny model needs a Qwen3-VL or Qwen3.5 processor")
    else:
        vision.update(window_size=112, fullatt_block_indexes=[1])  # windows, then full attention
        # a video's temporal positions step by this: the released checkpoints' 2, not the
        # vision config's default 4 (mmdp.data.families.qwen_vl.Qwen2_5_VL)
        vision["tokens_per_second"] = Qwen2_5_VL.tokens_per_second
        model_config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
        model_class = transformers.Qwen2_5_VLForConditionalGeneration
    model = random_model(model_class, model_config, seed, attn_implementation)
    with torch.no_grad():  # Qwen3.5: each head's decay 0.01-0.1 a token (transformers draws
        for layer in model.modules():  # 0.01-16): states that last tens of tokens, as some
            if hasattr(layer, "A_log"):  # heads of the released models keep
                layer.A_log.copy_(torch.linspace(0.01, 0.1, len(layer.A_log)).log())
    return model
