"""A tiny random InternVLForConditionalGeneration (a Qwen2 language model, as InternVL3's), for
tests on CPU (its processor side: mmdp.data.families.internvl)."""

import torch
from transformers import InternVLConfig, InternVLForConditionalGeneration


def tiny_model(processor, seed: int = 0, attn_implementation: str = "sdpa"):
    """A randomly initialised model of the real class, small enough for a CPU test: InternViT
    sized to `processor`'s tiles (14 px patches, as every InternVL's), token ids aligned with its
    tokenizer."""
    tokenizer = processor.tokenizer
    text = {
        "model_type": "qwen2",
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
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": processor.image_processor.size["height"],
        "patch_size": 14,
    }
    config = InternVLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=tokenizer.context_image_token_id,
        image_seq_length=processor.image_seq_length,
    )
    torch.manual_seed(seed)
    model = InternVLForConditionalGeneration._from_config(
        config, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return model.eval()
