"""Idefics3, SmolVLM's sibling (mmdp.data.families.smolvlm): the same rules with Idefics3Processor and
Idefics3ForConditionalGeneration. tests/test_families.py checks SmolVLM in full; these check that
the Idefics3 classes agree with it, and what weighing does beyond the processor's defaults.
"""

import pytest
import torch
from test_families import (
    ROWS,
    cell,
    packed_batch,
    processor_input_ids,
    summed_losses_alone,
    summed_losses_packed,
    turn,
)

from mmdp.data.families import family_for, smolvlm
from mmdp.models.tiny import tiny_model


@pytest.fixture(scope="module")
def idefics3():
    return family_for(smolvlm.offline_processor(smolvlm.Idefics3))


@pytest.mark.parametrize("size", [(640, 480), (90, 30)], ids=["640x480", "90x30"])
def test_idefics3_weights_are_its_processors_ids(idefics3, size):
    row = {"images": [cell(*size)], "texts": [turn("Describe it.", "A red rectangle.")]}
    (length,), _, (patches,), _ = idefics3.weigh([row["texts"]], [row["images"]])
    sample = idefics3.make_sample(row, 0)
    assert len(sample["input_ids"]) == length and sample["patches"] == patches
    assert torch.equal(sample["input_ids"], processor_input_ids(idefics3, row))


def test_one_tile_without_splitting():
    """do_image_splitting=False squashes every image into one tile: S + 3 tokens (the processor's
    own get_number_of_image_patches says 0 tiles there)."""
    processor = smolvlm.offline_processor(smolvlm.SmolVLM)
    processor.image_processor.do_image_splitting = False
    family = family_for(processor)
    layout = family.image_layout(640, 480, 1)
    assert layout.runs == (processor.image_seq_len,) and family.image_tokens(layout) == 64 + 3
    row = {"images": [cell(640, 480)], "texts": [turn("Describe it.", "A red rectangle.")]}
    assert torch.equal(family.make_sample(row, 0)["input_ids"], processor_input_ids(family, row))


@pytest.mark.slow
def test_idefics3_packed_samples_see_only_themselves():
    tiny = family_for(smolvlm.tiny_processor(smolvlm.Idefics3))
    model = tiny_model(tiny.processor, attn_implementation="sdpa")
    assert type(model).__name__ == "Idefics3ForConditionalGeneration"
    batch, samples = packed_batch(tiny)
    assert len(samples) == len(ROWS)
    alone = summed_losses_alone(tiny, model, samples)
    assert summed_losses_packed(model, batch) == pytest.approx(alone, rel=1e-5)
