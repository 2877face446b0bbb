"""Stage 4 of the blog, "Packing Smarter with Knapsacks": batching as a knapsack problem, on toys.

    uv run 04_knapsack_toy.py
    uv run 04_knapsack_toy.py --strategy binpack --num-workers 2

The items are the sequence lengths 1..24, the knapsack (pack) holds 100 tokens. An
IterableDataset shards the items across DataLoader workers; in each worker a producer thread packs
them and fills a queue while the DataLoader consumes. Two strategies, as in the blog:
greedy (next fit, in order) and binpack (first-fit decreasing). Prints the packs and saves
assets/04_greedy.png and assets/04_binpack.png.
"""

import argparse

from torch.utils.data import DataLoader

from mmdp import config
from mmdp.errors import exit_on_user_error
from mmdp.flags import description, display_path, non_negative_int, positive_int
from mmdp.loading.toy import BLOG_TOY_STRATEGIES, ToyPackingDataset
from mmdp.report.plots import plot_packs, save_figure


def parse_args():
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument(
        "--strategy", choices=[*BLOG_TOY_STRATEGIES, "both"], default="both", help="default: both"
    )
    parser.add_argument("--start", type=positive_int, default=1, help="first item (default: 1)")
    parser.add_argument(
        "--end", type=positive_int, default=25, help="one past the last item (default: 25)"
    )
    parser.add_argument(
        "--max-length", type=positive_int, default=100, help="token budget of a pack (default: 100)"
    )
    parser.add_argument(
        "--num-workers",
        type=non_negative_int,
        default=0,
        help="DataLoader workers; each packs its own share of the items (default: 0, as the blog)",
    )
    parser.add_argument(
        "--out-dir", default=display_path(config.ASSETS_DIR), help="default: assets/"
    )
    args = parser.parse_args()
    if args.start >= args.end:
        parser.error(f"--start ({args.start}) must be below --end ({args.end}): no items to pack")
    if args.end - 1 > args.max_length:
        parser.error(
            f"the item {args.end - 1} is longer than a pack (--max-length {args.max_length}); "
            f"raise --max-length to at least {args.end - 1}, or lower --end"
        )
    return args


def main():
    args = parse_args()
    strategies = list(BLOG_TOY_STRATEGIES) if args.strategy == "both" else [args.strategy]
    for strategy in strategies:
        # The iterable dataset: a producer thread packs, the DataLoader yields one pack at a time
        dataset = ToyPackingDataset(args.start, args.end, args.max_length, strategy)
        loader = DataLoader(dataset, batch_size=None, num_workers=args.num_workers)
        packs = [list(p) for p in loader]

        # Show the packs and how full each one is
        print(f"=== Strategy: {strategy.upper()} ===")
        for number, items in enumerate(packs, start=1):
            print(f"pack {number} ({sum(items):>3}/{args.max_length}): {' '.join(map(str, items))}")
        used = sum(map(sum, packs))
        print(f"{len(packs)} packs, {used / (len(packs) * args.max_length):.0%} full")

        title = (
            f"Knapsack toy, {strategy}: {len(packs)} packs of {args.max_length}, "
            f"{used / (len(packs) * args.max_length):.0%} full"
        )
        path = save_figure(
            plot_packs(packs, args.max_length, title), args.out_dir, f"04_{strategy}.png"
        )
        print(f"Saved the packs to {display_path(path)}\n")


if __name__ == "__main__":
    with exit_on_user_error():
        main()
