"""Run by tests/test_weighing.py under torchrun: weigh the embedded rows across ranks and write
what this rank weighed and a digest of the weights it ended with."""

import hashlib
import json
import sys

import torch.distributed as dist

from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.tokenizer import get_tokenizer
from mmdp.weighing.weigh import weigh_rows


def main():
    dist.init_process_group("gloo")
    rows = load_vqa_dataset(None, num_rows=300)
    weighing = weigh_rows(rows, get_tokenizer(), across_ranks=True)
    weights = weighing.weights
    digest = hashlib.sha256()
    for array in (weights.lengths, weights.image_counts, weights.patch_counts, weights.reasons):
        digest.update(array.tobytes())
    result = {
        "rank": dist.get_rank(),
        "weighed": weighing.rows_weighed_here,
        "weights": digest.hexdigest(),
    }
    with open(f"{sys.argv[1]}.{dist.get_rank()}.json", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":  # pytest imports this file for its doctests
    main()
