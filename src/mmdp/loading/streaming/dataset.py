"""StreamingPackedDataset: what every reader of mmdp.loading.streaming.loader runs, steps
1-4 (read a buffer of its share, weigh it, pack it, build the packs into batches in a producer
thread). Iterate it with mmdp.loading.streaming.loader.StreamingDataLoader."""

import dataclasses
from collections import Counter
from collections.abc import Iterable, Iterator

import datasets
import numpy as np
from datasets.distributed import split_dataset_by_node
from torch.utils.data import IterableDataset, get_worker_info

from mmdp import config as defaults
from mmdp.batch import build_pack, collate_packs
from mmdp.data.families import family_for
from mmdp.data.images import undecoded
from mmdp.errors import UserError
from mmdp.loading.background import iterate_in_background
from mmdp.loading.guards import iterated_elsewhere
from mmdp.loading.streaming.reader import ReaderState, ReaderStream
from mmdp.packing.packing_config import PackingConfig, PackingSettings, default_config
from mmdp.packing.weights import Weights
from mmdp.planning.planner import pack_buffer
from mmdp.ranks import rank_and_world_size, sharding_warning


class StreamingPackedDataset(PackingSettings, IterableDataset):
    """Packs a stream of rows (the_cauldron's schema) into fixed-length rows under a token and an
    image budget, buffer by buffer. Iterate it with StreamingDataLoader.

    `rows`: a datasets.IterableDataset (`load_dataset(..., streaming=True)`,
    `Dataset.to_iterable_dataset(num_shards=...)`), or any iterable that starts over at every
    `iter()` and gives the same rows in the same order (a list, a reader of files): not an
    iterator, which can be read only once. `processor`: a tokenizer (mmdp's TinyVLM) or a
    transformers processor of a supported family, as for VQADataset. `config`: a PackingConfig
    (default: the family's budgets, `default_config(family)`). Under torchrun,
    rank and world size come from torch.distributed; with tensor or pipeline parallelism, pass
    the data-parallel process group (`group=mesh.get_group("dp")`) or `rank` and `world_size`.
    """

    def __init__(
        self,
        rows: Iterable[dict],
        processor,
        config: PackingConfig | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        group=None,
        image_size: int = defaults.IMAGE_SIZE,
        image_token_length: int = defaults.IMAGE_TOKEN_LENGTH,
        max_queued_batches: int = 2,
    ):
        if isinstance(rows, Iterator):
            raise TypeError(
                "rows is an iterator, which can be read only once: pass something that starts "
                "over at every iter() (a datasets.IterableDataset, a list, a reader of files), "
                "so that the next epoch and a resume can read it again"
            )
        self.family = family_for(
            processor, image_size=image_size, image_token_length=image_token_length
        )
        self.config = default_config(self.family) if config is None else config
        if self.config.overflow != "drop":
            raise UserError(
                f"overflow={self.config.overflow!r} needs the planned loader (PackedDataset): a "
                "stream weighs each buffer as it reads it, and fits no row over max_length"
            )
        self.max_queued_batches = max_queued_batches
        self.rank, self.world_size = rank_and_world_size(rank, world_size, group)
        self.total_shards = None  # a plain iterable has none
        rows = undecoded(rows)  # a datasets stream or Dataset: images and videos kept encoded
        if isinstance(rows, datasets.IterableDataset):
            self.total_shards = rows.num_shards
            if self.world_size > 1:
                rows = split_dataset_by_node(rows, self.rank, self.world_size)
        self.rows = rows  # this rank's share
        self.epoch = 0
        # Each worker's ReaderState to resume from (None: the start of the epoch); set by
        # StreamingDataLoader, it reaches the workers with the dataset.
        self.resume_states = None
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """A new shuffle of every buffer (and, for datasets, of the shards if it shuffles them)."""
        self.epoch = epoch
        if isinstance(self.rows, datasets.IterableDataset):
            self.rows.set_epoch(epoch)

    def sharding_note(self, num_workers: int) -> str | None:
        """A warning when the stream has too few shards for ranks x workers, else None."""
        rank_shards = None if self.total_shards is None else self.rows.num_shards
        return sharding_warning(
            self.total_shards, rank_shards, self.world_size, num_workers, type(self.rows).__name__
        )

    def __iter__(self):
        if self.resume_states is None:  # only StreamingDataLoader.__iter__ sets them
            raise RuntimeError(iterated_elsewhere("StreamingPackedDataset", "StreamingDataLoader"))
        worker = get_worker_info()
        worker_id, num_workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        resume = self.resume_states[worker_id]
        produced = iterate_in_background(
            lambda: self.produce(worker_id, num_workers, resume), max_queued=self.max_queued_batches
        )
        # Collate here, while the producer thread builds the next packs (as a DataLoader does
        # with its batches in the worker's main thread).
        for item in produced:
            yield item if "end_of_stream" in item else collate(item, self.family)

    def produce(self, worker: int, num_workers: int, resume: ReaderState | None):
        """Steps 1-4 for one reader: the packs of each batch with the reader's state, then an
        end-of-stream item with the rows dropped after its last batch. `resume`: the state of
        the last batch yielded before a restart (None: the start of the epoch)."""
        resume = resume or ReaderState(worker)
        if resume.ended:
            yield {"end_of_stream": True, "worker": worker, "dropped": Counter()}
            return
        reader = self.rank * num_workers + worker
        stream = ReaderStream(self.rows, reader, self.world_size * num_workers, resume.buffer_start)
        buffer = dataclasses.replace(resume, rows_held=0)  # the buffer being read
        not_reported = Counter()  # rows dropped that no yielded pack has reported yet
        packs, state = [], None
        try:
            while rows := stream.take(self.buffer_size):
                plan, dropped, lengths = self.pack_rows(rows, reader, buffer.buffer)
                if buffer.packs_done == 0:  # else the packs yielded before a resume reported them
                    not_reported.update(dropped)
                for k in range(buffer.packs_done, len(plan)):
                    pack = self.load_pack([rows[i] for i in plan[k]], lengths[plan[k]].tolist())
                    pack["dropped"].update(not_reported)
                    not_reported.clear()
                    packs.append(pack)
                    held = sum(len(p) for p in plan[k + 1 :])
                    state = dataclasses.replace(buffer, packs_done=k + 1, rows_held=held)
                    if len(packs) == self.packs_per_batch:
                        yield {"packs": packs, "reader_state": state}
                        packs = []
                buffer = ReaderState(worker, stream.state_dict(), buffer.buffer + 1)
            if packs:  # the reader's last, short batch
                yield {"packs": packs, "reader_state": state}
            yield {"end_of_stream": True, "worker": worker, "dropped": not_reported}
        finally:
            stream.close()

    def pack_rows(self, rows: list[tuple[int, dict]], reader: int, buffer_number: int):
        """Steps 1-3: weigh the buffer's rows, filter, shuffle and pack them."""
        lengths, image_counts, patches, reasons = self.family.weigh(
            [row["texts"] for _, row in rows],
            [row["images"] for _, row in rows],
            [row.get("videos") for _, row in rows],
        )
        weights = Weights.from_lists(lengths, image_counts, reasons, patches)
        rng = np.random.default_rng([self.seed, self.epoch, reader, buffer_number])
        plan, dropped = pack_buffer(weights, rng, self.config)
        return plan, dropped, weights.lengths

    def load_pack(self, rows: list[tuple[int, dict]], planned: list[int]) -> dict:
        """Load the rows' samples (tokenized, images decoded) and build them into one pack
        (build_pack); `planned` are the rows' tokens in the buffer's plan."""
        samples = [self.family.make_sample(row, row_id) for row_id, row in rows]
        # batch_index is set by the loader: the batch's place in this rank's epoch
        return build_pack(
            samples,
            planned,
            max_length=self.max_length,
            pad_token_id=self.family.pad_token_id,
            batch_index=-1,
            family=self.family,
        )


def collate(item: dict, family) -> dict:
    """A reader's packs, collated into a batch that carries its reader's state."""
    return {**collate_packs(item["packs"], family), "reader_state": item["reader_state"]}
