"""Benchmark mmdp's packers against the packers people use, side by side, in one run.

    uv run --group bench bench/bench_packing.py                  # everything (about 4 minutes)
    uv run --group bench bench/bench_packing.py --quick          # smaller sizes (about 1 minute)
    uv run bench/bench_packing.py --skip-peers                   # mmdp only, no bench group
    uv run bench/bench_packing.py --skip-peers --tables 2 3      # worst case and per buffer only
    uv run --group bench bench/bench_packing.py --before REV     # also mmdp as of git REV
    uv run bench/bench_packing.py --skip-peers --tables 4        # what a patch budget costs

Four tables, every packer in each getting the same items:

1. Cauldron-like mix (64 tokens per image, 0-3 images, long-tailed text; see
   `cauldron_like_items`), --items of them (393,230 by default: the dataset size in ms-swift's
   published packing log), at max_length 512, 2,048 and 10,240 tokens (the few items longer than
   max_length are removed first and counted). For each packer: median seconds over --repeats
   runs; packs, and how many more than the lower bound ceil(total tokens / max_length); the share
   of packs over the image budget (9 images per 2,048 tokens, scaled with max_length); the spread
   of images per pack.
2. Worst case: --worst-items items (1,000,000 by default), lengths uniform in 1..32,768, at
   max_length 32,768, no images: so many distinct lengths, and so many packs open at once, that
   packers which scan the open packs for every item (or every run of identical items) crawl.
   mmdp's binpack, bfd and images_first_bfd pack them all; the tests' item-by-item loop
   (tests/packing_oracles.py, checked to give the same packs) and `binpacking` only the first
   --reference-items items, and the
   table extrapolates their time to all items (both are O(n * packs), packs ~ n: n^2).
3. Per buffer: the planner packs a dataset one buffer of --buffer-size rows (4,096) at a time,
   ~5,900 `pack_flat` calls for 24M rows. Median milliseconds of one call, over --buffers
   consecutive cauldron-like buffers, at max_length 512 with 18 images and 2,048 with 9, and what
   5,900 calls add up to.
4. Per buffer with a third budget, vision-encoder patches (`items_with_patches`: each image has
   its own number of patches, as in Qwen2-VL): median milliseconds of one `pack_flat` call with
   tokens and images only (today's fast engines, the patch budget left out) and with the patch
   budget too (the engine that scans the open packs in every budget), the packs each makes, and
   the share of the first's packs over the patch budget (so that the budget is seen to bind).

Peers (table 1; `binpacking` also in table 2):
- TRL's BFD (`trl.data_utils.pack_dataset(..., strategy="bfd")`), on a `datasets.Dataset` of
  input_ids; it ignores images;
- the PyPI package `binpacking` (`to_constant_volume`, what ms-swift uses), which scans every bin
  for every item: too slow for the whole list, so it runs on --binpacking-items items and the
  table gives its time there;
- the blog's balanced greedy knapsack (nanoVLM's `_balanced_greedy_knapsack`), which is mmdp's
  `balanced_greedy` (ceil(total / max_length) + 5 packs, each item longest first into the least
  loaded pack that fits), applied per buffer of --blog-buffer items (2,048), as the blog does.

--before REV loads mmdp's packers as they were at git revision REV (src/mmdp/packing.py before
the package layout, src/mmdp/packing/packers.py after it, with its fast engines in
src/mmdp/packing/_engines.py once they moved there) and times them next to today's, in the same
run: the "before" and "speed-up" columns (and whether the packs are the same). The machine may be
shared: compare ratios from one run, not times across runs; --cpu-time times the CPU this
process uses (time.process_time) rather than the wall clock, which other work on a busy machine
stretches.
"""

import argparse
import functools
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

from mmdp.packing import packers
from mmdp.packing.packers import FIT_DECREASING, lower_bound, pack, pack_flat
from mmdp.packing.weights import Budgets

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from packing_oracles import fit_decreasing  # noqa: E402 (the tests' item-by-item loop)

IMAGE_TOKENS = 64
# P(0, 1, 2, 3 images). Calibrated so that, as in the measurement, about a third of TRL's
# BFD packs at 2,048 tokens hold more than 9 images. --heavy-images uses a mix where 40% do.
IMAGE_MIX = [0.35, 0.5, 0.1, 0.05]
HEAVY_IMAGE_MIX = [0.25, 0.6, 0.1, 0.05]
PLANNER_BUFFERS = 5_900  # 24M rows in buffers of 4,096


def cauldron_like_items(
    n: int, seed: int = 0, image_mix=IMAGE_MIX
) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, image counts): 0-3 images of 64 tokens, log-normal text (median ~120 tokens)."""
    rng = np.random.default_rng(seed)
    images = rng.choice(4, size=n, p=image_mix)
    text = np.clip(rng.lognormal(mean=4.8, sigma=0.9, size=n), 8, 8000).astype(np.int64)
    return text + IMAGE_TOKENS * images, images


# Table 4's images, as Qwen2-VL sees them: an image of h x w pixels is (h/14)(w/14) patches of
# 14 px, merged 2 x 2 into tokens. The tokens an image takes vary from image to image: log-normal
# around 256 (a 448 x 448 image, 1,024 patches), between Qwen2-VL's default min_pixels (4 tokens)
# and max_pixels (1,280 tokens, 5,120 patches).
PATCHES_PER_TOKEN = 4
MEDIAN_IMAGE_TOKENS, IMAGE_TOKENS_SIGMA = 256, 0.8
MIN_IMAGE_TOKENS, MAX_IMAGE_TOKENS = 4, 1_280
# (max_length, max_images, max_patches): patches for half a pack's tokens, so the patch budget
# binds on image-heavy packs
PATCH_BUDGETS = ((2_048, 9, 4_096), (8_192, 36, 16_384))


def items_with_patches(n: int, seed: int = 0, image_mix=IMAGE_MIX):
    """(lengths, image counts, patch counts): table 1's text and image counts, each image with
    its own number of patches (its tokens x PATCHES_PER_TOKEN); a sample's tokens include them."""
    rng = np.random.default_rng(seed)
    images = rng.choice(4, size=n, p=image_mix)
    text = np.clip(rng.lognormal(mean=4.8, sigma=0.9, size=n), 8, 8000).astype(np.int64)
    per_image = rng.lognormal(np.log(MEDIAN_IMAGE_TOKENS), IMAGE_TOKENS_SIGMA, int(images.sum()))
    per_image = np.clip(np.round(per_image), MIN_IMAGE_TOKENS, MAX_IMAGE_TOKENS)
    image_tokens = np.bincount(np.repeat(np.arange(n), images), per_image, minlength=n)
    image_tokens = image_tokens.astype(np.int64)
    return text + image_tokens, images, PATCHES_PER_TOKEN * image_tokens


def worst_case_items(n: int, max_length: int = 32_768, seed: int = 0) -> np.ndarray:
    """Lengths uniform in 1..max_length: every length occurs, half the items open a pack."""
    return np.random.default_rng(seed).integers(1, max_length + 1, n)


def image_budget(max_length: int) -> int:
    return max(3, round(9 * max_length / 2048))


clock = time.perf_counter  # time.process_time with --cpu-time


def timed(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = clock()
        result = fn()
        times.append(clock() - start)
    return statistics.median(times), result


# mmdp.packing's private engine modules, each importing only the ones before it; a revision has
# some of them (_scan held the patch-budget engine until it joined _engines)
ENGINES = ("_placements", "_best_fit", "_scan", "_engines")
PACKAGE = "src/mmdp/packing"


def load_packing(revision: str) -> types.ModuleType:
    """mmdp's packers as they were at a git revision, to time them next to today's in one run.

    Up to the package layout (4b81373) one module, src/mmdp/packing.py; since then
    src/mmdp/packing/packers.py and the private engines beside it, each as that revision had it:
    while they load, the revision's engines stand in for today's under their import names.
    """
    package = sys.modules["mmdp.packing"]
    today = {name: getattr(package, name, None) for name in ENGINES}
    try:
        for name in ENGINES:
            module = load_module(revision, f"{PACKAGE}/{name}.py")
            if module is not None:
                setattr(package, name, module)
                sys.modules[f"mmdp.packing.{name}"] = module
        packers_at = load_module(revision, "src/mmdp/packing/packers.py") or load_module(
            revision, "src/mmdp/packing.py"
        )
    finally:
        for name, module in today.items():
            if module is None:
                sys.modules.pop(f"mmdp.packing.{name}", None)
                if hasattr(package, name):
                    delattr(package, name)
            else:
                setattr(package, name, module)
                sys.modules[f"mmdp.packing.{name}"] = module
    if packers_at is None:
        sys.exit(f"--before {revision}: no src/mmdp/packing/packers.py nor src/mmdp/packing.py")
    return packers_at


def load_module(revision: str, path: str) -> types.ModuleType | None:
    """The module at `path` as it was at git `revision`, or None if it did not exist there."""
    root = Path(__file__).resolve().parent.parent
    shown = subprocess.run(
        ["git", "show", f"{revision}:{path}"], cwd=root, capture_output=True, text=True
    )
    if shown.returncode != 0:
        return None
    module = types.ModuleType(f"{Path(path).stem}_at_{revision}")
    exec(compile(shown.stdout, f"{path}@{revision}", "exec"), module.__dict__)
    return module


def trl_bfd(lengths, max_length):
    import datasets
    import pyarrow as pa
    from trl.data_utils import pack_dataset

    datasets.disable_progress_bars()
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    values = pa.array(np.ones(int(offsets[-1]), dtype=np.int32))
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), values)})
    dataset = datasets.Dataset(table)

    def run():
        packed = pack_dataset(
            dataset, max_length, strategy="bfd", map_kwargs={"keep_in_memory": True}
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


def binpacking_ffd(lengths, max_length):
    import binpacking

    weights = {i: int(length) for i, length in enumerate(lengths)}
    return lambda: [list(b) for b in binpacking.to_constant_volume(weights, max_length)]


def per_buffer(module, lengths, images, max_length, max_images, buffer_size):
    """balanced_greedy applied to consecutive buffers of buffer_size items, as the blog does."""

    def run():
        packs = []
        for start in range(0, len(lengths), buffer_size):
            end = min(start + buffer_size, len(lengths))
            buffer = module.pack(
                lengths[start:end],
                max_length=max_length,
                strategy="balanced_greedy",
                image_counts=images[start:end],
                max_images=max_images,
            )
            packs += [[start + i for i in p] for p in buffer]
        return packs

    return run


def describe(packs, lengths, images, max_length, max_images):
    bound = lower_bound(lengths, max_length)
    image_loads = np.array([images[p].sum() for p in packs])
    token_loads = np.array([lengths[p].sum() for p in packs])
    assert token_loads.max() <= max_length
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
    return {
        "packs": len(packs),
        "over_bound": len(packs) / bound - 1,
        "over_image_budget": float((image_loads > max_images).mean()),
        "image_std": float(image_loads.std()),
    }


def compare(run_before, repeats, seconds, packs) -> str:
    """'before s | speed-up | same packs |' cells for a packer of --before REV."""
    try:
        before_seconds, before_packs = timed(run_before, repeats)
    except ValueError:  # a strategy that revision does not know
        return " (unknown there) | | |"
    same = "yes" if before_packs == packs else "NO"
    return f" {before_seconds:.2f} | {before_seconds / seconds:.1f}x | {same} |"


def mmdp_packers(lengths, images, max_length, max_images, args, module):
    """(name, function) for each of mmdp's packers in table 1, as `module` has them."""

    def run(strategy, with_images=True):
        if with_images:
            return lambda: module.pack(
                lengths,
                max_length=max_length,
                strategy=strategy,
                image_counts=images,
                max_images=max_images,
            )
        return lambda: module.pack(lengths, max_length=max_length, strategy=strategy)

    runs = [(f"mmdp {s}", run(s)) for s in FIT_DECREASING]
    runs += [(f"mmdp {s}, no image budget", run(s, False)) for s in ("binpack", "bfd")]
    blog = per_buffer(module, lengths, images, max_length, max_images, args.blog_buffer)
    runs.append((f"mmdp balanced_greedy (the blog's), per buffer of {args.blog_buffer:,}", blog))
    return runs


def peer_packers(lengths, max_length, args):
    """(name, items it packs, function) for the peers in table 1."""
    trl_run = trl_bfd(lengths, max_length)
    n = min(args.binpacking_items, len(lengths))
    return [
        ("TRL bfd (ignores images)", len(lengths), lambda: packs_from_trl(trl_run(), lengths)),
        (f"binpacking (first {n:,} items)", n, binpacking_ffd(lengths[:n], max_length)),
    ]


def bench_cauldron(all_lengths, all_images, args, before):
    columns = " before s | speed-up | same packs |" if before else ""
    print(
        "| max_length | packer | items | median s | packs | over lower bound "
        f"| packs over image budget | images/pack std |{columns}"
    )
    print(
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * (3 * bool(before))
    )
    for max_length in args.max_lengths:
        bench_max_length(max_length, all_lengths, all_images, args, before)


def bench_max_length(max_length, all_lengths, all_images, args, before):
    fits = all_lengths <= max_length
    lengths, images = all_lengths[fits], all_images[fits]
    max_images = image_budget(max_length)
    empty = " |" * (3 * bool(before))

    def row(name, n, seconds, packs, cells):
        d = describe(packs, lengths[:n], images[:n], max_length, max_images)
        print(
            f"| {max_length:,} | {name} | {n:,} | {seconds:.2f} | {d['packs']:,} | "
            f"{d['over_bound']:+.2%} | {d['over_image_budget']:.1%} | {d['image_std']:.2f} |"
            + cells,
            flush=True,
        )

    now = mmdp_packers(lengths, images, max_length, max_images, args, packers)
    then = mmdp_packers(lengths, images, max_length, max_images, args, before or packers)
    for (name, run), (_, run_before) in zip(now, then):
        seconds, packs = timed(run, args.repeats)
        cells = empty
        if before:
            # the blog's loop, as `before` may still have it, is slow: time it once
            repeats = 1 if "balanced_greedy" in name else args.repeats
            cells = compare(run_before, repeats, seconds, packs)
        row(name, len(lengths), seconds, packs, cells)
    if not args.skip_peers:
        for name, n, run in peer_packers(lengths, max_length, args):
            seconds, packs = timed(run, args.repeats if "TRL" in name else 1)
            row(name, n, seconds, packs, empty)
    print(
        f"| {max_length:,} | (items longer than max_length, removed first: "
        f"{int((~fits).sum()):,}; image budget {max_images} per pack) | | | | | | |" + empty
    )


def bench_worst_case(args, before):
    max_length = 32_768
    lengths = worst_case_items(args.worst_items, max_length)
    n, m = len(lengths), min(args.reference_items, len(lengths))
    columns = " before s | speed-up | same packs |" if before else ""
    print(f"| packer | items | median s | for all {n:,}, s | packs | over lower bound |{columns}")
    print("| --- | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * (3 * bool(before)))
    for strategy in FIT_DECREASING:
        seconds, flat = timed(
            lambda s=strategy: pack_flat(lengths, max_length=max_length, strategy=s), args.repeats
        )
        packs = len(flat[1]) - 1
        over = packs / lower_bound(lengths, max_length) - 1
        cells = ""
        if before:
            before_seconds, before_flat = timed(
                lambda s=strategy: before.pack_flat(lengths, max_length=max_length, strategy=s),
                args.before_repeats,
            )
            same = all(np.array_equal(a, b) for a, b in zip(flat, before_flat))
            speedup = before_seconds / seconds
            ratio = f"{speedup:.2f}" if speedup < 10 else f"{speedup:.0f}"
            cells = f" {before_seconds:.2f} | {ratio}x | {'yes' if same else 'NO'} |"
        print(
            f"| mmdp {strategy} | {n:,} | {seconds:.2f} | {seconds:.2f} | {packs:,} | {over:+.2%} |"
            + cells,
            flush=True,
        )
    # the readable loop and binpacking on the first m items; both O(n * packs), packs ~ n
    subset = lengths[:m]
    scale = (n / m) ** 2
    for strategy in FIT_DECREASING:
        seconds, packs = timed(
            lambda s=strategy: fit_decreasing(subset, Budgets(max_length), strategy=s), 1
        )
        assert packs == pack(
            subset, max_length=max_length, strategy=strategy
        )  # the fast packers give the same packs
        print(
            f"| the tests' fit_decreasing, strategy={strategy!r} (first {m:,} items) | {m:,} | "
            f"{seconds:.2f} | ~{seconds * scale:,.0f} (n^2) | {len(packs):,} | |"
            + " |"
            * (3 * bool(before)),
            flush=True,
        )
    if not args.skip_peers:
        seconds, packs = timed(binpacking_ffd(subset, max_length), 1)
        print(
            f"| binpacking (first {m:,} items) | {m:,} | {seconds:.2f} | "
            f"~{seconds * scale:,.0f} (n^2) | {len(packs):,} | |" + " |" * (3 * bool(before))
        )


def buffer_ms(pack_buffers, buffers, repeats) -> list[float]:
    """Median milliseconds of one call of each of `pack_buffers` (functions of a buffer), over
    the buffers; the functions take turns on each buffer, so that a noisy moment hits them all.
    """
    for pack_buffer in pack_buffers:
        pack_buffer(buffers[0])  # warm up
    times = [[] for _ in pack_buffers]
    for buffer in buffers:
        for pack_buffer, spent in zip(pack_buffers, times):
            spent.append(timed(functools.partial(pack_buffer, buffer), repeats)[0])
    return [statistics.median(spent) * 1e3 for spent in times]


def buffer_packer(module, strategy, max_length, max_images, max_patches=None):
    """`module.pack_flat` with these budgets, as a function of a buffer (lengths, images[,
    patches]); the patch budget only when given (older revisions do not know it)."""

    def pack_buffer(buffer):
        patch_budget = (
            {} if max_patches is None else {"patch_counts": buffer[2], "max_patches": max_patches}
        )
        return module.pack_flat(
            buffer[0],
            max_length=max_length,
            strategy=strategy,
            image_counts=buffer[1],
            max_images=max_images,
            **patch_budget,
        )

    return pack_buffer


def cut_into_buffers(columns, size: int, count: int) -> list[tuple]:
    """`count` consecutive buffers of `size` items, each a tuple of the columns' slices."""
    return [tuple(c[k * size : (k + 1) * size] for c in columns) for k in range(count)]


def bench_buffers(args, before):
    columns = " before ms | speed-up |" if before else ""
    print(
        f"| max_length / max_images | strategy | median ms per buffer | "
        f"{PLANNER_BUFFERS:,} buffers, s |{columns}"
    )
    print("| --- | --- | ---: | ---: |" + " ---: |" * (2 * bool(before)))
    for max_length, max_images in ((512, 18), (2_048, 9)):
        all_lengths, all_images = cauldron_like_items(4 * args.buffer_size * args.buffers, seed=1)
        fits = all_lengths <= max_length
        buffers = cut_into_buffers(
            (all_lengths[fits], all_images[fits]), args.buffer_size, args.buffers
        )
        for strategy in packers.STRATEGIES:
            runs = [
                buffer_packer(module, strategy, max_length, max_images)
                for module in (packers, before)
                if module is not None
            ]
            cells = ""
            try:
                ms, *before_ms = buffer_ms(runs, buffers, args.repeats)
            except ValueError:  # a strategy that revision does not know
                ms, before_ms = buffer_ms(runs[:1], buffers, args.repeats)[0], []
                cells = " (unknown there) | |"
            if before_ms:
                cells = f" {before_ms[0]:.2f} | {before_ms[0] / ms:.2f}x |"
            print(
                f"| {max_length:,} / {max_images} | {strategy} | {ms:.2f} | "
                f"{ms * PLANNER_BUFFERS / 1e3:.0f} |" + cells,
                flush=True,
            )


def bench_patch_budget(args):
    """Table 4: one buffer packed with tokens and images, then with the patch budget too."""
    print(
        "| max_length / max_images / max_patches | strategy | ms, tokens + images | "
        "ms, + patches | cost | packs without / with the patch budget (all buffers) | "
        "packs over it without it |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for max_length, max_images, max_patches in PATCH_BUDGETS:
        columns = items_with_patches(4 * args.buffer_size * args.buffers, seed=1)
        fits = (columns[0] <= max_length) & (columns[2] <= max_patches)  # alone, in every budget
        buffers = cut_into_buffers([c[fits] for c in columns], args.buffer_size, args.buffers)
        for strategy in packers.STRATEGIES:
            two = buffer_packer(packers, strategy, max_length, max_images)
            three = buffer_packer(packers, strategy, max_length, max_images, max_patches)
            ms_two, ms_three = buffer_ms([two, three], buffers, args.repeats)
            packs_two = packs_three = over = 0
            for buffer in buffers:
                items, starts = two(buffer)
                packs_two += len(starts) - 1
                packs_three += len(three(buffer)[1]) - 1
                pack_patches = np.add.reduceat(buffer[2][items], starts[:-1])
                over += int((pack_patches > max_patches).sum())
            print(
                f"| {max_length:,} / {max_images} / {max_patches:,} | {strategy} | "
                f"{ms_two:.2f} | {ms_three:.2f} | {ms_three / ms_two:.1f}x | "
                f"{packs_two:,} / {packs_three:,} | {over / packs_two:.1%} |",
                flush=True,
            )


def parse_args():
    quick = "--quick" in sys.argv  # smaller defaults; explicit flags still win
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="50,000 items, 200,000 worst-case items, 2,000 for the reference, 5 buffers, 1 repeat",
    )
    parser.add_argument("--items", type=int, default=50_000 if quick else 393_230, help="table 1")
    parser.add_argument("--max-lengths", type=int, nargs="+", default=[512, 2048, 10_240])
    parser.add_argument("--repeats", type=int, default=1 if quick else 3)
    parser.add_argument("--binpacking-items", type=int, default=20_000)
    parser.add_argument("--buffer-size", type=int, default=4_096, help="tables 3-4: the planner's")
    parser.add_argument("--blog-buffer", type=int, default=2_048, help="table 1: the blog's")
    parser.add_argument(
        "--worst-items", type=int, default=200_000 if quick else 1_000_000, help="table 2"
    )
    parser.add_argument(
        "--reference-items", type=int, default=2_000 if quick else 4_000, help="table 2"
    )
    parser.add_argument("--buffers", type=int, default=5 if quick else 20, help="tables 3-4")
    parser.add_argument("--tables", type=int, nargs="+", default=[1, 2, 3, 4], choices=[1, 2, 3, 4])
    parser.add_argument("--skip-peers", action="store_true", help="only mmdp's packers")
    parser.add_argument("--heavy-images", action="store_true", help="a mix with more images")
    parser.add_argument("--before", metavar="REV", help="also time mmdp's packers at git REV")
    parser.add_argument(
        "--before-repeats", type=int, default=1, help="table 2 'before': slow, once by default"
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the CPU this process uses, not the wall clock (for a busy, shared machine)",
    )
    return parser.parse_args()


def main():
    global clock
    args = parse_args()
    if args.cpu_time:
        clock = time.process_time
    before = load_packing(args.before) if args.before else None
    if before:
        print(f"before: mmdp's packers at {args.before}\n")
    print(f"times: {'CPU time of this process' if args.cpu_time else 'wall clock'}\n")

    if 1 in args.tables:
        mix = HEAVY_IMAGE_MIX if args.heavy_images else IMAGE_MIX
        all_lengths, all_images = cauldron_like_items(args.items, image_mix=mix)
        print(
            f"1. {args.items:,} cauldron-like items: mean {all_lengths.mean():.0f} tokens, "
            f"{all_images.mean():.2f} images; repeats={args.repeats}\n"
        )
        bench_cauldron(all_lengths, all_images, args, before)
    if 2 in args.tables:
        print(
            f"\n2. Worst case: {args.worst_items:,} items of 1..32,768 tokens (uniform), "
            f"max_length 32,768, no images; repeats={args.repeats}\n"
        )
        bench_worst_case(args, before)
    if 3 in args.tables:
        print(
            f"\n3. One pack_flat call per buffer of {args.buffer_size:,} cauldron-like items: "
            f"median over {args.buffers} buffers of the median of {args.repeats} calls each\n"
        )
        bench_buffers(args, before)
    if 4 in args.tables:
        print(
            f"\n4. A patch budget too: one pack_flat call per buffer of {args.buffer_size:,} "
            f"items with patch counts, median over {args.buffers} buffers of the median of "
            f"{args.repeats} calls each\n"
        )
        bench_patch_budget(args)


if __name__ == "__main__":
    main()
