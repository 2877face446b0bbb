"""Which model family a processor belongs to, and the families stage 5 can pack for offline.

family_for(processor)   the ModelFamily of a tokenizer (mmdp's TinyVLM), of a transformers
                        processor of a supported family, or a ModelFamily as it is
offline_processor(name) a processor of a family, built in code with no network
tiny_processor(name)    the same with the smaller images a tiny model tests fast with, where the
                        family has them (LLaVA-OneVision: 32 px tiles; Gemma 3: 28 px, not 896);
                        the tiny models themselves are model-side: mmdp.models.tiny
MODELS                  the names of stage 5's --model
family_named(name)      the family class a batch names (its `model_family`)
"""

import importlib
from pathlib import Path

from mmdp.data.families.base import ModelFamily
from mmdp.data.families.tiny import TinyFamily
from mmdp.data.hub import looks_like_a_path, offline_mode, require_hub
from mmdp.errors import UserError, first_sentence

# The real families, as "module:class", imported when first asked for: a real family imports
# transformers' image processors, and they import torchvision and torch._dynamo (20 s on a busy
# 2-core machine), which the TinyVLM path never needs.
# By the class name of their transformers processor:
FAMILIES = {
    "Qwen2_5_VLProcessor": "mmdp.data.families.qwen_vl:Qwen2_5_VL",
    "Qwen3VLProcessor": "mmdp.data.families.qwen_vl:Qwen3VL",
    "LlavaOnevisionProcessor": "mmdp.data.families.llava_onevision:LlavaOnevision",
    "Gemma3Processor": "mmdp.data.families.gemma3:Gemma3",
    "SmolVLMProcessor": "mmdp.data.families.smolvlm:SmolVLM",
    "Idefics3Processor": "mmdp.data.families.smolvlm:Idefics3",
    "Gemma4Processor": "mmdp.data.families.gemma4:Gemma4",
    "InternVLProcessor": "mmdp.data.families.internvl:InternVL",
}
# ...and a family whose processor is another's, told apart by its tokenizer: Qwen3.5's (and
# Qwen3.5-MoE's) is a Qwen3VLProcessor whose tokenizer transformers loads as a Qwen3_5Tokenizer
# (model types qwen3_5 and qwen3_5_moe: models/auto/tokenization_auto.py, transformers 5.23)
BY_TOKENIZER = {("Qwen3VLProcessor", "Qwen3_5Tokenizer"): "mmdp.data.families.qwen_vl:Qwen3_5"}
# By stage 5's --model name:
OFFLINE = {
    "qwen2_5_vl": "mmdp.data.families.qwen_vl:Qwen2_5_VL",
    "qwen3_vl": "mmdp.data.families.qwen_vl:Qwen3VL",
    "llava_onevision": "mmdp.data.families.llava_onevision:LlavaOnevision",
    "gemma3": "mmdp.data.families.gemma3:Gemma3",
    "smolvlm": "mmdp.data.families.smolvlm:SmolVLM",
    "qwen3_5": "mmdp.data.families.qwen_vl:Qwen3_5",
    "gemma4": "mmdp.data.families.gemma4:Gemma4",
    "internvl": "mmdp.data.families.internvl:InternVL",
}
MODELS = ("tiny", *OFFLINE)
# By the family's own name (ModelFamily.name), the name a batch carries (`model_family`):
NAMED = {**OFFLINE, "idefics3": "mmdp.data.families.smolvlm:Idefics3"}


def family_class(where: str) -> type[ModelFamily]:
    """The family class at "module:class" (see FAMILIES)."""
    module, name = where.split(":")
    return getattr(importlib.import_module(module), name)


def family_named(name: str) -> type[ModelFamily]:
    """The family class a batch names (`batch["model_family"]`, a ModelFamily.name).

    >>> family_named("qwen2_5_vl").name
    'qwen2_5_vl'
    """
    if name not in NAMED:
        raise ValueError(f"no model family is named {name!r}; the families: {', '.join(NAMED)}")
    return family_class(NAMED[name])


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
    tokenizer = type(getattr(processor, "tokenizer", None)).__name__
    return family_class(BY_TOKENIZER.get((name, tokenizer), FAMILIES[name]))(processor)


def offline_processor(name: str):
    """A processor of the family `name` (one of MODELS but "tiny"), built with no network."""
    family = family_class(OFFLINE[name])
    return importlib.import_module(family.__module__).offline_processor(family)


def tiny_processor(name: str):
    """A processor of the family `name` for tests of its tiny model on CPU: the family's own rules
    with smaller images where its real ones make those tests slow, else offline_processor(name)."""
    family = family_class(OFFLINE[name])
    module = importlib.import_module(family.__module__)
    return getattr(module, "tiny_processor", module.offline_processor)(family)


PROCESSOR_HINT = "run without --processor to use the family's processor built offline (--model)"


def load_processor(name_or_path: str, hint: str = PROCESSOR_HINT):
    """A model's processor from the Hub or a local folder (AutoProcessor); one sentence when it
    cannot be had (offline, or not a processor mmdp packs for), ending in `hint`: what to run
    instead, in the flags of the script that asked (stage 5's --processor by default)."""
    from transformers import AutoProcessor

    if looks_like_a_path(name_or_path) and not Path(name_or_path).exists():
        raise UserError(f"processor {name_or_path!r}: no such directory")
    if not Path(name_or_path).exists():
        require_hub(f"processor {name_or_path!r}", hint)
    try:
        processor = AutoProcessor.from_pretrained(name_or_path)
    except (OSError, ValueError, ImportError) as error:
        raise UserError(
            f"could not load processor {name_or_path!r} ({why(error)}); {hint}"
        ) from error
    family_for(processor)  # refuses a family mmdp does not pack for, in one sentence
    return processor


def why(error: Exception) -> str:
    """Why from_pretrained failed, in a few words. With HF_HUB_OFFLINE set, a name missing from
    the local cache: transformers' own OSError says so in two sentences over two lines."""
    if offline_mode() and isinstance(error, OSError):
        return "not in the local Hugging Face cache, and HF_HUB_OFFLINE is set"
    return f"{error.__class__.__name__}: {first_sentence(error)}"
