"""A tiny random Gemma4ForConditionalGeneration, for tests on CPU (its processor side:
mmdp.data.families.gemma4)."""

from transformers import Gemma4Config, Gemma4ForConditionalGeneration

from mmdp.models.tiny import VISION, random_model, text_config


def tiny_model(
    processor,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    bidirectional: str | None = "vision",
):
    """A random Gemma4ForConditionalGeneration shaped as the 26B and 31B models (images
    bidirectional in the sliding layers, `bidirectional=None` for the smaller ones' causal
    images; keys shared with values in the global layers), float32, in eval mode: a sliding
    layer with a window of 32, shorter than an image's run (50-70 soft tokens at tiny_processor's
    settings), then a global one; the vision tower sized to `processor`'s patches, token ids
    aligned with its tokenizer.
    """
    tokenizer, image_processor = processor.tokenizer, processor.image_processor
    text = text_config(
        tokenizer,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=32,
        head_dim=16,
        global_head_dim=16,
        attention_k_eq_v=True,
        num_global_key_value_heads=1,
        hidden_size_per_layer_input=0,  # the per-layer embeddings of the smaller models: off
        use_bidirectional_attention=bidirectional,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<turn|>")],
    )
    vision = {
        **VISION,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 16,
        "patch_size": image_processor.patch_size,
        "pooling_kernel_size": image_processor.pooling_kernel_size,
        "position_embedding_size": 1024,  # more than the patches along any side
    }
    config = Gemma4Config(
        text_config=text,
        vision_config=vision,
        audio_config=None,
        image_token_id=tokenizer.image_token_id,
        video_token_id=processor.video_token_id,
        boi_token_id=tokenizer.convert_tokens_to_ids(tokenizer.boi_token),
        eoi_token_id=tokenizer.convert_tokens_to_ids(tokenizer.eoi_token),
    )
    return random_model(Gemma4ForConditionalGeneration, config, seed, attn_implementation)
