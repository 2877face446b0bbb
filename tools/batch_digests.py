"""Digests of every batch stage 5 yields, to show that a change leaves the batches as they were.

    uv run tools/batch_digests.py /tmp/before.json      # on the old code
    uv run tools/batch_digests.py /tmp/after.json       # on the new code
    uv run tools/batch_digests.py --compare /tmp/before.json /tmp/after.json

For the embedded dataset (2,000 rows, seed 0): one sha256 prefix per batch of the planned loader
on 1 rank and on each of 2 ranks, and of the streaming loader, over every tensor a model or a
report reads; and every strategy's epoch figures from compare_strategies. Two runs agree when
every batch holds the same tokens, labels, positions, segments and pixels, in the same order.
For Qwen2.5-VL (its offline processor, the first 300 rows), tokenizing each pack and from
pre-computed tokens: every tensor of every batch, its 3-D rope positions and image grids included.
"""

import argparse
import hashlib
import json
import sys

import torch

from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.reading.stream import load_vqa_stream
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.loading.streaming import StreamingDataLoader, StreamingPackedDataset
from mmdp.training.strategies import compare_strategies
from mmdp.weighing.weigh import weigh_rows

TENSORS = (
    "input_ids",
    "labels",
    "position_ids",
    "cu_seq_lens_q",
    "real_token_mask",
    "sample_index",
    "samples_per_pack",
    "pixel_values",
    "sample_of_image",
)


def digest(batch: dict) -> str:
    h = hashlib.sha256()
    for key in TENSORS:
        h.update(batch[key].contiguous().numpy().tobytes())
    h.update(
        repr(
            (batch["max_length_q"], batch["batch_index"], sorted(batch["dropped"].items()))
        ).encode()
    )
    return h.hexdigest()[:16]


def every_tensor_digest(batch: dict) -> str:
    """Every tensor of a batch, in the order of its keys, with its dtype and shape: a family's
    batch keys are its own. The keys' names are left out, so that renaming a key (which keeps
    its place in that order) leaves the digest as it was."""
    h = hashlib.sha256()
    for key in sorted(batch):
        value = batch[key]
        if isinstance(value, torch.Tensor):
            h.update(f"{value.dtype} {tuple(value.shape)}".encode())
            h.update(value.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def record_qwen(rows) -> dict:
    from mmdp.data.families import tiny_processor

    samples = VQADataset(rows.select(range(300)), tiny_processor("qwen2_5_vl"))
    out = {}
    for pretokenize in (False, True):
        dataset = PackedDataset(samples, pretokenize=pretokenize)
        loader = PackedDataLoader(dataset, num_workers=0)
        name = "pre-computed tokens" if pretokenize else "tokenizing each pack"
        out[f"qwen2_5_vl, {name}"] = [every_tensor_digest(b) for b in loader]
    return out


def record() -> dict:
    tokenizer = get_tokenizer()
    rows = load_vqa_dataset(None, num_rows=2000)
    out = {}
    for world_size in (1, 2):
        for rank in range(world_size):
            dataset = PackedDataset(VQADataset(rows, tokenizer), rank=rank, world_size=world_size)
            loader = PackedDataLoader(dataset, num_workers=0)
            out[f"planned, rank {rank} of {world_size}"] = [digest(b) for b in loader]
    stream = StreamingDataLoader(
        StreamingPackedDataset(load_vqa_stream(None, num_rows=2000), tokenizer), num_workers=0
    )
    out["streamed"] = [digest(b) for b in stream]
    out["streamed, dropped after the last batch"] = dict(stream.dropped_at_end)
    weights = weigh_rows(rows, tokenizer).weights
    strategies = compare_strategies(
        weights, max_length=512, max_images=18, batch_size=8, packs_per_batch=8
    )
    for name, result in strategies.items():
        per_row = json.dumps(result.pop("per_row"), sort_keys=True).encode()
        out[f"strategy {name}"] = {**result, "per_row": hashlib.sha256(per_row).hexdigest()[:16]}
    return {**out, **record_qwen(rows)}


def compare(before: dict, after: dict) -> bool:
    same = True
    for key in sorted(set(before) | set(after)):
        verdict = "same" if before.get(key) == after.get(key) else "DIFFERENT"
        same &= verdict == "same"
        print(f"{key}: {verdict}")
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="where to write the digests, or two to compare")
    parser.add_argument("--compare", action="store_true", help="compare two recorded files")
    args = parser.parse_args()
    if args.compare:
        before, after = (json.load(open(path)) for path in args.paths)
        sys.exit(0 if compare(before, after) else 1)
    with open(args.paths[0], "w") as f:
        json.dump(record(), f, indent=1)
    print(f"Wrote the digests to {args.paths[0]}")


if __name__ == "__main__":
    main()
