"""What a model takes from a packed batch: `model_inputs(batch, model)`, for every Hugging Face
model mmdp packs for (the batch itself is mmdp.batch's contract)."""

import functools
import inspect
import sys

import torch
import transformers
from packaging.version import Version

from mmdp.batch import TOKEN_INPUTS
from mmdp.data.families import family_named
from mmdp.data.families.base import VIDEO_INPUTS, VISION_INPUTS
from mmdp.errors import UserError

# The keys of a packed batch that a Hugging Face causal LM takes, under every attention
# implementation: eager, sdpa and flex_attention use position_ids and ignore the rest;
# FlashAttention uses cu_seq_lens_* and max_length_* (its varlen kernels).
MODEL_INPUTS = (
    "input_ids",
    "labels",
    "position_ids",
    "cu_seq_lens_q",
    "cu_seq_lens_k",
    "max_length_q",
    "max_length_k",
)

# The first transformers whose eager and sdpa masks honour restarting position_ids (the packed
# sequence detection of huggingface/transformers#39194). Measured: 4.53.0 mixes samples, 4.53.1
# does not (tools/check_packed_masks.py, the same check as tests/test_attention.py).
MIN_TRANSFORMERS = "4.53.1"


def gemma3_masks(batch: dict, model) -> dict:
    """Gemma 3's and Gemma 4's masks for packed rows (imported when needed: transformers')."""
    from mmdp.models.gemma3_masks import packed_attention_masks

    return packed_attention_masks(batch, model)


# A hybrid model (Qwen3.5) carries a state along the row in its linear-attention layers (a causal
# conv, then a recurrence) that neither positions nor a mask reset: only their kernels keep packed
# samples apart, given the bounds. transformers picks each kernel when it imports the model's
# module (the package's, else its own torch code, which refuses bounds) and passes it only the
# arguments its signature names (integrations/hub_kernels.py, use_kernel_func_from_hub_with_fallback).
# By each kernel's name in the layer's module: the argument that takes the bounds, what installs it.
LINEAR_ATTENTION_KERNELS = {
    "causal_conv1d_fn": ("seq_idx", "causal-conv1d"),
    "torch_chunk_gated_delta_rule": ("cu_seqlens", "flash-linear-attention"),
}


# The attention masks mmdp builds for a family whose model cannot keep packed samples apart from
# their position_ids alone, by the family's `packed_mask` (ModelFamily.packed_mask; a test checks
# every registered family's is here).
PACKED_MASKS = {"gemma3": gemma3_masks, "gemma4": gemma3_masks}


def model_inputs(batch: dict, model=None) -> dict:
    """The keys of a packed batch that a Hugging Face model takes, and `use_cache=False`. Call

        model(**model_inputs(batch, model))

    and each sample sees only itself, under eager, sdpa, flex_attention and FlashAttention alike
    (docs/use-in-your-trainer.md: why no cache and no attention_mask). The cache is switched off
    here, in the inputs, because a trainer cannot be trusted to: transformers' Trainer sets only
    the top-level `config.use_cache = False`, and the Qwen-VL text models read
    `text_config.use_cache`, build a cache and mix the samples. A batch with images adds its
    image inputs, a batch with videos its video inputs (pixel_values_videos, video_grid_thw,
    Qwen2.5-VL's second_per_grid_ts); one without leaves them out (the models refuse empty pixel
    tensors). Pass the model always: Gemma 3 and 4 batches need it (transformers 5.23 builds their
    sliding-window mask wrong in packed rows, and mmdp builds both masks itself:
    mmdp.models.gemma3_masks), and so do hybrid models (Qwen3.5): their batch is laid out as one
    row with the bounds of every sample for every kind of layer (`one_row`).

    Raises on a transformers too old to build the per-sample mask from position_ids, on a Gemma
    or Qwen3.5 batch without its model (ValueError), and (a UserError, one sentence) on a model
    whose config differs from what the batch was built for (`check_model_settings`) or a hybrid
    model without kernels that keep samples apart (`check_linear_attention`).
    """
    check_transformers()
    if model is not None:
        check_model_settings(batch, model)
    inputs = {key: batch[key] for key in MODEL_INPUTS}
    inputs["use_cache"] = False
    # the family that collated the batch (its name, carried in the batch) says what its model
    # takes; a batch collated without one holds whichever per-token and vision inputs its samples
    # had (mmdp.batch.collate_packs)
    family = family_named(batch["model_family"]) if "model_family" in batch else None
    token_keys = family.token_keys if family else TOKEN_INPUTS
    inputs.update({key: batch[key] for key in token_keys if key in batch})
    if len(batch.get("pixel_values", ())):
        keys = family.vision_keys if family else VISION_INPUTS
        inputs.update({key: batch[key] for key in keys if key in batch})
    if len(batch.get("pixel_values_videos", ())):
        keys = family.video_keys if family else VIDEO_INPUTS
        inputs.update({key: batch[key] for key in keys if key in batch})
    if family and family.packed_mask:
        inputs["attention_mask"] = PACKED_MASKS[family.packed_mask](batch, model)
    if family and family.linear_attention and model is None:  # no model: no one row, no seq_idx
        raise ValueError(
            f"a {family.name} batch needs its model, model_inputs(batch, model): its "
            "linear-attention layers keep packed samples apart only in one row with every "
            "sample's bounds, and only the model says which kernels take them"
        )
    if model is not None and is_hybrid(model):
        check_linear_attention(model)
        return one_row(inputs)
    return inputs


def is_hybrid(model) -> bool:
    """Whether `model` has linear-attention layers: its (text) config's layer types say so."""
    config = model_config(model)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return "linear_attention" in (getattr(text, "layer_types", None) or ())


def check_linear_attention(model) -> None:
    """Refuse, in one sentence naming what to install, a hybrid model whose kernels (those of each
    decoder layer's `linear_attn`, as transformers resolved them) would not keep packed samples
    apart: transformers' torch code, or a kernel whose signature takes no bounds."""
    layers = {type(m.linear_attn) for m in model.modules() if hasattr(m, "linear_attn")}
    missing = [] if layers else [package for _, package in LINEAR_ATTENTION_KERNELS.values()]
    for layer in layers:
        home = vars(sys.modules[layer.__module__])
        for name, (bounds, package) in LINEAR_ATTENTION_KERNELS.items():
            found = inspect.getclosurevars(home[name]).nonlocals if name in home else {}
            kept = found.get("is_new_implementation") and bounds in found["applicable_params"]
            if not kept and package not in missing:
                missing.append(package)
    if missing:
        raise UserError(
            f"this {model_config(model).model_type} model's linear-attention layers would carry "
            f"each packed sample's state into the next, as transformers resolved their kernels: "
            f"install {' and '.join(missing)} (CUDA), whose kernels take the sample bounds"
        )


def one_row(inputs: dict) -> dict:
    """A batch's packs end to end as ONE row (flash-linear-attention's varlen kernel takes no
    more), with the bounds for every layer: input_ids, labels and per-token inputs [1, B * L],
    position_ids [4, 1, B * L]; cu_seq_lens_q/k already bound the segments of the B * L tokens,
    for attention and (transformers passes cu_seq_lens_q as cu_seqlens) the recurrence, and
    seq_idx numbers each token's segment for the conv. The loss stays the batch's: a pack's last
    token predicts the next pack's first label, -100 (mmdp.batch.layout_pack). Two packs of 4
    tokens, samples of 3 and 1 in the first, one of 4 in the second:

    >>> inputs = {"input_ids": torch.arange(8).view(2, 4), "cu_seq_lens_q": torch.tensor([0, 3, 4, 8])}
    >>> row = one_row(inputs)
    >>> row["input_ids"], row["seq_idx"]
    (tensor([[0, 1, 2, 3, 4, 5, 6, 7]]), tensor([[0, 0, 0, 1, 2, 2, 2, 2]], dtype=torch.int32))
    """
    row = dict(inputs)
    for key in ("input_ids", "labels", "position_ids", *TOKEN_INPUTS):
        if key in row:
            row[key] = row[key].flatten(-2).unsqueeze(-2)
    bounds = inputs["cu_seq_lens_q"]
    tokens = torch.arange(int(bounds[-1]), device=bounds.device, dtype=bounds.dtype)
    row["seq_idx"] = torch.searchsorted(bounds[1:], tokens, right=True).int()[None]
    return row


# What to do when a model's config differs from what the batches were built for, by setting.
SETTING_HINTS = {
    "vision_config.tokens_per_second": (
        "it spaces a video's temporal positions; build the batches with "
        "Qwen2_5_VL(processor, tokens_per_second={model}) to match this model"
    ),
}
DEFAULT_HINT = "use the model made for this processor, or the processor made for this model"


def check_model_settings(batch: dict, model) -> None:
    """Refuse, in one sentence, a model whose config says otherwise than the settings the batch
    was built with (`batch["model_settings"]`, the family's model_settings(): Qwen2.5-VL's
    tokens_per_second, the feature tokens' ids...). With another tokens_per_second the model
    would train on other temporal positions than the batch's, silently (tests/test_video.py
    measures it); a setting the model's config does not have is not checked. A DDP-wrapped
    model's config is its module's."""
    config = model_config(model)
    for path, built in batch.get("model_settings", {}).items():
        value = config
        for name in path.split("."):
            value = getattr(value, name, None)
        if value is not None and plain(value) != plain(built):
            hint = SETTING_HINTS.get(path, DEFAULT_HINT).format(model=value)
            raise UserError(
                f"the model's config has {path} = {value!r}, but this {batch['model_family']} "
                f"batch was built for {built!r}; {hint}"
            )


def model_config(model):
    """The model's config (a DDP-wrapped model's: its module's); None for a model without one."""
    return getattr(model, "config", None) or getattr(getattr(model, "module", None), "config", None)


def plain(value):
    """Lists for tuples, all the way down (a config's pinpoints come back as either)."""
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


@functools.cache
def check_transformers(version: str = transformers.__version__) -> None:
    """Raise if this transformers would let the samples of a packed batch attend to each other."""
    if Version(version) < Version(MIN_TRANSFORMERS):
        raise RuntimeError(
            f"transformers {version} ignores restarting position_ids in its eager and sdpa "
            f"attention masks, so packed samples would attend to each other; upgrade to "
            f"transformers>={MIN_TRANSFORMERS}"
        )
