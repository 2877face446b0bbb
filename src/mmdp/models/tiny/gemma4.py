"""A tiny random Gemma4ForConditionalGeneration, for tests on CPU (its processor side:
mmdp.data.families.gemma4)."""

import torch
from transformers import Gemma4Config, Gemma4ForConditionalGeneration


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
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 16,
        "attention_k_eq_v": True,
        "num_global_key_value_heads": 1,
        "hidden_size_per_layer_input": 0,  # the per-layer embeddings of the smaller models: off
        "use_bidirectional_attention": bidirectional,
        "max_position_embeddings": 4096,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<turn|>")],
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
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
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration._from_config(
        config, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return model.eval()
