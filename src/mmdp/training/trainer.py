"""Train with transformers' Trainer on an mmdp loader: `MMDPTrainer` (needs `mmdp[accelerate]`).

    trainer = MMDPTrainer(
        model=model,
        args=TrainingArguments(output_dir="out", gradient_accumulation_steps=2, max_steps=12),
        train_loader=PackedDataLoader(PackedDataset(samples)),   # or a StreamingDataLoader
        model_inputs=model_inputs,                               # the batch keys the model takes
    )
    trainer.train(resume_from_checkpoint=True)                 # True: the last checkpoint

What a plain Trainer does to an mmdp loader, and what MMDPTrainer does instead (transformers 5.23,
file:line in transformers/trainer.py):

1. Trainer builds its own DataLoader and passes it to accelerator.prepare (1051), which cuts our
   tensors or re-shards our packs (mmdp.packing.guards). MMDPTrainer hands Trainer the loader
   itself (get_train_dataloader; nothing else prepares it: 1597, 1715-1817), so Trainer's own
   batching flags (per_device_train_batch_size, dataloader_num_workers, remove_unused_columns:
   1019-1022) never touch it. The model gets `model_inputs(batch, model)`, not the batch's ints and
   per-sample tensors.
2. On resume Trainer calls accelerate's skip_first_batches (1844), which would rebuild a plain
   DataLoader, decode the batches already trained and throw them away, and then set_epoch (1851),
   which would have restarted the epoch. MMDPTrainer turns that skip into a restore of the
   loader's state saved with the checkpoint, and checks it is where Trainer thinks it is. Trainer's
   own counters (step, updates, RNG) stay those of the run that never stopped.
3. Every checkpoint gets each rank's loader state (`mmdp_loader_state_rank{r}.pt`, written in
   on_save, which runs on every rank: 2276-2278). A checkpoint is pushed to the Hub before
   on_save runs, so a pushed checkpoint gets its loader states with the next push.
4. The loss: compute_loss_func=token_loss, the summed token loss over the label tokens of the
   whole optimizer step on every rank. Trainer counts those tokens whenever a compute_loss_func
   is set (2308-2318), so this holds for models with accepts_loss_kwargs=False too (Qwen2.5-VL,
   Qwen3-VL), whose own loss would be a per-rank, per-micro-batch mean: a gradient off by as
   much as the ranks' label tokens differ (0.075 relative in the slow tests,
   docs/use-in-your-trainer.md).
5. It refuses ignore_data_skip=True (the epoch would restart, and a short last step of the epoch
   would never be taken), average_tokens_across_devices=False with several ranks (the token
   count would be this rank's only), and processes that train alone (on a machine without a
   GPU, Trainer needs use_cpu=True: mmdp.training.recipes.check_launched_processes).

A stream (StreamingDataLoader) has no length: set max_steps. Trainer then sees one endless pass;
the loader moves from epoch to epoch itself (mmdp.training.recipes.batches_forever).

TRL's SFTTrainer derives from Trainer: `class MMDPSFTTrainer(MMDPTrainerMixin, SFTTrainer)` takes
the same arguments (not run here: SFTTrainer also wants a datasets.Dataset as train_dataset).
"""

import contextlib
import os

import transformers.trainer as hf_trainer
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from mmdp.models.inputs import model_inputs as packed_model_inputs
from mmdp.training.loss import summed_loss
from mmdp.training.recipes import (
    batches_forever,
    check_launched_processes,
    load_loader_state,
    save_loader_state,
)


def token_loss(outputs, labels, num_items_in_batch=None):
    """Trainer's compute_loss_func: this micro-batch's summed next-token loss, divided by the
    label tokens of the whole optimizer step on every rank (`num_items_in_batch`).

    Trainer counts them over the step's micro-batches (transformers/trainer.py:2327-2335), sums
    them over ranks (2340-2342), multiplies the loss by the number of processes because DDP
    averages gradients (2199-2207) and does not divide it by the accumulation steps (2103-2111).
    It counts `labels[..., 1:] != -100` or `labels != -100` depending on the model; mmdp batches
    give both the same count, since every sample's first label is -100 (mmdp.packing.batch).
    """
    if num_items_in_batch is None:
        raise ValueError("Trainer counted no label tokens: the batches need a 'labels' key")
    logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
    return summed_loss(logits, labels.to(logits.device)) / num_items_in_batch


class LoaderForTrainer:
    """What Trainer iterates: the mmdp loader itself, with the length of a whole epoch.

    Trainer needs len() (a planned epoch's batches; a stream has none: TypeError tells Trainer to
    use max_steps, transformers/trainer_utils.py has_length), iter(), `.dataset` and set_epoch
    (transformers/trainer.py:2504, 1851-1859, 993-1005).
    """

    def __init__(self, loader):
        self.loader = loader
        self.planned = hasattr(loader.dataset, "num_batches")  # PackedDataset
        self.restored = False  # a checkpoint's state was just loaded: the next set_epoch checks it

    @property
    def dataset(self):
        return self.loader.dataset

    def __len__(self) -> int:
        if not self.planned:
            raise TypeError("a stream has no length: set TrainingArguments.max_steps")
        return len(self.loader)

    def __iter__(self):
        return iter(self.loader) if self.planned else batches_forever(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Trainer's epoch. A planned loader follows it (the same epoch keeps its position); a
        stream is one endless pass to Trainer and keeps its own epochs."""
        restored, self.restored = self.restored, False
        if not self.planned:
            return
        if restored and epoch != self.dataset.epoch:
            raise RuntimeError(
                f"Trainer resumes epoch {epoch}, the checkpoint's loader state is in epoch "
                f"{self.dataset.epoch}: the run was saved with other settings (ranks, gradient "
                "accumulation, packs per batch?)"
            )
        self.loader.set_epoch(epoch)


class SaveLoaderState(TrainerCallback):
    """Every rank writes its loader's state into each checkpoint folder Trainer saves."""

    def __init__(self, loader):
        self.loader = loader

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        save_loader_state(self.loader, folder, args.process_index)


def check_arguments(args, loader, replicas: int) -> None:
    """Refuse a loader sharded for another number of data-parallel replicas than Trainer trains,
    and the TrainingArguments under which an mmdp loader cannot resume or be normalised."""
    check_launched_processes(args.world_size)
    if loader.dataset.world_size != replicas:
        raise ValueError(
            f"the loader is sharded over {loader.dataset.world_size} rank(s), Trainer trains "
            f"{replicas} data-parallel replica(s): build the loader with "
            "rank=args.process_index, world_size=args.world_size (or the data-parallel group), "
            "and on a machine without a GPU set use_cpu=True, or Trainer runs each process alone"
        )
    if args.ignore_data_skip:
        raise ValueError(
            "ignore_data_skip=True makes Trainer restart the epoch on resume (and never take the "
            "epoch's short last step): leave it False, MMDPTrainer restores the loader instead"
        )
    if args.world_size > 1 and not args.average_tokens_across_devices:
        raise ValueError(
            "average_tokens_across_devices=False divides each rank's loss by its own label "
            "tokens, which is not one process's gradient: leave it True"
        )


class MMDPTrainerMixin:
    """Trainer on an mmdp loader: put it before Trainer (or a Trainer subclass) in the bases.

    `train_loader`: a PackedDataLoader or StreamingDataLoader (not passed to accelerate).
    `model_inputs(batch, model)`: the batch keys the model takes (default mmdp.packing.batch's,
    for a Hugging Face model; TinyVLM: mmdp.models.tiny_vlm.vlm_inputs). `compute_loss_func` defaults
    to token_loss.
    """

    def __init__(self, *args, train_loader, model_inputs=packed_model_inputs, **kwargs):
        kwargs.setdefault("compute_loss_func", token_loss)
        super().__init__(*args, **kwargs)
        # the processes that share one replica's batches (tensor, context, sequence parallel)
        shared = self.get_tp_size() * self.get_cp_size() * self.get_sp_size()
        check_arguments(self.args, train_loader, self.args.world_size // shared)
        self.train_loader = train_loader
        self.loader_for_trainer = LoaderForTrainer(train_loader)
        self.model_inputs = model_inputs
        self.add_callback(SaveLoaderState(train_loader))

    def get_train_dataloader(self):
        return self.loader_for_trainer  # as it is: not through accelerator.prepare

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = self.model_inputs(inputs, self.model)  # unwrapped: Gemma 3 reads its config
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def train(self, resume_from_checkpoint=None, **kwargs):
        if resume_from_checkpoint is True:  # as Trainer.train does, to know the folder here
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"no checkpoint found in {self.args.output_dir}")
        with self.restore_instead_of_skipping(resume_from_checkpoint or None):
            return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    @contextlib.contextmanager
    def restore_instead_of_skipping(self, checkpoint: str | None):
        """While train() runs, Trainer's skip_first_batches (accelerate's, imported into
        transformers.trainer: transformers/trainer.py:219, called at :1844) restores our loader
        from `checkpoint` instead; any other loader still goes to accelerate's.

        If transformers stops calling it through that module name, Trainer hands our view to
        accelerate's, which fails at once (the view has no drop_last), never silently.
        """
        accelerate_skip = hf_trainer.skip_first_batches

        def skip_first_batches(dataloader, num_batches=0):
            if dataloader is not self.loader_for_trainer:
                return accelerate_skip(dataloader, num_batches)
            self.restore_loader(checkpoint, num_batches)
            return dataloader

        hf_trainer.skip_first_batches = skip_first_batches
        try:
            yield
        finally:
            hf_trainer.skip_first_batches = accelerate_skip

    def restore_loader(self, checkpoint: str, batches_trained: int) -> None:
        """Load this rank's loader state; a planned epoch must be where Trainer resumes it."""
        load_loader_state(self.train_loader, checkpoint, self.args.process_index)
        if self.loader_for_trainer.planned:
            done = self.train_loader.dataset.batches_done
            if done != batches_trained:
                raise RuntimeError(
                    f"the checkpoint's loader state is {done} batches into its epoch, Trainer "
                    f"resumes after {batches_trained}: the run was saved with other settings "
                    "(ranks, gradient accumulation, packs per batch?)"
                )
        self.loader_for_trainer.restored = True


class MMDPTrainer(MMDPTrainerMixin, Trainer):
    """transformers' Trainer on an mmdp loader (see the module's docstring)."""
