"""Tiny random models of the real transformers classes, one module per family, for tests,
examples and the torchrun matrix on CPU: `tiny_model(processor)` builds the one that fits a
family's processor (its token ids, its image geometry). Each family's processor side is
mmdp.data.families; mmdp's own TinyVLM is mmdp.models.tiny_vlm.
"""

import importlib

import torch

from mmdp.data.families import family_for

# Every tiny vision tower: one narrow layer (each family's module adds its geometry).
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
}


def tiny_model(processor, **kwargs):
    """A small random model of the real class of `processor`'s family (seed=,
    attn_implementation=; moe=True for Qwen3-VL's or Qwen3.5's mixture-of-experts class), built
    by the module of mmdp.models.tiny named as the family's (mmdp.data.families.qwen_vl:
    mmdp.models.tiny.qwen_vl), which imports its transformers model classes when first asked."""
    module = type(family_for(processor)).__module__.rsplit(".", 1)[-1]
    return importlib.import_module(f"mmdp.models.tiny.{module}").tiny_model(processor, **kwargs)


def text_config(tokenizer, **settings) -> dict:
    """A tiny language model's config, its token ids aligned with `tokenizer`: two layers of 64,
    four heads over two key/value heads; `settings`: the family's own, or other values."""
    return {
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
        **settings,
    }


def random_model(model_class, config, seed: int, attn_implementation: str):
    """A `model_class` of `config` with weights drawn from `seed`, float32, in eval mode."""
    torch.manual_seed(seed)
    model = model_class._from_config(
        config, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return model.eval()
