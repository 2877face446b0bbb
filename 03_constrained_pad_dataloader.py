"""Stage 3 of the blog, "Constrained Padding": one fixed max length, longer samples dropped.

    uv run 03_constrained_pad_dataloader.py
    uv run 03_constrained_pad_dataloader.py --max-length 1024 --metrics-json /tmp/03.json

Prints the shapes of one batch, how many samples were dropped, the waste over a whole epoch, and
saves assets/03.png: the first batch that drops a sample, stage 2's batch (02.png) at the fixed
length. Every batch is padded to max_length, whatever its content. For trainers
that cannot pack, the same max_length with batches grouped by modality and length:
examples/group_by_length.py.
"""

import dataclasses

import torch
from torch.utils.data import DataLoader

from mmdp import config
from mmdp.batch import real_token_mask
from mmdp.data.padding import ConstrainedPadCollator
from mmdp.data.reading.settings import DataSettings
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import exit_on_user_error
from mmdp.flags import Figures, LoaderSettings, flag_values, parse_flags
from mmdp.report.epoch import run_epoch
from mmdp.report.metrics import EpochReport, write_json
from mmdp.report.plots import display_path, plot_padding, save_figure, waste_title
from mmdp.report.printing import print_batch, print_settings


@dataclasses.dataclass(frozen=True)
class Settings:
    data: DataSettings = DataSettings(num_rows=config.DEFAULT_NUM_ROWS)
    seed: int = config.setting(0, "random seed", min=0)
    loader: LoaderSettings = LoaderSettings()
    batch_size: int = config.setting(config.BATCH_SIZE, "samples per padded batch", min=1)
    max_length: int = config.setting(
        config.MAX_LENGTH,
        "fixed length every batch is padded to; longer samples are dropped",
        min=1,
    )
    figures: Figures = Figures()


def main(argv=None):
    settings = parse_flags(Settings, __doc__, argv)
    args = flag_values(settings)
    print_settings(args)

    # Get the text tokenizer (SmolLM2's, shipped in the repo) and the dataset
    tokenizer = get_tokenizer(args.tokenizer)
    rows = settings.data.load()

    # Wrap it: each item is tokenized with the chat template, 64 image tokens per image
    train_dataset = VQADataset(rows, tokenizer)

    # Constrained padding drops samples longer than max_length and pads the rest to max_length
    loader = DataLoader(
        train_dataset,
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
        num_workers=args.num_workers,
        collate_fn=ConstrainedPadCollator(tokenizer.pad_token_id, args.max_length),
    )

    # Go through one epoch; keep the first batch that dropped a sample to show it (as the blog does)
    report = EpochReport()
    shown, _ = run_epoch(
        loader, report, keep_batch=lambda batch: batch["dropped"], hint="raise --max-length"
    )

    print("\nOne batch:")
    print_batch(shown)
    print(
        f"This batch has {len(shown['sample_index'])} of {args.batch_size} samples; dropped: "
        f"{shown['dropped'] or 'none'}"
    )
    print(f"\nOver the epoch:\n{report.summary()}")
    if args.metrics_json:
        print(
            f"Wrote the epoch report to {display_path(write_json(report.as_dict(), args.metrics_json))}"
        )

    # Visualize the padding of that batch, naming the samples dropped
    lengths = real_token_mask(shown).sum(dim=1).tolist()
    dropped = ", ".join(f"sample {row:,} ({reason})" for row, reason in shown["dropped_rows"])
    title = waste_title(
        f"Constrained Padding, one batch: padded to {args.max_length}, {dropped or 'none'} dropped",
        lengths,
        args.max_length,
    )
    names = [f"sample {row:,}" for row in shown["sample_index"].tolist()]
    fig = plot_padding(lengths, args.max_length, title, limit=args.max_length, names=names)
    path = save_figure(fig, args.out_dir, "03.png")
    print(f"Saved the padding figure to {display_path(path)}")


if __name__ == "__main__":
    with exit_on_user_error():
        main()
