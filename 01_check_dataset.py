"""Stage 1 of the blog, "Visualising the Dataset": look at one sample before optimising anything.

    uv run 01_check_dataset.py            # a random sample of the embedded synthetic dataset
    uv run 01_check_dataset.py --seed 3   # the same sample every time
    uv run 01_check_dataset.py --dataset HuggingFaceM4/the_cauldron --subset ai2d   # needs a network

Shows the sample's image(s) beside its conversation and saves the figure to assets/01.png.
The first run generates and caches the synthetic dataset (a few seconds); later runs load it.
"""

import argparse
import random

from mmdp.cli import add_data_args, description, display_path
from mmdp.data.images import BadImage, open_image
from mmdp.data.sources import load_vqa_dataset
from mmdp.errors import exit_on_user_error
from mmdp.report.plots import plot_sample, save_figure


def parse_args():
    parser = argparse.ArgumentParser(description=description(__doc__))
    add_data_args(parser)
    parser.set_defaults(seed=None)  # no --seed: a new random sample on every run, as in the blog
    return parser.parse_args()


def main():
    args = parse_args()

    # Load the dataset (the embedded synthetic one unless --dataset says otherwise)
    dataset = load_vqa_dataset(args.dataset, args.subset, args.split, args.num_rows)

    # Pick a random sample
    index = random.Random(args.seed).randrange(len(dataset))
    row = dataset[index]
    try:
        images = [open_image(image).convert("RGB") for image in row["images"]]
    except (BadImage, OSError) as error:
        raise SystemExit(f"row {index} has an image that does not decode: {error}") from error

    # Show its image(s) beside the conversation
    sources = sorted({turn["source"] for turn in row["texts"]})
    print(
        f"row {index:,} of {len(dataset):,}: {len(images)} image(s), {len(row['texts'])} turn(s), "
        f"source: {', '.join(sources)}"
    )
    for turn in row["texts"]:
        print(f"  User:      {turn['user']}")
        print(f"  Assistant: {turn['assistant']}")
    fig = plot_sample(
        images, row["texts"], title=f"Dataset sample: row {index} ({', '.join(sources)})"
    )
    path = save_figure(fig, args.out_dir, "01.png")
    print(f"Saved the sample to {display_path(path)}")


if __name__ == "__main__":
    with exit_on_user_error():
        main()
