"""What stage 6's experiments read of its flags, as one frozen value: 06_packing_pays_off.py
parses its flags and hands `settings_of(ExperimentSettings, args)` (mmdp.flags) to every
experiment, so no experiment reads an argparse.Namespace."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class ExperimentSettings:
    """Stage 6's settings, named as its flags are (06_packing_pays_off.py --help tells each)."""

    # the rows (stage 1's flags) and the tokenizer
    dataset: str | None
    subset: str | None
    split: str
    num_rows: int | None
    image_root: str | None
    format: str | None
    tokenizer: str | None
    # the batches: padded (batch_size samples) or packed (stage 5's budgets and strategy)
    max_length: int
    max_images: int
    batch_size: int
    strategy: str
    # the experiments
    seed: int
    seeds: int
    orders: int
    check_samples: int
    train_samples: int
    eval_samples: int
    eval_every: int
    lr: float
    attn_implementation: str
    skip_ddp: bool
