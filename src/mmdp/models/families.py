"""Which model family a processor belongs to, and the families stage 5 can pack for offline.

family_for(processor)   the ModelFamily of a tokenizer (mmdp's TinyVLM), of a transformers
                        processor of a supported family, or a ModelFamily as it is
offline_processor(name) a processor of a family, built in code with no network
MODELS                  the names of stage 5's --model
"""

from mmdp.errors import UserError
from mmdp.models import qwen_vl, smolvlm
from mmdp.models.family import ModelFamily, TinyFamily

# The real families, by the class name of their transformers processor.
FAMILIES: dict[str, type[ModelFamily]] = {
    "Qwen2_5_VLProcessor": qwen_vl.Qwen2_5_VL,
    "Qwen3VLProcessor": qwen_vl.Qwen3VL,
    "SmolVLMProcessor": smolvlm.SmolVLM,
    "Idefics3Processor": smolvlm.Idefics3,
}
# --model NAME -> (the family's module, its family class)
OFFLINE = {
    "qwen2_5_vl": (qwen_vl, qwen_vl.Qwen2_5_VL),
    "qwen3_vl": (qwen_vl, qwen_vl.Qwen3VL),
    "smolvlm": (smolvlm, smolvlm.SmolVLM),
    "idefics3": (smolvlm, smolvlm.Idefics3),
}
MODELS = ("tiny", *OFFLINE)


def family_for(processor, **tiny_settings) -> ModelFamily:
    """The ModelFamily that builds samples for `processor`.

    A tokenizer (no image processor) is mmdp's TinyVLM path (`tiny_settings`: image_size,
    image_token_length); a processor must be of a supported family.
    """
    if isinstance(processor, ModelFamily):
        return processor
    if not hasattr(processor, "image_processor"):
        return TinyFamily(processor, **tiny_settings)
    name = type(processor).__name__
    if name not in FAMILIES:
        supported = ", ".join(sorted(FAMILIES))
        raise UserError(f"mmdp cannot pack for a {name}; it supports {supported}")
    return FAMILIES[name](processor)


def offline_processor(name: str):
    """A processor of the family `name` (one of MODELS but "tiny"), built with no network."""
    module, family = OFFLINE[name]
    return module.offline_processor(family)


def tiny_model(processor, **kwargs):
    """A small random model of the real class of `processor`'s family (for tests)."""
    family = family_for(processor)
    module = next(module for module, cls in OFFLINE.values() if cls is type(family))
    return module.tiny_model(processor, **kwargs)
