"""A tiny random InternVLForConditionalGeneration (a Qwen2 language model, as InternVL3's), for
tests on CPU (its processor side: mmdp.data.families.internvl)."""

from transformers import InternVLConfig, InternVLForConditionalGeneration

from mmdp.models.tiny import VISION, random_model, text_config


def tiny_model(processor, seed: int = 0, attn_implementation: str = "sdpa"):
    """A randomly initialised model of the real class, small enough for a CPU test: InternViT
    sized to `processor`'s tiles (14 px patches, as every InternVL's), token ids aligned with its
    tokenizer."""
    tokenizer = processor.tokenizer
    vision = {**VISION, "image_size": processor.image_processor.size["height"], "patch_size": 14}
    config = InternVLConfig(
        text_config=text_config(tokenizer, model_type="qwen2"),
        vision_config=vision,
        image_token_id=tokenizer.context_image_token_id,
        image_seq_length=processor.image_seq_length,
    )
    return random_model(InternVLForConditionalGeneration, config, seed, attn_implementation)
