"""Stage 4 of the blog, "Packing Smarter with Knapsacks": batching as a knapsack problem, on toys.

    uv run 04_knapsack_toy.py
    uv run 04_knapsack_toy.py --strategy binpack --max-length 50

The items are the sequence lengths 1..24, a knapsack (pack) holds 100 tokens. A producer thread
packs them and fills a queue while the main thread takes the packs out, with the blog's two
loops (src/mmdp/packing/knapsack.py): greedy (in order) and binpack (first-fit decreasing).
Prints the packs, checks that the library's fast packer (mmdp.packing.packers.pack) makes the
same ones, and saves assets/04_greedy.png and assets/04_binpack.png.

Differs from the blog: no DataLoader workers sharding the items (the blog's _get_data_range); a
toy needs none, and stage 5 shards its samples across ranks and workers.
"""

import argparse

from mmdp.config import ASSETS_DIR
from mmdp.flags import description, positive_int
from mmdp.packing.knapsack import TOY_STRATEGIES, packs_in_background
from mmdp.report.plots import display_path, plot_packs, save_figure


def parse_args():
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument(
        "--strategy", choices=[*TOY_STRATEGIES, "both"], default="both", help="default: both"
    )
    parser.add_argument("--start", type=positive_int, default=1, help="first item (default: 1)")
    parser.add_argument(
        "--end", type=positive_int, default=25, help="one past the last item (default: 25)"
    )
    parser.add_argument(
        "--max-length", type=positive_int, default=100, help="token budget of a pack (default: 100)"
    )
    parser.add_argument("--out-dir", default=display_path(ASSETS_DIR), help="default: assets/")
    args = parser.parse_args()
    if args.start >= args.end:
        parser.error(f"--start ({args.start}) must be below --end ({args.end}): no items to pack")
    if args.end - 1 > args.max_length:  # the blog's loops would skip it: refuse it instead
        parser.error(
            f"the item {args.end - 1} is longer than a pack (--max-length {args.max_length}); "
            f"raise --max-length to at least {args.end - 1}, or lower --end"
        )
    return args


def main():
    from mmdp.packing.packers import pack  # the library's packer: numpy engines, loaded here only

    args = parse_args()
    items = list(range(args.start, args.end))
    strategies = list(TOY_STRATEGIES) if args.strategy == "both" else [args.strategy]
    # The producer thread packs the items into a queue; we take the packs out as they come
    packs_of = {s: list(packs_in_background(items, args.max_length, s)) for s in strategies}
    rows = max(map(len, packs_of.values()))  # the figures, side by side, as high as each other
    for strategy, packs in packs_of.items():
        # Show the packs and how full each one is
        print(f"=== Strategy: {strategy.upper()} ===")
        for number, held in enumerate(packs, start=1):
            print(f"pack {number} ({sum(held):>3}/{args.max_length}): {' '.join(map(str, held))}")
        full = sum(map(sum, packs)) / (len(packs) * args.max_length)
        print(f"{len(packs)} packs, {full:.0%} full")

        # The library's packer gives the same packs, as indices into the items
        fast = pack(items, max_length=args.max_length, strategy=strategy)
        fast = [[items[i] for i in indices] for indices in fast]
        print(f"pack(items, max_length={args.max_length}, strategy={strategy!r}): ", end="")
        print("the same packs" if fast == packs else f"other packs: {fast}")

        title = (
            f"Knapsack toy, {strategy}: {len(packs)} packs of {args.max_length}, {full:.0%} full"
        )
        path = save_figure(
            plot_packs(packs, args.max_length, title, rows=rows), args.out_dir, f"04_{strategy}.png"
        )
        print(f"Saved the packs to {display_path(path)}\n")


if __name__ == "__main__":
    main()
