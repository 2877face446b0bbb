"""Stage 5's report on the rows it packed: the videos among them, and a user's rows (--dataset),
used and dropped by reason, with what the usable ones weigh against the budgets."""

import numpy as np

from mmdp.report.printing import print_table


def print_videos(report, samples, packing) -> None:
    """Stage 5: the videos packed this epoch (a PackReport's rows of a VQADataset's `samples`):
    how many, the tokens and patches each costs (from their headers), and their share of the
    packs' patch budget (a PackingConfig's); nothing for a dataset without videos."""
    if "videos" not in samples.dataset.column_names:
        return
    rows = samples.dataset.select_columns(["videos"])[report.sample_index]["videos"]
    costs = samples.family.video_costs(rows)
    if not costs:
        print(f"{'videos packed:':<18}0")
        return
    tokens, patches = (np.array(values) for values in zip(*costs))
    budget = len(report.patches_per_row) * (packing.max_patches or 0)
    share = f", {patches.sum() / budget:.1%} of the packs' patch budget" if budget else ""
    print(
        f"{'videos packed:':<18}{len(costs):,} (tokens per video: min {tokens.min()}, median "
        f"{np.median(tokens):.0f}, max {tokens.max()}; patches per video: min {patches.min()}, "
        f"median {np.median(patches):.0f}, max {patches.max()}; {patches.sum():,} patches"
        f"{share})"
    )


def print_your_rows(report, weights, packing, dataset: str) -> None:
    """Stage 5 --dataset: the rows used and dropped, by reason (read from the headers and the text when
    weighed, or found when a pack was built), and the tokens, images and patches of a sample of
    the usable rows, by percentile: what a user needs to know before spending GPU hours."""
    print(f"\nYour rows ({dataset}):")
    counts = [["used (samples)", report.samples]]
    counts += [[reason, n] for reason, n in sorted(report.dropped.items(), key=lambda kv: -kv[1])]
    print_table(["rows", "count"], counts, ["", ","])
    usable = weights.reasons == 0
    if not usable.any():
        return
    quantiles = (0, 50, 90, 99, 100)
    columns = {"tokens": weights.lengths, "images": weights.image_counts}
    if packing.max_patches:
        columns["patches"] = weights.patch_counts
    table = [
        [f"{name} per sample", *np.percentile(values[usable], quantiles, method="lower")]
        for name, values in columns.items()
    ]
    print_table(
        ["usable rows", "min", "p50", "p90", "p99", "max"], table, ["", ",.0f"] + [",.0f"] * 4
    )
    budgets = f"max_length {packing.max_length:,}" + (
        f", max_patches {packing.max_patches:,}" if packing.max_patches else ""
    )
    print(f"   budgets: {budgets}, max_images {packing.max_images} (a sample over one is dropped)")


def print_image_costs(costs: list[tuple[int, int]]) -> None:
    """Stage 5 --model: the (tokens, patches) of each image of the rows, as min / median / max;
    rows without images (videos, text only) say so."""
    if not costs:
        print(f"{'tokens per image:':<18}no images in these rows")
        return
    tokens, patches = (np.array(values) for values in zip(*costs))
    print(
        f"{'tokens per image:':<18}min {tokens.min()}, median {np.median(tokens):.0f}, "
        f"max {tokens.max()} ({len(tokens):,} images; patches: min {patches.min()}, "
        f"median {np.median(patches):.0f}, max {patches.max()})"
    )
