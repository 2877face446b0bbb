"""A mixture of datasets: several sources, each with its share of the epoch, a loss weight and a
label policy, as VLMs are trained (the_cauldron alone has 50 subsets; ms-swift gives each
dataset its own `loss_scale`).

A mixture file (JSON; `examples/pack_mixture.py --mixture FILE.json`):

    {"share_by": "tokens",
     "sources": [
       {"name": "describe", "dataset": "synthetic:describe", "share": 0.5},
       {"name": "charts", "dataset": "synthetic:chart", "share": 0.3, "loss_weight": 2.0},
       {"name": "chat", "dataset": "synthetic:multiturn", "share": 0.2, "labels": "last_turn"}]}

- `dataset`: `synthetic:TASK` (the rows of one task of the embedded synthetic data: count,
  colour, chart, diagram, describe, compare, multiturn, text_only), a user's files (JSON, JSON
  Lines, save_to_disk, parquet; local or remote) or a Hub name (`subset`, `split`, `num_rows`,
  `image_root`, `format`, `columns` as for one dataset: mmdp.data.reading.sources.load_vqa_dataset;
  LLaMA-Factory's entry as "data/dataset_info.json:NAME").
- `share`: the source's part of the epoch; shares are normalised to sum to 1.
- `share_by`: "tokens" (default) or "rows". Tokens, because a step costs tokens, not rows: with
  packing a step is a fixed token budget, so a token share is that share of the compute and of
  the label tokens. By rows, a source of long samples (descriptions: 5x the tokens of a counting
  question) silently takes several times its asked part of the run.
- `epoch_size` (optional, in share_by's unit): the epoch's total. Default: the largest epoch
  that repeats no row (the source that runs out first is taken whole, the others in part).
  A larger one repeats the rows of the sources it needs to (whole passes, then a seeded part).
- `loss_weight` (default 1): every label token of the source's samples counts this much in the
  loss (mmdp.training.loss.weighted_mean_over_tokens); batches carry it as `loss_weights`.
- `labels`: "all_turns" (default) trains every reply; "last_turn" only the last one.

Planning (mmdp.planning.source_shares, and mmdp.planning.planner step 0 and 3b):
after the unusable rows are filtered out, each source's usable rows are shuffled with (seed, epoch,
source) and taken until the source's token (or row) target is met; the chosen rows are packed
together, and each step's batches are given to the ranks so that every rank's tokens of every source
stay even over the epoch. Every rank computes the same plan. The epoch report's per-source table:
mmdp.report.sources.
"""

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import datasets
import numpy as np

from mmdp import config
from mmdp.data.reading.settings import DataSettings
from mmdp.errors import UserError

SHARE_UNITS = ("tokens", "rows")
LABEL_POLICIES = ("all_turns", "last_turn")
SYNTHETIC_PREFIX = "synthetic:"


@dataclass(frozen=True)
class Source:
    name: str
    data: DataSettings  # its rows; its dataset is "synthetic:TASK", a user's files or a Hub name
    share: float
    loss_weight: float = 1.0
    labels: str = "all_turns"  # one of LABEL_POLICIES


@dataclass(frozen=True)
class Mixture:
    sources: tuple[Source, ...]
    share_by: str = "tokens"  # one of SHARE_UNITS
    epoch_size: int | None = None  # in share_by's unit; None: the largest with no row repeated

    def shares(self) -> np.ndarray:
        asked = np.array([s.share for s in self.sources], dtype=np.float64)
        return asked / asked.sum()


def read_mixture(path: str | Path) -> Mixture:
    """A Mixture from a JSON file (see the module docstring); bad input is one UserError."""
    try:
        spec = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"mixture {path}: no such file") from None
    except json.JSONDecodeError as error:
        raise UserError(f"mixture {path}: not JSON ({error})") from None
    return mixture_from_dict(spec, str(path))


def mixture_from_dict(spec: dict, where: str = "mixture") -> Mixture:
    reading = set(DataSettings.__dataclass_fields__)
    known = reading | set(Source.__dataclass_fields__) - {"data"}
    sources = []
    for i, entry in enumerate(spec.get("sources") or []):
        unknown = set(entry) - known
        if unknown or "dataset" not in entry or "share" not in entry:
            raise UserError(
                f"{where}: source {i + 1} needs 'dataset' and 'share'"
                + (f" and has unknown key(s) {', '.join(sorted(unknown))}" if unknown else "")
            )
        data = DataSettings(**{key: value for key, value in entry.items() if key in reading})
        rules = {key: value for key, value in entry.items() if key not in reading}
        source = Source(**{"name": entry["dataset"], **rules, "data": data})
        check_source(source, where)
        sources.append(source)
    if not sources:
        raise UserError(f"{where}: no sources (expected {{'sources': [{{'dataset', 'share'}}]}})")
    if len({s.name for s in sources}) < len(sources):
        raise UserError(f"{where}: two sources share a name; give each a distinct 'name'")
    share_by = spec.get("share_by", "tokens")
    if share_by not in SHARE_UNITS:
        raise UserError(f"{where}: share_by is {share_by!r}, expected one of {SHARE_UNITS}")
    epoch_size = spec.get("epoch_size")
    if epoch_size is not None and not (isinstance(epoch_size, int) and epoch_size > 0):
        raise UserError(f"{where}: epoch_size must be a positive integer, got {epoch_size!r}")
    return Mixture(tuple(sources), share_by, epoch_size)


def check_source(source: Source, where: str) -> None:
    if not (isinstance(source.share, (int, float)) and source.share > 0):
        raise UserError(f"{where}: source {source.name!r} has share {source.share!r}, not > 0")
    if not (isinstance(source.loss_weight, (int, float)) and source.loss_weight >= 0):
        raise UserError(
            f"{where}: source {source.name!r} has loss_weight {source.loss_weight!r}, not >= 0"
        )
    if source.labels not in LABEL_POLICIES:
        raise UserError(
            f"{where}: source {source.name!r} has labels {source.labels!r}, "
            f"expected one of {LABEL_POLICIES}"
        )


# Loading ---------------------------------------------------------------------------------------


@dataclass
class MixedRows:
    """Every source's rows one after the other (one datasets.Dataset), and each row's source."""

    dataset: datasets.Dataset
    source_of_row: np.ndarray  # int16 [rows]: the position of the row's source in the mixture
    mixture: Mixture
    rows_per_source: list = field(default_factory=list)


def load_mixture(mixture: Mixture, num_rows: int, seed: int = 0) -> MixedRows:
    """Load every source (`num_rows`: the synthetic data's size, and the default cap of each
    other source) and put them one after the other."""
    from mmdp.data.reading.sources import CONVERSATION_FEATURES, FEATURES, VIDEOS, no_progress_bars

    parts = []
    for source in mixture.sources:
        data = source.data
        if data.dataset.startswith(SYNTHETIC_PREFIX):
            part = synthetic_task(data.dataset.removeprefix(SYNTHETIC_PREFIX), num_rows, seed)
            part = part.select(range(min(len(part), data.num_rows or len(part))))
        else:
            part = replace(data, num_rows=data.num_rows or num_rows).load()
        parts.append(part)
    # every source's rows in one schema: the_cauldron's, with the system prompts and the videos
    # of the sources that have them (the others' empty)
    columns = ["images", "texts"]
    if any("system" in part.features["texts"].feature for part in parts):
        features = datasets.Features({key: CONVERSATION_FEATURES[key] for key in columns})
    else:
        features = FEATURES
    if any("videos" in part.column_names for part in parts):
        parts = [
            part
            if "videos" in part.column_names
            else part.add_column("videos", [[]] * len(part), feature=VIDEOS)
            for part in parts
        ]
        columns, features = [*columns, "videos"], datasets.Features({**features, "videos": VIDEOS})
    with no_progress_bars():  # a cast of a few thousand rows: its bar would only clutter
        parts = [part.select_columns(columns).cast(features) for part in parts]
    sizes = [len(part) for part in parts]
    source_of_row = np.repeat(np.arange(len(parts), dtype=np.int16), sizes)
    return MixedRows(datasets.concatenate_datasets(parts), source_of_row, mixture, sizes)


def synthetic_task(task: str, num_rows: int, seed: int) -> datasets.Dataset:
    """The rows of one task of the embedded synthetic dataset of `num_rows` rows."""
    from mmdp.data.reading.sources import load_synthetic
    from mmdp.data.synthetic.rows import TASKS

    if task not in TASKS:
        raise UserError(
            f"source synthetic:{task}: no such task (the synthetic data has {', '.join(TASKS)})"
        )
    rows = load_synthetic(max(num_rows, config.DEFAULT_NUM_ROWS), seed=seed)
    texts = rows.select_columns(["texts"])["texts"]
    return rows.select([i for i, t in enumerate(texts[:num_rows]) if t and t[0]["source"] == task])


# What each source's samples become -------------------------------------------------------------


def last_turn_labels(labels):
    """Labels of the last reply only: every labelled token before the last run of labelled
    tokens becomes IGNORE_INDEX (replies are runs of labels, separated by the user's turns).

    >>> import torch
    >>> last_turn_labels(torch.tensor([-100, 5, 6, -100, -100, 8, 9, -100])).tolist()
    [-100, -100, -100, -100, -100, 8, 9, -100]
    """
    labelled = (labels != config.IGNORE_INDEX).nonzero().flatten()
    if len(labelled) == 0:
        return labels
    gaps = (labelled[1:] - labelled[:-1] > 1).nonzero().flatten()
    start = int(labelled[gaps[-1] + 1]) if len(gaps) else int(labelled[0])
    out = labels.clone()
    out[:start] = config.IGNORE_INDEX
    return out


def apply_source_rules(sample: dict, source: Source) -> dict:
    """A sample as its source asks: its label policy applied, its loss weight attached."""
    if sample["drop_reason"] is not None:
        return sample
    if source.labels == "last_turn":
        sample = {**sample, "labels": last_turn_labels(sample["labels"])}
    return {**sample, "loss_weight": float(source.loss_weight)}
