"""Epochs under transformers' Trainer: what MMDPTrainer hands Trainer instead of a length.

Trainer reads a loader's len() once and takes that many batches from every epoch, but a planned
epoch's batch count follows its shuffle. `LoaderForTrainer` shows Trainer no length and pads each
planned epoch's last optimizer step with filler micro-batches that train nothing
(mmdp.batch.filler_batch), so every step holds one epoch's batches;
`planned_max_steps` turns whole epochs into max_steps; `LoaderEpoch` makes Trainer's `epoch` (its
logs, its "per epoch" saving) the loader's. mmdp.training.trainer tells the whole story, with
transformers' file and line numbers.
"""

import math

from transformers import TrainerCallback

from mmdp.batch import filler_batch
from mmdp.training.recipes import batches_forever


def epoch_batches(dataset, epoch: int) -> int:
    """The batches every rank yields in a planned epoch (the same on every rank)."""
    return dataset.plan(epoch).num_steps()


def epoch_steps(dataset, epoch: int, grad_accum: int) -> int:
    """The optimizer steps of a planned epoch: its last one may hold fewer real batches."""
    return math.ceil(epoch_batches(dataset, epoch) / grad_accum)


class LoaderForTrainer:
    """What Trainer iterates: the mmdp loader itself, as one endless pass (no len()).

    Trainer reads len() once and takes that many batches from every epoch (the remainder of gradient
    accumulation is fixed from it too: Trainer.set_initial_training_values and Trainer._run_epoch,
    transformers 5.23), but a planned epoch's batch count changes with its shuffle (20k rows: 1344,
    1343, ...). An epoch shorter than len() would carry its last micro-batch into the next epoch's
    first step and leave a batch of a longer one untrained. So Trainer sees no length (it then runs
    max_steps as one pass: trainer_utils.has_length, Trainer.set_initial_training_values), and a
    planned loader's epoch ends with `filler` micro-batches up to a whole step of `grad_accum`:
    every step holds one epoch's batches, and every epoch's rows are trained once. A stream (no
    plan) runs as one endless pass of full steps (mmdp.training.recipes.batches_forever).
    """

    def __init__(self, loader, grad_accum: int = 1):
        self.loader = loader
        self.grad_accum = grad_accum
        self.planned = hasattr(loader.dataset, "num_batches")  # PackedDataset

    @property
    def dataset(self):
        return self.loader.dataset

    def __len__(self) -> int:
        raise TypeError("MMDPTrainer runs its loader as one pass of max_steps optimizer steps")

    def __iter__(self):
        return self.epochs_in_whole_steps() if self.planned else batches_forever(self.loader)

    def epochs_in_whole_steps(self):
        """The loader's batches epoch after epoch, each epoch padded with fillers to a multiple
        of grad_accum. The loader moves to its next epoch before the fillers are yielded, so a
        checkpoint taken after the step says where the next batch comes from. Ends after two
        passes in a row without a batch (as batches_forever)."""
        empty_passes = 0
        while empty_passes < 2:
            empty_passes += 1
            planned, last = len(self.loader), None
            for last in self.loader:
                empty_passes = 0
                yield last
            self.loader.set_epoch(self.dataset.epoch + 1)
            if last is not None:
                fillers = -planned % self.grad_accum
                for i in range(fillers):
                    # only the step's last micro-batch syncs (DDP's all-reduce): the fillers
                    # before it need no forward (MMDPTrainer.filler_loss)
                    yield {**filler_batch(last), "forward": i == fillers - 1}

    def set_epoch(self, epoch: int) -> None:
        """Trainer's epoch is always 0 here (one pass): the loader keeps its own epochs."""

    def batches_before(self, epoch: int, batches_done: int) -> int:
        """The micro-batches (fillers included) yielded before this position: Trainer's
        global_step x grad_accum at a checkpoint."""
        earlier = sum(epoch_steps(self.dataset, e, self.grad_accum) for e in range(epoch))
        return earlier * self.grad_accum + batches_done


class LoaderEpoch(TrainerCallback):
    """Trainer's `epoch` is the loader's, and its epoch strategies follow the loader's epochs.

    Trainer, running one pass, would log the fraction of the run as `epoch` (in Trainer._run_epoch,
    transformers 5.23, set just before on_step_end) and save, log or evaluate "per epoch" only at
    the end of that pass. Here the step that ends a loader epoch asks for them; at the end of the
    pass Trainer's own "epoch" evaluation is dropped when that step has just evaluated
    (DefaultFlowCallback.on_epoch_end asks again at the same step).
    """

    def __init__(self, loader):
        self.loader = loader
        self.epochs_done = 0
        self.evaluated_at = None  # the global step of the last evaluation

    def on_train_begin(self, args, state, control, **kwargs):
        self.epochs_done = math.floor(state.epoch or 0)  # a resumed run's, from its checkpoint

    def on_step_end(self, args, state, control, **kwargs):
        dataset = self.loader.dataset
        state.epoch = dataset.epoch + dataset.batches_done / max(len(self.loader), 1)
        if state.epoch == int(state.epoch) and state.epoch > self.epochs_done:
            self.epochs_done = int(state.epoch)  # this step ended an epoch
            control.should_save |= args.save_strategy == "epoch"
            control.should_log |= args.logging_strategy == "epoch"
            control.should_evaluate |= args.eval_strategy == "epoch"

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluated_at = state.global_step

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.evaluated_at == state.global_step:  # after DefaultFlowCallback's: not twice
            control.should_evaluate = False


def planned_max_steps(loader, args) -> int:
    """The optimizer steps of args.num_train_epochs whole planned epochs (each epoch's own
    count: its last step may be short), or args.max_steps when it is set."""
    if args.max_steps > 0:
        return args.max_steps
    if not hasattr(loader.dataset, "num_batches"):
        raise ValueError("a stream has no length: set TrainingArguments.max_steps")
    epochs = range(int(args.num_train_epochs))
    return sum(epoch_steps(loader.dataset, e, args.gradient_accumulation_steps) for e in epochs)
