"""Stage 1 of the blog, "Visualising the Dataset": look at one sample before optimising anything.

    uv run 01_check_dataset.py            # a random sample of the embedded synthetic dataset
    uv run 01_check_dataset.py --seed 3   # the same sample every time
    uv run 01_check_dataset.py --dataset HuggingFaceM4/the_cauldron --subset ai2d   # needs a network
    uv run 01_check_dataset.py --dataset train.jsonl --row 0       # your own rows (README, "Your own data")
    uv run 01_check_dataset.py --dataset llava.json --image-root /data/coco --format llava

Shows the sample's image(s) beside its conversation, each image's place in the text marked
([image 1] where the model will see it), and saves the figure to assets/01.png. A row the
loaders would drop for its text (a tag without its file...) or an image that does not open is
shown with its reason. The first run generates and caches the synthetic dataset (a few
seconds); later runs load it.
"""

import dataclasses
import random

from mmdp import config
from mmdp.data.conversation import marked_turns, system_prompt
from mmdp.data.images import BadImage, decode_image
from mmdp.data.reading.settings import DataSettings
from mmdp.errors import UserError, exit_on_user_error
from mmdp.flags import Figures, parse_flags
from mmdp.report.plots import display_path, plot_sample, save_figure


@dataclasses.dataclass(frozen=True)
class Stage1Settings:
    data: DataSettings = DataSettings(num_rows=config.DEFAULT_NUM_ROWS)
    row: int | None = config.setting(None, "the row to show", shown="a random one", min=0)
    # no --seed: a new random sample on every run, as in the blog
    seed: int | None = config.setting(None, "seeds the random row", shown="none", min=0)
    figures: Figures = Figures()


def main(argv=None):
    args = parse_flags(Stage1Settings, __doc__, argv)

    # Load the dataset (the embedded synthetic one unless --dataset says otherwise)
    dataset = args.data.load()

    # Pick a sample: the one asked for, or a random one
    if args.row is not None and args.row >= len(dataset):
        raise UserError(f"--row {args.row}: the dataset has {len(dataset):,} rows")
    index = random.Random(args.seed).randrange(len(dataset)) if args.row is None else args.row
    row = dataset[index]
    files = [(f"image {k}", image) for k, image in enumerate(row["images"] or [], 1)]
    files += [(f"video {k}", video) for k, video in enumerate(row.get("videos") or [], 1)]
    images = [shown(image) for image in row["images"] or []]

    # Show its image(s) beside the conversation, each file's place in the text marked
    turns, dropped = marked_turns(
        row["texts"], len(row["images"] or []), len(row.get("videos") or [])
    )
    sources = sorted({turn["source"] for turn in row["texts"] or [] if turn and turn["source"]})
    videos = f"{len(files) - len(images)} video(s), " if len(files) > len(images) else ""
    print(
        f"row {index:,} of {len(dataset):,}: {len(images)} image(s), {videos}{len(turns)} turn(s), "
        f"source: {', '.join(sources) or '-'}"
    )
    system = system_prompt(row["texts"]) if turns else None
    if system is not None:
        print(f"  System:    {system}")
    for user, assistant in turns:  # a newline of the text shown as \n: one line a turn
        print(f"  User:      {user}".replace("\n", "\\n"))
        print(f"  Assistant: {assistant}".replace("\n", "\\n"))
    for (name, cell), image in zip(files, images + [None] * len(files)):
        if isinstance(image, str) or (cell or {}).get("path"):  # a file's path, or why it failed
            size = f"{image.width}x{image.height}" if hasattr(image, "width") else image
            print(f"  {name}: {(cell or {}).get('path') or 'in the row'} ({size or 'a video'})")
    if dropped:
        print(f"The loaders drop this row: {dropped} (mmdp.drop_reasons)")
    fig = plot_sample(
        images,
        [{"user": user, "assistant": assistant} for user, assistant in turns],
        title=f"Dataset sample: row {index} ({', '.join(sources) or 'no source'})",
        system=system,
    )
    path = save_figure(fig, args.figures.out_dir, "01.png")
    print(f"Saved the sample to {display_path(path)}")


def shown(image):
    """The image upright in RGB, as a model gets it; or, when it does not open, why."""
    try:
        return decode_image(image)[0]
    except BadImage as error:
        return str(error)  # "reason: detail"


if __name__ == "__main__":
    with exit_on_user_error():
        main()
