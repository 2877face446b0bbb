"""Tiny random models of the real transformers classes, one module per family, for tests,
examples and the torchrun matrix on CPU: `tiny_model(processor)` builds the one that fits a
family's processor (its token ids, its image geometry). Each family's processor side is
mmdp.data.families; mmdp's own TinyVLM is mmdp.models.tiny_vlm.
"""

import importlib

from mmdp.data.families import family_for

# The module that builds each family's tiny model, by the family's name (ModelFamily.name;
# tests/test_family_dispatch.py checks every registered family but TinyVLM has one), imported
# when first asked for: each imports its transformers model classes.
BUILDERS = {
    "qwen2_5_vl": "mmdp.models.tiny.qwen_vl",
    "qwen3_vl": "mmdp.models.tiny.qwen_vl",
    "qwen3_5": "mmdp.models.tiny.qwen_vl",
    "llava_onevision": "mmdp.models.tiny.llava_onevision",
    "gemma3": "mmdp.models.tiny.gemma3",
    "smolvlm": "mmdp.models.tiny.smolvlm",
    "idefics3": "mmdp.models.tiny.smolvlm",
    "gemma4": "mmdp.models.tiny.gemma4",
    "internvl": "mmdp.models.tiny.internvl",
}


def tiny_model(processor, **kwargs):
    """A small random model of the real class of `processor`'s family (seed=,
    attn_implementation=; moe=True for Qwen3-VL's or Qwen3.5's mixture-of-experts class)."""
    name = family_for(processor).name
    return importlib.import_module(BUILDERS[name]).tiny_model(processor, **kwargs)
