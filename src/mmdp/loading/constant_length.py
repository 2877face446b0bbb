"""Stage 5 as the blog writes it: the ConstantLengthDataset, made correct.

    dataset = ConstantLengthDataset(VQADataset(rows, tokenizer), max_length=512, max_images=18)
    loader = DataLoader(dataset, batch_size=8, collate_fn=dataset.collate, num_workers=2)

The blog's table, row by row (README, stage 5):

    Item               a sample of the VQADataset it is handed (`VQADataset.__getitem__`)
    Weight             the sample's tokens, len(input_ids)
    Knapsack, Packing  `_balanced_greedy_knapsack`: packs of at most max_length tokens and
      Strategy         max_images images (and max_patches, a real VLM's vision encoder's)
    Producer-Consumer  `_producer` reads, filters and packs in a thread; `__iter__` takes the
                       packs out of its queue
    Sample Filtering   `_producer`: a sample over a budget, or unusable, dropped and counted
    Sharding           `make_base_iterator`: the shuffled indices, one in every (ranks x workers)
    Batching           `_pack_one_group`: a pack's samples one after the other, then padding
    Output             the packs, from `__iter__`; `collate` stacks them into a batch

Where this differs from the blog's code, to be correct:
- Samples in a pack never see each other. The blog pads on the left and gives the pack one
  attention mask of ones: every sample attends to the ones before it. Here positions restart at
  0 for every sample and the batch carries cu_seq_lens_q/k: mmdp.batch's contract, which
  mmdp.models.inputs.model_inputs passes to the model (no attention_mask: a 2-D one would
  undo the per-sample masking). A sample's first label is -100 instead of a separator token.
- An error in the producer reaches the consumer (mmdp.loading.background): the blog's
  `queue.get()` would wait for ever.
- Every drop is counted by reason: each pack carries the rows dropped since the one before
  (`dropped_rows`); those no pack follows come in a pack of no sample, which trains nothing.
- Shuffles are seeded by `seed` and the epoch (the blog calls random.seed(42) at import).

What it does not do: its ranks may yield different numbers of batches (under DDP the last step
would hang), and it cannot resume mid-epoch. mmdp.loading.packed_dataset.PackedDataset plans an
epoch from the samples' weights up front: every rank equal, resumable, a faster packer.
"""

from collections import Counter

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from mmdp.config import IGNORE_INDEX, MAX_IMAGES, MAX_LENGTH
from mmdp.drop_reasons import TOO_LONG, TOO_MANY_IMAGES, TOO_MANY_PATCHES
from mmdp.loading.background import iterate_in_background

DELTA = 5  # the blog's delta: packs opened beyond the fewest (packers.BALANCED_GREEDY_EXTRA_PACKS)
OVER_BUDGET = (TOO_LONG, TOO_MANY_IMAGES, TOO_MANY_PATCHES)  # by budget: tokens, images, patches


class ConstantLengthDataset(IterableDataset):
    """The blog's ConstantLengthDataset: packs of a VQADataset's samples, each a row of
    `max_length` tokens holding at most `max_images` images (and `max_patches` vision-encoder
    patches, when given), packed `buffer_size` samples at a time; `seed` and the epoch
    (`set_epoch`) decide the shuffles.
    """

    def __init__(
        self,
        dataset,
        *,
        max_length: int = MAX_LENGTH,
        max_images: int = MAX_IMAGES,
        max_patches: int | None = None,
        buffer_size: int = 4096,
        seed: int = 0,
    ):
        self.dataset = dataset
        self.family = dataset.family  # the model the samples are for: its inputs' shapes
        self.max_length = max_length
        self.budgets = (max_length, max_images, max_patches)  # what a pack holds at most
        self.buffer_size = buffer_size
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        """The consumer: this rank's and worker's packs, as the producer thread puts them in its
        queue of 16 (mmdp.loading.background: the blog's queue, which an error cannot hang)."""
        return iterate_in_background(self._producer, max_queued=16)

    def make_base_iterator(self):
        """This rank's and DataLoader worker's share of the indices: all of them shuffled alike
        everywhere (seed, epoch), then one in every (ranks x workers), as nanoVLM shards them."""
        worker = get_worker_info()
        workers, worker_id = (worker.num_workers, worker.id) if worker else (1, 0)
        ranks, rank = (1, 0)
        if dist.is_available() and dist.is_initialized():
            ranks, rank = dist.get_world_size(), dist.get_rank()
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.dataset))
        return iter(order[rank * workers + worker_id :: ranks * workers].tolist())

    def _producer(self):
        """The producer thread's work: read each sample of this share, drop (and count) those
        that no pack can hold, and pack the others a buffer at a time."""
        rng = np.random.default_rng([self.seed, self.epoch, 1])  # the packs' order
        buffer, dropped = [], []  # dropped: (row, reason) that no pack has reported yet
        for index in self.make_base_iterator():
            sample = self.dataset[index]  # VQADataset.__getitem__: tokens and images
            reason = sample["drop_reason"] or self.over_budget(sample)
            if reason:
                dropped.append((index, reason))
                continue
            buffer.append(sample)
            if len(buffer) == self.buffer_size:
                yield from self._packs(buffer, dropped, rng)
                buffer, dropped = [], []
        yield from self._packs(buffer, dropped, rng)

    def _packs(self, buffer: list[dict], dropped: list, rng):
        """The packs of one buffer in a shuffled order (the blog shuffles them: the knapsack
        places the longest samples first), the first carrying `dropped`."""
        groups = _balanced_greedy_knapsack([size(sample) for sample in buffer], self.budgets)
        for k in rng.permutation(len(groups)).tolist():
            yield self._pack_one_group([buffer[i] for i in groups[k]], dropped)
            dropped = []
        if dropped:  # every sample of the buffer was dropped: a pack of no sample says which
            yield self._pack_one_group([], dropped)

    def over_budget(self, sample: dict) -> str | None:
        """Why no pack can hold the sample (its first budget over, tokens first), or None."""
        for held, budget, reason in zip(size(sample), self.budgets, OVER_BUDGET):
            if budget is not None and held > budget:
                return reason
        return None

    def _pack_one_group(self, samples: list[dict], dropped=()) -> dict:
        """The blog's _pack_one_group: the samples one after the other in a row of max_length
        tokens, then padding (mmdp.batch.layout_pack lays out the library's packs the same way).

        input_ids, labels (-100 on padding and on each sample's first token: no sample learns
        to predict the next one's start), position_ids restarting at 0 for every sample and the
        padding run (a model's per-sample mask comes from them), real_token_mask, the segments'
        lengths (`seq_lens`) and each sample's vision inputs, which `collate` joins."""
        family = self.family
        seq_lens = [len(s["input_ids"]) for s in samples]
        pad = self.max_length - sum(seq_lens)
        labels = [s["labels"].clone() for s in samples]
        for sample_labels in labels:
            sample_labels[0] = IGNORE_INDEX
        positions = [s.get("position_ids", torch.arange(n)) for s, n in zip(samples, seq_lens)]
        positions.append(torch.arange(pad).expand(*family.position_rows, pad))  # Qwen-VL: [4, n]
        per_token = {"input_ids", "labels", "position_ids", *family.token_keys}  # vision: the rest
        return {
            "input_ids": torch.cat(
                [*(s["input_ids"] for s in samples), torch.full((pad,), family.pad_token_id)]
            ),
            "labels": torch.cat([*labels, torch.full((pad,), IGNORE_INDEX)]),
            "position_ids": torch.cat(positions, dim=-1),
            **{  # per-token inputs of some models (Qwen-VL, Gemma 3): 0 on padding
                key: torch.cat([*(s[key] for s in samples), torch.zeros(pad, dtype=torch.long)])
                for key in family.token_keys
            },
            "real_token_mask": torch.arange(self.max_length) < self.max_length - pad,
            "seq_lens": seq_lens + ([pad] if pad else []),
            "sample_index": [s["row"] for s in samples],
            "vision": [{k: v for k, v in s.items() if k not in per_token} for s in samples],
            "patches": sum(s["patches"] for s in samples),
            "converted": sum((Counter(s["converted"]) for s in samples), Counter()),
            "dropped_rows": list(dropped),
        }

    def collate(self, packs: list[dict]) -> dict:
        """The DataLoader's collate_fn: packs stacked into a batch of mmdp.batch's contract, all
        but `batch_index` (the batches of several workers are numbered by no one here).
        cu_seq_lens_q/k: where each segment (sample or padding run) starts in the batch read
        as one flat row; FlashAttention reads them, eager and sdpa the position_ids."""
        family, vision = self.family, [v for p in packs for v in p["vision"]]
        seq_lens = [n for p in packs for n in p["seq_lens"]]
        cu_seq_lens = torch.tensor(np.cumsum([0, *seq_lens]), dtype=torch.int32)
        dropped_rows = [row for p in packs for row in p["dropped_rows"]]
        stack = lambda key: torch.stack([p[key] for p in packs])  # noqa: E731
        long = torch.long
        # a real family: what model_inputs asks it by name (a batch holds no processor)
        real = {"model_family": family.name, "model_settings": family.model_settings()}
        return {
            "input_ids": stack("input_ids"),
            "labels": stack("labels"),
            # [B, L], or [4, B, L] for Qwen-VL's 4-row positions
            "position_ids": torch.stack(
                [p["position_ids"] for p in packs], dim=len(family.position_rows)
            ),
            **{key: stack(key) for key in family.token_keys},
            "cu_seq_lens_q": cu_seq_lens,
            "cu_seq_lens_k": cu_seq_lens,
            "max_length_q": max(seq_lens),
            "max_length_k": max(seq_lens),
            "real_token_mask": stack("real_token_mask"),
            "sample_index": torch.tensor([r for p in packs for r in p["sample_index"]], dtype=long),
            "samples_per_pack": torch.tensor([len(p["sample_index"]) for p in packs], dtype=long),
            "patches_per_pack": torch.tensor([p["patches"] for p in packs], dtype=long),
            **family.collate_vision(vision),
            "sample_of_image": torch.tensor(
                [i for i, v in enumerate(vision) for _ in range(v["image_count"])], dtype=long
            ),
            "epoch": self.epoch,
            "dropped": dict(Counter(reason for _, reason in dropped_rows)),
            "dropped_rows": dropped_rows,
            "converted": dict(sum((p["converted"] for p in packs), Counter())),
            **(real if family.name != "tiny" else {}),
        }


def size(sample: dict) -> tuple[int, int, int]:
    """A sample's weight in every budget: (tokens, images, vision-encoder patches)."""
    return len(sample["input_ids"]), sample["image_count"], sample["patches"]


def _balanced_greedy_knapsack(sizes, budgets, delta: int = DELTA) -> list[list[int]]:
    """The blog's _balanced_greedy_knapsack (Eagle 2's balanced greedy), in every budget.

    `sizes`: each sample's (tokens, images, patches); `budgets`: a pack's (max_length,
    max_images, max_patches), None for one that never binds. Returns the packs, each a list of
    positions in `sizes`, in the order they were opened.

    1. Open ceil(total tokens / max_length) + delta empty packs.
    2. Take the samples longest first (ties: the first); put each into the pack with the fewest
       tokens (ties: the first opened) that has room for it in every budget.
    3. Open a new pack when none has room. At the end, drop the packs left empty.

    Spreading the samples keeps the packs' loads even (the "balanced"), at the price of more
    packs than first-fit decreasing. Tokens 3, 6, 2, 5, 8 a pack, delta 0: two packs; 6 goes to
    A, 5 to B (the emptier), 3 to B (5 < 6), 2 to A:

    >>> _balanced_greedy_knapsack([(3, 0, 0), (6, 0, 0), (2, 0, 0), (5, 0, 0)], (8, None, None), 0)
    [[1, 2], [3, 0]]

    mmdp.packing.packers.pack(..., strategy="balanced_greedy") makes the same packs, fast
    (tests/test_knapsack.py holds them equal).
    """
    limits = [float("inf") if budget is None else budget for budget in budgets]
    packs = [[] for _ in range(-(-sum(s[0] for s in sizes) // budgets[0]) + delta)]
    loads = [(0, 0, 0)] * len(packs)  # what each pack holds: (tokens, images, patches)

    def has_room(pack: int, item: int) -> bool:
        return all(h + s <= b for h, s, b in zip(loads[pack], sizes[item], limits))

    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i][0]):
        emptiest_first = sorted(range(len(packs)), key=lambda p: loads[p][0])
        chosen = next((p for p in emptiest_first if has_room(p, i)), None)
        if chosen is None:
            packs.append([])
            loads.append((0, 0, 0))
            chosen = len(packs) - 1
        packs[chosen].append(i)
        loads[chosen] = tuple(held + more for held, more in zip(loads[chosen], sizes[i]))
    return [pack for pack in packs if pack]
