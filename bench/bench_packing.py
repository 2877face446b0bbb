"""Benchmark mmdp's packers against the packers people use, side by side, in one run.

    uv run --group bench bench/bench_packing.py                 # 393,230 items (about 3 minutes)
    uv run --group bench bench/bench_packing.py --items 50000   # quicker

Items are a cauldron-like mix (64 tokens per image, 0-3 images, long-tailed text; see
`cauldron_like_items`), 393,230 of them by default: the dataset size in ms-swift's published
packing log. At each capacity (512, 2048, 10,240 tokens) every packer gets the same items (the
few longer than the capacity are removed first and counted), and the table reports:

- median seconds over --repeats runs;
- packs, and how many more than the lower bound ceil(total tokens / capacity);
- the share of packs over the image budget (9 images per 2,048 tokens, scaled with capacity).

Peers:
- TRL's BFD (`trl.data_utils.pack_dataset(..., strategy="bfd")`), on a `datasets.Dataset` of
  input_ids; it ignores images;
- the PyPI package `binpacking` (`to_constant_volume`, what ms-swift uses), which scans every bin
  for every item: too slow for the whole list, so it runs on --binpacking-items items and the
  table gives its time there;
- the blog's balanced greedy knapsack (nanoVLM's `_balanced_greedy_knapsack`, re-written here from
  its description): start with ceil(sum/capacity) packs, put each item (longest first) into the
  least-loaded pack that fits, applied per buffer of --buffer-size items, as the blog does.
"""

import argparse
import statistics
import time

import numpy as np

from mmdp.packing import lower_bound, pack

IMAGE_TOKENS = 64
# P(0, 1, 2, 3 images). Calibrated so that, as in the measurement, about a third of TRL's
# BFD packs at capacity 2,048 hold more than 9 images. --heavy-images uses a mix where 40% do.
IMAGE_MIX = [0.35, 0.5, 0.1, 0.05]
HEAVY_IMAGE_MIX = [0.25, 0.6, 0.1, 0.05]


def cauldron_like_items(
    n: int, seed: int = 0, image_mix=IMAGE_MIX
) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, image counts): 0-3 images of 64 tokens, log-normal text (median ~120 tokens)."""
    rng = np.random.default_rng(seed)
    images = rng.choice(4, size=n, p=image_mix)
    text = np.clip(rng.lognormal(mean=4.8, sigma=0.9, size=n), 8, 8000).astype(np.int64)
    return text + IMAGE_TOKENS * images, images


def image_budget(capacity: int) -> int:
    return max(3, round(9 * capacity / 2048))


def timed(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def trl_bfd(lengths, capacity):
    import pyarrow as pa
    from datasets import Dataset
    from trl.data_utils import pack_dataset

    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    values = pa.array(np.ones(int(offsets[-1]), dtype=np.int32))
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), values)})
    dataset = Dataset(table)

    def run():
        packed = pack_dataset(
            dataset, capacity, strategy="bfd", map_kwargs={"keep_in_memory": True}
        )
        # the packed rows' seq_lengths say which items each pack holds, in order
        return packed["seq_lengths"]

    return run


def packs_from_trl(seq_lengths, lengths):
    """Map TRL's packs (lists of item lengths) back to our items, to count images per pack."""
    by_length = {}
    for i, length in enumerate(lengths.tolist()):
        by_length.setdefault(length, []).append(i)
    return [[by_length[length].pop() for length in row] for row in seq_lengths]


def binpacking_ffd(lengths, capacity):
    import binpacking

    weights = {i: int(length) for i, length in enumerate(lengths)}
    return lambda: [list(b) for b in binpacking.to_constant_volume(weights, capacity)]


def blog_balanced(lengths, images, capacity, max_images, buffer_size):
    """The blog's balanced greedy knapsack, per buffer: O(items x packs log packs)."""

    def run():
        packs = []
        for start in range(0, len(lengths), buffer_size):
            ids = range(start, min(start + buffer_size, len(lengths)))
            items = sorted(ids, key=lambda i: lengths[i], reverse=True)
            count = -(-int(sum(lengths[i] for i in ids)) // capacity)
            load, load_images, groups = [0] * count, [0] * count, [[] for _ in range(count)]
            for i in items:
                chosen = None
                for k in sorted(range(len(load)), key=load.__getitem__):
                    if (
                        load[k] + lengths[i] <= capacity
                        and load_images[k] + images[i] <= max_images
                    ):
                        chosen = k
                        break
                if chosen is None:
                    load.append(0)
                    load_images.append(0)
                    groups.append([])
                    chosen = len(load) - 1
                load[chosen] += int(lengths[i])
                load_images[chosen] += int(images[i])
                groups[chosen].append(i)
            packs += [g for g in groups if g]
        return packs

    return run


def describe(packs, lengths, images, capacity, max_images):
    bound = lower_bound(lengths, capacity)
    image_loads = np.array([images[p].sum() for p in packs])
    token_loads = np.array([lengths[p].sum() for p in packs])
    assert token_loads.max() <= capacity
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
    return {
        "packs": len(packs),
        "over_bound": len(packs) / bound - 1,
        "over_image_budget": float((image_loads > max_images).mean()),
        "image_std": float(image_loads.std()),
        "token_std": float(token_loads.std()),
    }


def packers(lengths, images, capacity, max_images, args):
    """(name, items it packs, a function that packs them) for every packer compared."""
    runs = [
        (f"mmdp {s}", len(lengths), lambda s=s: pack(lengths, capacity, s, images, max_images))
        for s in ("binpack", "bfd", "images_first_bfd")
    ]
    runs += [
        (f"mmdp {s}, no image budget", len(lengths), lambda s=s: pack(lengths, capacity, s))
        for s in ("binpack", "bfd")
    ]
    if args.skip_peers:
        return runs
    trl_run = trl_bfd(lengths, capacity)
    runs.append(
        ("TRL bfd (ignores images)", len(lengths), lambda: packs_from_trl(trl_run(), lengths))
    )
    n = min(args.binpacking_items, len(lengths))
    runs.append((f"binpacking (first {n:,} items)", n, binpacking_ffd(lengths[:n], capacity)))
    runs.append((
        "blog balanced knapsack, per buffer", len(lengths),
        blog_balanced(lengths, images, capacity, max_images, args.buffer_size),
    ))  # fmt: skip
    return runs


def bench_capacity(capacity, all_lengths, all_images, args):
    fits = all_lengths <= capacity
    lengths, images = all_lengths[fits], all_images[fits]
    max_images = image_budget(capacity)
    for name, n, fn in packers(lengths, images, capacity, max_images, args):
        slow = "binpacking" in name or "blog" in name
        seconds, packs = timed(fn, 1 if slow else args.repeats)
        d = describe(packs, lengths[:n], images[:n], capacity, max_images)
        print(
            f"| {capacity:,} | {name} | {n:,} | {seconds:.2f} | {d['packs']:,} | "
            f"{d['over_bound']:+.2%} | {d['over_image_budget']:.1%} | {d['image_std']:.2f} |",
            flush=True,
        )
    print(
        f"| {capacity:,} | (items longer than the capacity, removed first: "
        f"{int((~fits).sum()):,}; image budget {max_images} per pack) | | | | | | |"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=393_230)
    parser.add_argument("--capacities", type=int, nargs="+", default=[512, 2048, 10_240])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--binpacking-items", type=int, default=20_000)
    parser.add_argument("--buffer-size", type=int, default=2_048, help="the blog's buffer")
    parser.add_argument("--skip-peers", action="store_true", help="only mmdp's packers")
    parser.add_argument("--heavy-images", action="store_true", help="a mix with more images")
    args = parser.parse_args()

    mix = HEAVY_IMAGE_MIX if args.heavy_images else IMAGE_MIX
    all_lengths, all_images = cauldron_like_items(args.items, image_mix=mix)
    print(
        f"{args.items:,} cauldron-like items: mean {all_lengths.mean():.0f} tokens, "
        f"{all_images.mean():.2f} images; repeats={args.repeats}\n"
    )
    print(
        "| capacity | packer | items | median s | packs | over lower bound | packs over image budget | images/pack std |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for capacity in args.capacities:
        bench_capacity(capacity, all_lengths, all_images, args)


if __name__ == "__main__":
    main()
