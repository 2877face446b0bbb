"""Run by tests/test_prepared.py under torchrun: read a prepared dataset (argv[1], a path or URL),
go through one epoch of this rank's batches, and write what this rank weighed and a digest of
each of its batches to argv[2].RANK.json."""

import hashlib
import json
import sys

import torch.distributed as dist

from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.packing_config import PackingConfig

NUM_ROWS = 120
TENSORS = ("input_ids", "labels", "position_ids", "sample_index", "pixel_values")


def batch_digests(loader) -> list[str]:
    """A sha256 prefix per batch, over what a model reads of it."""
    digests = []
    for batch in loader:
        sha = hashlib.sha256()
        for key in TENSORS:
            sha.update(batch[key].contiguous().numpy().tobytes())
        digests.append(sha.hexdigest()[:16])
    return digests


def main():
    dist.init_process_group("gloo")
    rows = load_vqa_dataset(None, num_rows=NUM_ROWS)
    packed = PackedDataset.from_prepared(
        sys.argv[1], VQADataset(rows, get_tokenizer()), config=PackingConfig(packs_per_batch=2)
    )
    result = {
        "weighed": packed.weighing.rows_weighed_here,
        "batches": batch_digests(PackedDataLoader(packed, num_workers=0)),
    }
    with open(f"{sys.argv[2]}.{dist.get_rank()}.json", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":  # pytest imports this file for its doctests
    main()
