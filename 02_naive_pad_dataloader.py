"""Stage 2 of the blog, "Naive Padding": tokenize everything, pad each batch to its longest sample.

    uv run 02_naive_pad_dataloader.py
    uv run 02_naive_pad_dataloader.py --batch-size 16 --metrics-json /tmp/02.json

Prints the shapes of one batch and the waste over a whole epoch, and saves assets/02.png: each
sample's content in blue, its padding in grey. The batch shown is the first with a sample over
512 tokens: the batch stage 3 shows, that sample dropped. The blog measured ~60% padding.
"""

import dataclasses

import torch
from torch.utils.data import DataLoader

from mmdp import config
from mmdp.batch import real_token_mask
from mmdp.data.padding import NaivePadCollator
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

    # Use the naive collator to pad each batch to the longest sample in it
    loader = DataLoader(
        train_dataset,
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
        num_workers=args.num_workers,
        collate_fn=NaivePadCollator(tokenizer.pad_token_id),
    )

    # Go through one epoch; keep the first batch with a sample over stage 3's max length (512)
    report = EpochReport()
    longer = lambda batch: real_token_mask(batch).sum(dim=1).max() > config.MAX_LENGTH  # noqa: E731
    first_batch, _ = run_epoch(loader, report, keep_batch=longer)

    print("\nOne batch:")
    print_batch(first_batch)
    print(f"\nOver the epoch:\n{report.summary()}")
    if args.metrics_json:
        print(
            f"Wrote the epoch report to {display_path(write_json(report.as_dict(), args.metrics_json))}"
        )

    # Visualize the padding of that batch
    lengths = real_token_mask(first_batch).sum(dim=1).tolist()
    width = first_batch["input_ids"].shape[1]
    title = waste_title(
        f"Naive Padding, one batch: padded to its longest ({width})", lengths, width
    )
    names = [f"sample {row:,}" for row in first_batch["sample_index"].tolist()]
    path = save_figure(plot_padding(lengths, width, title, names=names), args.out_dir, "02.png")
    print(f"Saved the padding figure to {display_path(path)}")


if __name__ == "__main__":
    with exit_on_user_error():
        main()
