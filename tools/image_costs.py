"""What one image costs each real family, and each family's default budgets: the numbers of
docs/real-vlms.md's "What a packed batch carries, per family".

    uv run tools/image_costs.py      # about a minute on a busy 2-core machine

From the image's width and height alone (ModelFamily.image_layout), with each family's offline
processor: tokens (ModelFamily.image_tokens) and vision-encoder patches, for an image alone in
its sample and for one of two (LLaVA-OneVision gives those fewer crops).
"""

from mmdp.data.families import OFFLINE, family_for, offline_processor
from mmdp.packing.packing_config import default_config

SIZES = ((512, 512), (1000, 300))


def main() -> None:
    for name in OFFLINE:
        family = family_for(offline_processor(name))
        costs = []
        for width, height in SIZES:
            for images_in_sample in (1, 2):
                layout = family.image_layout(width, height, images_in_sample)
                costs.append(
                    f"{width}x{height}, {images_in_sample} a sample: "
                    f"{family.image_tokens(layout):,} tokens, {layout.patches:,} patches"
                )
        print(f"{name}: " + "; ".join(costs))
        budgets = default_config(family)  # what a loader packs under without a config
        print(
            f"  default budgets: --max-length {budgets.max_length:,}, "
            f"--max-patches {budgets.max_patches:,}"
        )


if __name__ == "__main__":
    main()
