"""Why mmdp's loaders refuse to be wrapped by another loader, in one sentence each.

`PackedDataLoader` and `StreamingDataLoader` shard by rank themselves and keep the epoch's
position in the main process. Everything that "prepares" or "resumes" a loader builds a new plain
DataLoader over `loader.dataset` instead, and then nothing of that holds:

- `accelerator.prepare(loader)` (and so transformers' Trainer, which always prepares its train
  loader) builds a `DataLoaderDispatcher` by default for an IterableDataset: rank 0 reads, tensors
  are cut to the batch size (`cu_seq_lens_q` loses entries, images are dropped) and an int such as
  `max_length_q` crashes rank 0 while the others wait (accelerate 1.15:
  DataLoaderDispatcher._fetch_batches and __iter__). With `dispatch_batches=False` it wraps the
  dataset in `IterableDatasetShard`, which shards our already sharded packs again and pads the last
  batch with duplicates (accelerate's prepare_data_loader).
- accelerate's `skip_first_batches` (what Trainer calls on resume) builds a `SkipDataLoader` that
  decodes and throws away the first batches (accelerate's SkipDataLoader).
- torchdata's `StatefulDataLoader` saves the dataset's `state_dict()` inside each worker
  (try_to_serialize in torchdata.stateful_dataloader.worker, torchdata 0.11), where our position
  never advances.

So each loader refuses: `accelerator.prepare` gets one sentence at once, on every rank and before
any collective call (RefusesAcceleratePrepare); any other DataLoader that iterates an owned
dataset gets one sentence from the dataset's `__iter__`.

Why not set `_is_accelerate_prepared = True`, so that prepare returns the loader as it is? A
prepared loader is expected to move batches to the device, to tell `accelerator.accumulate()` where
the epoch ends (Accelerator._do_sync, accelerate 1.15) and to be saved by `save_state`; ours would
do none of it, and the last two silently. Saying what to do instead is clearer.
"""

DOCS = 'docs/use-in-your-trainer.md, "Use it in your trainer"'

PREPARE_REFUSED = (
    "mmdp's loaders shard by rank and keep their epoch's position themselves, so "
    "accelerator.prepare must not rebuild them: prepare only the model and the optimizer and "
    "iterate the loader as it is (with transformers' Trainer, use mmdp.training.trainer."
    f"MMDPTrainer; {DOCS})"
)

STATEFUL_REFUSED = (
    "a PackedDataset's position is kept by its PackedDataLoader in the main process, where "
    "DataLoader workers cannot see it: save PackedDataLoader.state_dict(), not the dataset's "
    "(torchdata's StatefulDataLoader, which saves the dataset's state inside each worker, would "
    "restart the epoch)"
)


def iterated_elsewhere(dataset: str, loader: str) -> str:
    """The sentence a dataset raises when a DataLoader other than its own iterates it."""
    return (
        f"this {dataset} belongs to a {loader}, which shards it by rank and keeps its position, "
        "but another DataLoader is iterating it (accelerator.prepare, accelerate's "
        "skip_first_batches, a Trainer's own train loader, torchdata's StatefulDataLoader): "
        f"iterate the {loader} itself ({DOCS})"
    )


class RefusesAcceleratePrepare:
    """For our DataLoaders: `accelerator.prepare(loader)` raises PREPARE_REFUSED.

    accelerate asks `getattr(loader, "_is_accelerate_prepared", False)` before it builds anything
    (Accelerator.prepare_data_loader, accelerate 1.15); getattr's default only covers
    AttributeError, so a TypeError raised here reaches the caller, on every rank alike.
    """

    @property
    def _is_accelerate_prepared(self):
        raise TypeError(PREPARE_REFUSED)
