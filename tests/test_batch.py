"""The batch contract (mmdp.batch), worked by hand on a few fake samples: the
example of its docstring, two packs of 8 tokens holding samples of 3 and 4 tokens, then one of 6."""

import pytest
import torch

from mmdp.batch import build_pack, collate_packs, real_token_mask, sample_ids
from mmdp.drop_reasons import UNDECODABLE_IMAGE
from mmdp.models.inputs import model_inputs

IGNORE = -100
PAD = 0


def fake_sample(row: int, input_ids: list[int], labels: list[int], images: int) -> dict:
    """A VQADataset item: tokens, labels, and `images` 2x2 images filled with the row number."""
    return {
        "row": row,
        "input_ids": torch.tensor(input_ids),
        "labels": torch.tensor(labels),
        "pixel_values": torch.full((images, 3, 2, 2), float(row)),
        "image_count": images,
        "patches": images * 4,
        "converted": {},
        "drop_reason": None,
    }


A = fake_sample(10, [1, 2, 3], [IGNORE, 2, 3], images=1)
B = fake_sample(11, [4, 5, 6, 7], [IGNORE, IGNORE, 6, 7], images=0)
C = fake_sample(12, [8, 9, 10, 11, 12, 13], [8, 9, 10, 11, 12, 13], images=2)
BROKEN = {"row": 13, "drop_reason": UNDECODABLE_IMAGE}


def worked_example() -> dict:
    budget = {"max_length": 8, "pad_token_id": PAD, "batch_index": 0}
    first = build_pack([A, BROKEN, B], [3, 5, 4], **budget)  # the broken one had 5 tokens
    second = build_pack([C], [6], **budget)
    return collate_packs([first, second])


def test_two_packs_of_8_laid_out_by_hand():
    batch = worked_example()
    assert batch["input_ids"].tolist() == [
        [1, 2, 3, 4, 5, 6, 7, PAD],
        [8, 9, 10, 11, 12, 13, PAD, PAD],
    ]
    # the first token of every sample is never trained: it would be predicted from the sample
    # before it
    assert batch["labels"].tolist() == [
        [IGNORE, 2, 3, IGNORE, IGNORE, 6, 7, IGNORE],
        [IGNORE, 9, 10, 11, 12, 13, IGNORE, IGNORE],
    ]
    # positions restart for every sample and for the padding run
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 5, 0, 1]]
    # segments over the 16 tokens read as one row: 0-3, 3-7, pad 7-8, 8-14, pad 14-16
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 7, 8, 14, 16]
    assert batch["cu_seq_lens_q"].dtype == torch.int32
    assert batch["cu_seq_lens_k"] is batch["cu_seq_lens_q"]
    assert batch["max_length_q"] == batch["max_length_k"] == 6
    assert isinstance(batch["max_length_q"], int)  # FlashAttention takes a Python int
    assert real_token_mask(batch).tolist() == [[True] * 7 + [False], [True] * 6 + [False] * 2]
    assert batch["sample_index"].tolist() == [10, 11, 12]
    assert batch["samples_per_pack"].tolist() == [2, 1]
    # images in sample order, each mapped to its sample's place in sample_index
    assert batch["pixel_values"][:, 0, 0, 0].tolist() == [10.0, 12.0, 12.0]
    assert batch["sample_of_image"].tolist() == [0, 2, 2]
    assert batch["dropped"] == {UNDECODABLE_IMAGE: 1} and batch["batch_index"] == 0


def test_sample_ids_and_model_inputs_of_the_worked_example():
    batch = worked_example()
    assert sample_ids(batch).tolist() == [[0, 0, 0, 1, 1, 1, 1, -1], [3, 3, 3, 3, 3, 3, -1, -1]]
    # what a model takes: no attention_mask (a 2-D mask would undo the per-sample masking); the
    # images, since the batch has some
    assert set(model_inputs(batch)) == {
        "pixel_values",
        "input_ids",
        "labels",
        "position_ids",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "use_cache",
    }
    assert "attention_mask" not in batch


def test_a_sample_with_another_length_than_planned_is_an_error_not_a_drop():
    with pytest.raises(RuntimeError, match="row 10: planned 4 tokens, tokenized 3"):
        build_pack([A], [4], max_length=8, pad_token_id=PAD, batch_index=0)


def test_samples_over_the_budget_do_not_fit_a_pack():
    with pytest.raises(ValueError, match="13 tokens do not fit in a pack of max_length 8"):
        build_pack([B, C, A], [4, 6, 3], max_length=8, pad_token_id=PAD, batch_index=0)


def collated_in_shared_memory(packs: list) -> tuple[dict, bool]:
    """A DataLoader's collate_fn: the batch, and whether its pixels are in shared memory already
    (asked in the worker, before the worker hands the batch over and shares every tensor)."""
    batch = collate_packs(packs)
    return batch, batch["pixel_values"].is_shared()


def test_a_worker_collates_the_pixels_straight_into_shared_memory():
    """In a DataLoader worker the batch's pixels are written into shared memory as they are
    concatenated, so that handing them to the main process copies nothing; the batch is the
    one collated in the main process (where nothing is shared), to the element."""
    budget = {"max_length": 8, "pad_token_id": PAD, "batch_index": 0}
    packs = [build_pack([A, B], [3, 4], **budget), build_pack([C], [6], **budget)]
    here, shared_here = collated_in_shared_memory(packs)
    loader = torch.utils.data.DataLoader(
        [packs], batch_size=None, num_workers=1, collate_fn=collated_in_shared_memory
    )
    ((there, shared_there),) = list(loader)
    assert not shared_here and shared_there
    assert torch.equal(there["pixel_values"], here["pixel_values"])
    assert there["pixel_values"].shape == (3, 3, 2, 2)
