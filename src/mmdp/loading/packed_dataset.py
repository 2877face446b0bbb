"""Stage 5: multimodal knapsack packing (the blog's ConstantLengthDataset), ready for a trainer.

How an epoch is made, in the blog's terms:

1. Weigh every item without decoding it: its tokens, images and patches. Done once per dataset,
   in parallel, and cached, or read from a prepared dataset (mmdp.weighing).
2-4. Plan the epoch from the weights alone (mmdp.planning.planner): filter and count
   what cannot be packed, shuffle with (seed, epoch), pack buffer by buffer under a token budget
   and an image budget, shuffle the packs and deal them to ranks so that every rank gets the same
   number of batches and about the same number of images per step.
5. Each rank's batches are split over its DataLoader workers (batch k goes to worker
   k % num_workers, which is the order the DataLoader yields them in). In each worker a producer
   thread builds the packs of its batches (tokenize, decode and resize images, concatenate, pad
   to `max_length`) and fills a bounded queue; the DataLoader collates them with `collate_packs`.
   A rank's filler batch (a last step with fewer packs than ranks) is a copy of another rank's
   pack with every label -100: every rank yields the same number of batches, and every usable
   row is trained exactly once per epoch, on one rank.

Steps 1-4 use only weights, so every rank and worker computes the same plan and no sample is
yielded twice or lost. Images are decoded only for packs about to be yielded.

The packs and batches it yields are described in mmdp.batch (the batch contract).
"""

import dataclasses
import functools

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from mmdp.batch import build_pack, collate_packs
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import UserError
from mmdp.loading.background import iterate_in_background
from mmdp.loading.guards import STATEFUL_REFUSED, RefusesAcceleratePrepare, iterated_elsewhere
from mmdp.loading.workers import check_temp_folder, name_failed_worker
from mmdp.packing.packing_config import PackingConfig, PackingSettings, check_resume, default_config
from mmdp.planning.planner import EpochPlan, eval_split, plan_epoch
from mmdp.ranks import rank_and_world_size
from mmdp.weighing.overflow import fit_over_long, truncate_sample
from mmdp.weighing.prepared import weigh_dataset
from mmdp.weighing.row_tokens import RowTokens
from mmdp.weighing.weigh import Weighing, cache_key


class PackedDataset(PackingSettings, IterableDataset):
    """Packs a VQADataset into fixed-length rows under a token budget (max_length) and two vision
    budgets, images (max_images) and the vision encoder's patches (max_patches); the config's
    fields read as the dataset's own (`dataset.max_length`). Use it with `PackedDataLoader` (or a
    DataLoader with batch_size=packs_per_batch and collate_fn=dataset.collate). Works unchanged
    under torchrun.

    Args:
        dataset: the samples (a VQADataset).
        config: a PackingConfig (budgets, packs per batch, strategy, seed, overflow). Default:
            the model family's budgets, `default_config(family)` (Qwen-VL's 2,048 tokens and
            8,192 patches a pack, TinyVLM's 512 tokens).
        rank, world_size, group: the data-parallel rank and size, or their process group.
            Default: torch.distributed's when it is initialised, else (0, 1). With tensor or
            pipeline parallelism pass the data-parallel group (`mesh.get_group("dp")`): the
            ranks that share a model replica's shard must read the same batches.
        max_queued_packs: how many packs each DataLoader worker builds ahead.
        pretokenize: keep every sample's input_ids and labels from the weighing pass (cached
            with the weights): building a pack then only slices them and decodes images.
        num_proc: processes that weigh the rows (mmdp.weighing.weigh.weigh_rows).
        mixture: a mmdp.planning.source_shares.MixturePlan, with a `dataset` made of the same
            MixedRows: each epoch takes every source's share of the rows, balanced across ranks
            per source.
        prepared: a URL (or `from_prepared`): weigh nothing, read the weights (and the tokens,
            when prepared with them) that `uv run -m mmdp.prepare` wrote there.
        eval_ratio: hold out that share of the rows (of each source's, in a mixture) for
            evaluation, the same rows on every rank, drawn from the seed alone
            (mmdp.planning.planner.eval_split); this dataset trains on the rest.
        held_out: with eval_ratio, pack the held-out rows instead, every one once
            (`eval_dataset()` makes such a dataset).
        weighing: the rows' weighing when another PackedDataset of `dataset` holds it already
            (`eval_dataset()` passes its own): nothing is weighed again.

    The constructor weighs every row (step 1 below), on purpose: under torchrun weighing is
    collective (the ranks weigh their shares together, or wait for the one that weighs), and the
    constructor is the one line every rank runs at the same point of a script. Weighed lazily, at
    the first `len()` or `.weights`, a line only rank 0 runs (a print) would start a collective
    the other ranks never join: a hang.
    """

    def __init__(
        self,
        dataset: VQADataset,
        *,
        config: PackingConfig | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        group=None,
        max_queued_packs: int = 16,
        pretokenize: bool = False,
        num_proc: int | None = None,
        mixture=None,
        prepared: str | None = None,
        eval_ratio: float = 0.0,
        held_out: bool = False,
        weighing: Weighing | None = None,
    ):
        self.dataset = dataset
        self.config = default_config(dataset.family) if config is None else config
        self.mixture = mixture  # a MixturePlan: rows chosen by source shares
        self.max_queued_packs = max_queued_packs
        self.rank, self.world_size = rank_and_world_size(rank, world_size, group)
        self.epoch = 0
        # where the next iteration starts in this epoch (PackedDataLoader.state_dict)
        self.batches_done = 0
        self._plan = None  # (epoch, plan of every rank), in the process that plans
        self._rank_plan = None  # (epoch, this rank's part, its rows' lengths): what workers get

        # 1. Weigh every item (once: later runs and the other ranks load the cached weights),
        # with the processor's settings as they are now (the weights' cache key names them)
        self.weighed_with = dataset.family.read_settings()
        self.prepared = prepared
        if weighing is None:
            # under torchrun every rank weighs a share, unless the caller chose the ranks: a
            # dataset then built on one rank only must not wait for the others
            weighing = weigh_dataset(
                dataset,
                self.config,
                prepared=prepared,
                pretokenize=pretokenize,
                num_proc=num_proc,
                across_ranks=rank is None and world_size is None,
            )
        self.weighing = weighing
        # the weights planned from: with overflow="truncate", the over-long rows that can be cut
        # weigh their cut length, as the samples built from them will (mmdp.weighing.overflow)
        self.weights, self.truncated_rows = fit_over_long(weighing.weights, dataset, self.config)
        self.tokens = None if weighing.tokens is None else RowTokens(weighing.tokens)
        # with the tokens at hand, building a pack reads only the images (and videos) of its rows
        media = [name for name in ("images", "videos") if name in dataset.dataset.column_names]
        self.image_rows = None if self.tokens is None else dataset.dataset.select_columns(media)
        # the rows this dataset plans from (bool per row; None: all), and which split they are
        self.eval_ratio, self.split, self.split_name = eval_ratio, None, None
        if eval_ratio:
            in_eval = eval_split(
                len(self.weights), eval_ratio, self.config.seed, dataset.source_of_row
            )
            self.split = in_eval if held_out else ~in_eval
            self.split_name = "eval" if held_out else "train"

    def eval_dataset(self, config: PackingConfig | None = None) -> "PackedDataset":
        """The rows held out by `eval_ratio`, packed for evaluation: every one once, with no
        mixture's choice (each source's rows are evaluated and reported apart), on the same
        ranks, with this dataset's weighing (nothing weighed again) and `config` (default: this
        dataset's; its seed is this dataset's, which drew the held-out rows). Iterate it with its
        own PackedDataLoader (MMDPTrainer's `eval_loader`)."""
        if self.split_name != "train":
            raise ValueError("eval_dataset() needs a PackedDataset made with eval_ratio > 0")
        self.check_settings()  # the weighing it passes on is of these settings
        config = self.config if config is None else config
        return type(self)(
            self.dataset,
            config=dataclasses.replace(config, seed=self.config.seed),
            rank=self.rank,
            world_size=self.world_size,
            max_queued_packs=self.max_queued_packs,
            prepared=self.prepared,
            eval_ratio=self.eval_ratio,
            held_out=True,
            weighing=self.weighing,
        )

    @classmethod
    def from_prepared(cls, url: str, dataset: VQADataset, **settings) -> "PackedDataset":
        """A PackedDataset that weighs nothing (`prepared=url`, a path or any fsspec URL: see
        Args); refused in one sentence (a UserError) when prepared for another model, processor,
        budget or rows."""
        return cls(dataset, prepared=url, **settings)

    # 2-4. Plan the epoch ------------------------------------------------------------------------

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The epoch's plan for every rank (computed once per epoch, from the weights)."""
        epoch = self.epoch if epoch is None else epoch
        if self._plan is None or self._plan[0] != epoch:
            if self.weights is None:
                raise RuntimeError("a DataLoader worker cannot plan: plan in the main process")
            plan = plan_epoch(
                self.weights,
                self.config,
                world_size=self.world_size,
                epoch=epoch,
                mixture=self.mixture,
                split=self.split,
            )
            plan.truncated = int(np.isin(plan.rows, self.truncated_rows).sum())
            mine = plan.for_rank(self.rank)
            self._plan = (epoch, plan)
            self._rank_plan = (epoch, mine, self.weights.lengths[mine.rows])
        return self._plan[1]

    def rank_plan(self) -> tuple[EpochPlan, np.ndarray]:
        """This rank's batches of the current epoch, and the planned tokens of their rows."""
        if self._rank_plan is None or self._rank_plan[0] != self.epoch:
            self.plan(self.epoch)
        return self._rank_plan[1], self._rank_plan[2]

    def __len__(self) -> int:
        """Packs this rank yields in the current epoch (so len(DataLoader) is its batch count)."""
        return len(self.rank_plan()[0].pack_starts) - 1

    def num_batches(self) -> int:
        return self.rank_plan()[0].num_steps()

    def __getstate__(self) -> dict:
        """What a DataLoader worker receives: this rank's plan, not the weights of every row."""
        self.rank_plan()
        return {**self.__dict__, "weights": None, "weighing": None, "_plan": None}

    # Epochs, and resuming mid-epoch ---------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for a new epoch (call it before iterating, as with DistributedSampler).

        The epoch it is already in keeps its position: trainers call set_epoch before every pass
        (Trainer._run_epoch, transformers 5.23), and right after a resume that call must not restart
        the epoch.
        """
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches_done = 0

    @functools.cached_property
    def weights_key(self) -> str:
        """Names the dataset and the tokenizer (with or without pretokenize: the same plan).
        Computed when a state is first asked for, not when the dataset is built: hashing the
        tokenizer's vocabulary (about 50 ms for SmolLM2's) was most of building a PackedDataset
        whose weights are cached."""
        return cache_key(self.dataset.dataset, self.dataset.family, pretokenize=False)

    def settings(self) -> dict:
        """What decides the epoch's plan and this rank's part of it: a resume needs the same.
        (The number of DataLoader workers does not: batch k goes to worker k % workers from
        wherever the epoch resumes.) `weights` names the dataset and the tokenizer: the key of
        their weights in the cache (mmdp.weighing.weigh.cache_key)."""
        split = {"eval_ratio": self.eval_ratio, "split": self.split_name} if self.split_name else {}
        return {
            **self.config.settings(),
            "rank": self.rank,
            "world_size": self.world_size,
            "rows": len(self.dataset),
            "weights": self.weights_key,
            **split,
        }

    def state_dict(self) -> dict:
        """Refused: the state is the loader's (PackedDataLoader.state_dict). torchdata's
        StatefulDataLoader would save this one inside each worker, where batches_done never
        advances (mmdp.loading.guards)."""
        raise TypeError(STATEFUL_REFUSED)

    def load_state_dict(self, state: dict) -> None:
        """Refused, as state_dict: use PackedDataLoader.load_state_dict."""
        raise TypeError(STATEFUL_REFUSED)

    # 5. Build the packs -----------------------------------------------------------------------

    # Set by the PackedDataLoader that owns this dataset: True only while that loader starts its
    # iterator (its workers copy the dataset then), False otherwise. None: no PackedDataLoader
    # owns it, and a plain DataLoader may iterate it.
    _loader_starting: bool | None = None

    def __iter__(self):
        if self._loader_starting is False:
            raise RuntimeError(iterated_elsewhere("PackedDataset", "PackedDataLoader"))
        plan, lengths = self.rank_plan()
        worker = get_worker_info()
        worker_id, num_workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        mine = range(self.batches_done + worker_id, plan.num_steps(), num_workers)

        def produce():
            for step in mine:
                first, end = plan.batch_starts[step], plan.batch_starts[step + 1]
                for p in range(first, end):
                    a, z = plan.pack_starts[p], plan.pack_starts[p + 1]
                    pack = self.load_pack(plan.rows[a:z].tolist(), lengths[a:z].tolist(), step)
                    if plan.is_filler(step):  # another rank's pack: this rank trains nothing
                        pack["filler"] = True
                    yield pack

        return iterate_in_background(produce, max_queued=self.max_queued_packs)

    def load_pack(self, rows: list[int], planned: list[int], batch_index: int) -> dict:
        """Load the rows' samples (tokenized, or their tokens sliced; images decoded) and build
        them into one pack (build_pack); `planned` are the rows' tokens in the plan."""
        self.check_settings()
        samples = self.samples(rows)
        if self.config.overflow == "truncate":
            family = self.dataset.family
            samples = [truncate_sample(s, self.max_length, family) for s in samples]
        return build_pack(
            samples,
            planned,
            max_length=self.max_length,
            pad_token_id=self.dataset.family.pad_token_id,
            batch_index=batch_index,
            family=self.dataset.family,
        )

    def check_settings(self) -> None:
        """Refuse, in one sentence, a processor whose settings changed since the rows were
        weighed (an attribute set after the PackedDataset was made): its samples would not be
        the weights the plan packed."""
        now, then = self.dataset.family.read_settings(), self.weighed_with
        if now != then:
            changed = "; ".join(
                f"{key}: {then.get(key)} -> {now.get(key)}"
                for key in sorted(now.keys() | then.keys())
                if now.get(key) != then.get(key)
            )
            raise UserError(
                f"the processor's settings changed after its rows were weighed ({changed}); "
                "set them before making the PackedDataset"
            )

    def samples(self, rows: list[int]) -> list[dict]:
        """The rows' samples, from their pre-computed tokens when there are some: each row's
        sliced from the token file (mmdp.weighing.row_tokens), the images of the whole pack
        read at once (one datasets read per row would cost more)."""
        if self.tokens is None:
            return [self.dataset[row] for row in rows]
        media = self.image_rows[rows]
        videos = media.get("videos") or [None] * len(rows)
        samples = []
        for row, row_images, row_videos in zip(rows, media["images"], videos):
            tokenized = tuple(torch.tensor(t, dtype=torch.long) for t in self.tokens[row])
            media_of_row = {"images": row_images, "videos": row_videos}
            samples.append(self.dataset.sample(media_of_row, row, tokenized=tokenized))
        return samples

    def collate(self, packs: list[dict]) -> dict:
        """The DataLoader's collate_fn: packs into a batch, with the family's vision inputs."""
        return collate_packs(packs, self.dataset.family)


class PackedDataLoader(RefusesAcceleratePrepare, DataLoader):
    """A DataLoader over a PackedDataset that keeps track of where the epoch is.

    `state_dict()` after k batches says so; a new loader that gets it through `load_state_dict`
    yields exactly the batches after those k. After a full epoch the position resets, and
    `set_epoch` picks the next shuffle. `len()` is the epoch's batch count, wherever it resumes.

    It owns its dataset: another DataLoader that iterates the dataset (accelerate's, torchdata's)
    gets one sentence saying what to do instead, and so does `accelerator.prepare(loader)`
    (mmdp.loading.guards).
    """

    def __init__(self, dataset: PackedDataset, num_workers: int = 2, **kwargs):
        if kwargs.get("persistent_workers"):
            # persistent workers keep the dataset copy of the first epoch: set_epoch and
            # load_state_dict would not reach them
            raise ValueError("PackedDataLoader does not support persistent_workers")
        super().__init__(
            dataset,
            batch_size=dataset.packs_per_batch,
            collate_fn=dataset.collate,
            num_workers=num_workers,
            **kwargs,
        )
        dataset._loader_starting = False

    def __iter__(self):
        check_temp_folder(self.num_workers)
        self.dataset.rank_plan()  # plan once here; workers receive this rank's part
        # Workers are started (and copy the dataset), or iter(dataset) runs, inside
        # DataLoader.__iter__: only then may the dataset be iterated.
        self.dataset._loader_starting = True
        try:
            batches = super().__iter__()
        finally:
            self.dataset._loader_starting = False
        where = lambda: (self.dataset.rank, self.dataset.batches_done)  # noqa: E731
        for batch in name_failed_worker(batches, where):
            self.dataset.batches_done = batch["batch_index"] + 1
            batch["epoch"] = self.dataset.epoch  # the batch's own, whatever is fetched ahead
            yield batch
        self.dataset.batches_done = 0

    def __len__(self) -> int:
        """The epoch's batches on this rank, wherever the epoch resumes: a trainer takes len()
        once as the epoch's length (Trainer.set_initial_training_values, transformers 5.23)."""
        return self.dataset.num_batches()

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict:
        """Where this epoch is, with the settings that decide it (PackedDataset.settings)."""
        d = self.dataset
        return {**d.settings(), "epoch": d.epoch, "batches_done": d.batches_done}

    def load_state_dict(self, state: dict) -> None:
        """Continue an epoch after `batches_done` batches: the next iteration yields the rest.

        Refuses, in one sentence naming each difference, a state saved with other settings
        (another dataset, max_length, seed, world size...): the rest of that epoch is not this one's.
        """
        check_resume(
            state,
            self.dataset.settings(),
            "they decide which rows go in which batch, so resume with the same ones (or start "
            "the epoch afresh without load_state_dict)",
        )
        self.dataset.epoch = state["epoch"]
        self.dataset.batches_done = state["batches_done"]
