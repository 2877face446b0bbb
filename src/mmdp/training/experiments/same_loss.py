"""Part 1 of stage 6, same loss: the loss of the same samples, images included, whether they come
naively padded, constrained-padded or packed (restarting position_ids): summed, as a mean over
label tokens and as a mean over samples. A wrong image-to-sample mapping is shown to break it."""

import contextlib
import dataclasses

import torch

from mmdp.models.attention import flash_attention_on_cpu, use_attention
from mmdp.models.tiny_vlm import TinyVLM, vlm_inputs
from mmdp.training.experiments.data import StageData, strategy_batches
from mmdp.training.experiments.settings import ExperimentSettings
from mmdp.training.loss import label_tokens, summed_loss, summed_sample_means


@contextlib.contextmanager
def attention(implementation: str):
    """Run transformers' code for `implementation` on this machine: FlashAttention's routing with
    mmdp's reference kernels on a CPU (correctness only), flex_attention compiled per shape."""
    import torch._dynamo

    if implementation == "flash_attention_2" and not torch.cuda.is_available():
        with flash_attention_on_cpu(implementation):
            yield
        return
    saved = torch._dynamo.config.automatic_dynamic_shapes
    # torch 2.15's CPU code for flex_attention with dynamic shapes does not compile
    torch._dynamo.config.automatic_dynamic_shapes = torch.cuda.is_available()
    try:
        yield
    finally:
        torch._dynamo.config.automatic_dynamic_shapes = saved


def check_same_loss(data: StageData, names, settings: ExperimentSettings) -> dict:
    """The loss of the same samples through each strategy's batches, and a wrong image mapping.

    The model starts with large weights (initializer_range 0.5): one initialised near zero
    barely looks at its inputs, and a mistake (masks, images) could hide.
    """
    rows = data.fits[: settings.check_samples]
    batches = strategy_batches(data, names, rows, settings, seed=settings.seed)
    vlm_config = dataclasses.replace(data.vlm_config, initializer_range=0.5)
    model = use_attention(TinyVLM(vlm_config).eval(), settings.attn_implementation)
    with attention(settings.attn_implementation), torch.no_grad():
        losses = {name: losses_of(model, batches[name]) for name in names}
        # The same packed batches with each batch's images shifted by one: every image now
        # lands on another sample's image tokens.
        wrong = 0.0
        for batch in batches[names[2]]:
            shifted = {**vlm_inputs(batch), "pixel_values": batch["pixel_values"].roll(1, dims=0)}
            wrong += float(summed_loss(model(**shifted).logits, batch["labels"]))
    summed, over_tokens, over_samples = (
        {name: losses[name][reduction] for name in names}
        for reduction in ("summed", "mean_over_tokens", "mean_over_samples")
    )
    reference = summed[names[0]]
    return {
        **summed,
        "max_rel_diff": max_rel_diff(summed),
        "wrong_image_mapping_rel_diff": abs(wrong - reference) / reference,
        "mean_over_tokens": {**over_tokens, "max_rel_diff": max_rel_diff(over_tokens)},
        "mean_over_samples": {**over_samples, "max_rel_diff": max_rel_diff(over_samples)},
        "samples": len(rows),
        "attn_implementation": settings.attn_implementation,
    }


def losses_of(model: TinyVLM, batches: list[dict]) -> dict:
    """The summed loss of the batches, and its mean over label tokens and over samples: each
    mean over all the batches at once (add up its parts over the batches, then divide)."""
    summed = sample_sum = 0.0
    tokens = samples = 0
    for batch in batches:
        logits = model(**{**vlm_inputs(batch), "labels": None}).logits
        summed += float(summed_loss(logits, batch["labels"]))
        tokens += label_tokens(batch["labels"])
        batch_sum, batch_samples = summed_sample_means(logits, batch)
        sample_sum += float(batch_sum)
        samples += batch_samples
    return {
        "summed": summed,
        "mean_over_tokens": summed / tokens,
        "mean_over_samples": sample_sum / samples,
    }


def max_rel_diff(values: dict) -> float:
    reference = next(iter(values.values()))
    return max(abs(v - reference) / abs(reference) for v in values.values())
