"""Train with transformers' Trainer on an mmdp loader: `MMDPTrainer` (needs the accelerate extra).

    train = PackedDataset(samples, eval_ratio=0.1)             # 10% of the rows held out
    trainer = MMDPTrainer(
        model=model,
        args=TrainingArguments(output_dir="out", gradient_accumulation_steps=2, max_steps=12,
                               eval_strategy="epoch"),
        train_loader=PackedDataLoader(train),                    # or a StreamingDataLoader
        eval_loader=PackedDataLoader(train.eval_dataset()),      # optional: exact eval_loss
        model_inputs=model_inputs,                               # the batch keys the model takes
    )
    trainer.train(resume_from_checkpoint=True)                 # True: the last checkpoint

What a plain Trainer does to an mmdp loader, and what MMDPTrainer does instead (transformers 5.23,
methods of transformers' Trainer):

1. Trainer builds its own DataLoader and passes it to accelerator.prepare (_get_dataloader), which
   cuts our tensors or re-shards our packs (mmdp.loading.guards). MMDPTrainer hands Trainer
   the loader itself (get_train_dataloader; nothing else prepares it: _inner_training_loop,
   _prepare_for_training), so Trainer's own batching flags (per_device_train_batch_size,
   dataloader_num_workers, remove_unused_columns: _get_dataloader) never touch it. The model gets
   `model_inputs(batch, model)`, not the batch's ints and per-sample tensors.
2. Epochs. Trainer reads len() once and takes that many batches from every epoch
   (set_initial_training_values, _run_epoch), but a planned epoch's batch count follows its shuffle
   (1344, 1343, ...): a shorter epoch would carry its last micro-batch into the next epoch's first
   step, and a longer one would leave batches untrained. MMDPTrainer shows Trainer no length, so
   Trainer runs max_steps as one pass (set_initial_training_values); each planned epoch ends with
   zero-loss `filler` micro-batches up to a whole step (at most gradient_accumulation_steps - 1 per
   epoch), so every optimizer step holds one epoch's batches, every row is trained once per epoch,
   and a whole num_train_epochs becomes max_steps = the sum of each planned epoch's steps (a
   fraction of an epoch is refused: set max_steps).
3. On resume Trainer calls accelerate's skip_first_batches (in _run_epoch), which would rebuild a
   plain DataLoader, decode the batches already trained and throw them away. MMDPTrainer turns that
   skip into a restore of the loader's state saved with the checkpoint, and checks it is where
   Trainer thinks it is (global_step x gradient_accumulation_steps micro-batches, fillers included).
   Trainer's own counters (step, updates, RNG) stay those of the run that never stopped.
4. Every checkpoint gets each rank's loader state (`mmdp_loader_state_rank{r}.pt`), written
   atomically by every rank at the start of Trainer's _save_checkpoint, before Trainer deletes older
   checkpoints at its end (_save_checkpoint; on_save runs after that: _maybe_log_save_evaluate), so
   a kill at any point leaves a checkpoint that resumes.
5. The loss: compute_loss_func=token_loss, the summed token loss over the label tokens of the whole
   optimizer step on every rank, each token weighed by a mixture's `loss_weights` when the batch has
   them (Trainer passes only the labels to compute_loss_func: MMDPTrainer adds the weights). Trainer
   counts those tokens whenever a compute_loss_func is set (_get_num_items_in_batch), so this holds
   for models with accepts_loss_kwargs=False too (Qwen2.5-VL, Qwen3-VL), whose own loss would be a
   per-rank, per-micro-batch mean: a gradient off by as much as the ranks' label tokens differ
   (0.075 relative in the slow tests, docs/use-in-your-trainer.md). With token_loss (the default),
   MMDPTrainer computes it over the trained positions only (mmdp.training.loss.batch_loss: the
   logits of the label positions, a chunk at a time; the model's `logits` cover no position), with a
   MoE model's router term when it returns router logits (output_router_logits=True); a
   compute_loss_func of your own gets the full logits.
6. DDP: a micro-batch without images leaves the vision tower unused, and DDP waits for every
   gradient. Instead of Trainer's find_unused_parameters=True for a PreTrainedModel, MMDPTrainer
   adds 0 x every trainable parameter to the loss (mmdp.training.recipes.touch_every_parameter
   says why) and leaves ddp_find_unused_parameters False when it is unset.
7. Trainer's logs count samples and real tokens: "Num examples" and samples/s from the planned
   samples of epoch 0 (Trainer's count packs: set_initial_training_values), tokens seen from
   `real_token_mask` (include_num_input_tokens_seen="non_padding" counts tokens other than the pad
   id, _track_num_input_tokens, and ours is <|im_end|>).
8. Evaluation: `eval_loader` (a PackedDataLoader of `train.eval_dataset()`, or of any packed
   dataset) replaces Trainer's eval set. evaluate(), eval_strategy and load_best_model_at_end
   work as usual, but `eval_loss` is mmdp.training.evaluation's: every eval token's summed loss
   over every eval label token, all ranks together, plus `eval_SOURCE_loss` per source of a
   mixture (not Trainer's evaluation_loop: why in mmdp.training.evaluation). With
   eval_strategy="epoch", the step that ends a loader epoch evaluates (LoaderEpoch).
9. It refuses, in one sentence: ignore_data_skip=True (the epoch would restart),
   average_tokens_across_devices=False with several ranks (the token count would be this
   rank's only), one process on several GPUs (Trainer's nn.DataParallel, 2672, splits
   cu_seq_lens, pixel_values and position_ids along dim 0), an `eval_dataset` (pass
   eval_loader) or eval_strategy without eval_loader, and processes that train alone (on a
   machine without a GPU, Trainer needs use_cpu=True:
   mmdp.training.recipes.check_launched_processes).

A stream (StreamingDataLoader) has no plan: set max_steps. It runs as one endless pass of full
steps; the loader moves from epoch to epoch itself (mmdp.training.recipes.batches_forever), and
Trainer's "Num examples" stays its estimate in packs (a stream's samples are unknown ahead).

TRL's SFTTrainer: `from mmdp.training.trainer import MMDPSFTTrainer` (made on first use: TRL is
optional) is `class MMDPSFTTrainer(MMDPTrainerMixin, SFTTrainer)`, with the same arguments plus
`processing_class` (your tokenizer or processor: without it SFTTrainer downloads one). SFTTrainer
insists on a datasets.Dataset and reads its first row (trl 1.16, SFTTrainer.__init__):
MMDPSFTTrainer passes a one-row placeholder, which nothing trains on. Its loss is MMDPTrainer's,
in one forward (MMDPTrainerMixin.compute_loss): SFTTrainer's own compute_loss would run the model
a second time, without gradient, for its entropy and token accuracy (sft_trainer.py, trl 1.16),
which MMDPSFTTrainer therefore does not log. Tested on a tiny Llama (tests/test_trainer_exact.py):
one forward per micro-batch, and the same steps and weights as MMDPTrainer.
"""

import contextlib
import math
import os
import time
import warnings

import transformers.trainer as hf_trainer
from transformers import PreTrainedModel, Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from mmdp.batch import filler_batch
from mmdp.errors import require_extra
from mmdp.loading.packed_dataset import PackedDataLoader
from mmdp.models.inputs import model_inputs as packed_model_inputs
from mmdp.training import evaluation
from mmdp.training.loss import batch_loss, summed_weighted_loss
from mmdp.training.recipes import (
    batches_forever,
    check_launched_processes,
    epoch_steps,
    load_loader_state,
    save_loader_state,
    touch_every_parameter,
)

# Trainer needs accelerate, which only an extra installs; without it transformers fails later, in
# TrainingArguments, naming its own install. One sentence here instead, at the import.
require_extra("accelerate", "accelerate", "MMDPTrainer (transformers' Trainer)")

NO_EVAL_DATASET = (
    "MMDPTrainer evaluates an mmdp loader, not an eval_dataset (Trainer's evaluation averages "
    "each batch's mean loss over batches it builds itself): pass eval_loader="
    "PackedDataLoader(train.eval_dataset()), from PackedDataset(..., eval_ratio=R)"
)
NO_EVAL_LOADER = (
    "eval_strategy is set but MMDPTrainer has no eval_loader: pass eval_loader="
    "PackedDataLoader(train.eval_dataset()), from PackedDataset(..., eval_ratio=R)"
)


def token_loss(outputs, labels, num_items_in_batch=None, loss_weights=None):
    """Trainer's compute_loss_func: this micro-batch's summed next-token loss, each token weighed
    by its sample's `loss_weights` (a mixture's per-source weight; 1 without), divided by the
    label tokens of the whole optimizer step on every rank (`num_items_in_batch`).

    Trainer counts them over the step's micro-batches and sums them over ranks
    (Trainer._get_num_items_in_batch, transformers 5.23), multiplies the loss by the number of
    processes because DDP averages gradients (Trainer.compute_loss) and does not divide it by the
    accumulation steps (Trainer.training_step).
    It counts `labels[..., 1:] != -100` or `labels != -100` depending on the model; mmdp batches
    give both the same count, since every sample's first label is -100 (mmdp.batch).
    """
    if num_items_in_batch is None:
        raise ValueError("Trainer counted no label tokens: the batches need a 'labels' key")
    logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
    batch = {"labels": labels.to(logits.device)}
    if loss_weights is not None:
        batch["loss_weights"] = loss_weights
    return summed_weighted_loss(logits, batch) / num_items_in_batch


def check_arguments(args, loader, replicas: int) -> None:
    """Refuse a loader sharded for another number of data-parallel replicas than Trainer trains,
    and the TrainingArguments under which an mmdp loader cannot resume or be normalised."""
    check_launched_processes(args.world_size)
    if args.n_gpu > 1:
        raise ValueError(
            f"one process sees {args.n_gpu} GPUs, and Trainer would wrap the model in "
            "nn.DataParallel, which splits cu_seq_lens, pixel_values and position_ids along "
            "dim 0: launch one process per GPU (torchrun --nproc-per-node N) or set "
            "CUDA_VISIBLE_DEVICES to one GPU"
        )
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
    if args.max_steps <= 0 and args.num_train_epochs != int(args.num_train_epochs):
        raise ValueError(
            f"num_train_epochs={args.num_train_epochs} is not a whole number of epochs: set "
            "max_steps instead"
        )


def load_model_weights(model, checkpoint: str) -> bool:
    """Load a checkpoint's full model weights into `model` by the model class's own rules; False
    when there is nothing of that kind to load (FSDP shards, a PEFT adapter: Trainer's own way).

    Trainer's resume reads model.safetensors and calls `model.load_state_dict(state_dict, False)`
    (Trainer._load_from_checkpoint, transformers 5.23), but save_pretrained wrote the keys under the
    names the class's checkpoints use (Qwen2.5-VL: `visual.*`, `model.layers.*`, not
    `model.visual.*`, `model.language_model.*`): no weight is loaded, a warning lists them as
    missing, and the run goes on from its initial weights. from_pretrained knows the class's key
    mapping.
    """
    names = ("model.safetensors", "model.safetensors.index.json")
    if not isinstance(model, PreTrainedModel) or not any(
        os.path.isfile(os.path.join(checkpoint, name)) for name in names
    ):
        return False
    saved = type(model).from_pretrained(checkpoint, config=model.config, dtype=model.dtype)
    model.load_state_dict(saved.state_dict(), strict=True)  # every weight, or an error
    return True


# Epochs (item 2): what Trainer iterates instead of the loader, and the loader's epochs as Trainer's


def planned_max_steps(loader, args) -> int:
    """The optimizer steps of args.num_train_epochs whole planned epochs (each epoch's own
    count: its last step may be short), or args.max_steps when it is set."""
    if args.max_steps > 0:
        return args.max_steps
    if not hasattr(loader.dataset, "num_batches"):
        raise ValueError("a stream has no length: set TrainingArguments.max_steps")
    epochs = range(int(args.num_train_epochs))
    return sum(epoch_steps(loader.dataset, e, args.gradient_accumulation_steps) for e in epochs)


class LoaderForTrainer:
    """What Trainer iterates: the mmdp loader itself, as one endless pass with no len() (item 2).
    A planned loader's epochs end with `filler` micro-batches (mmdp.batch.filler_batch) up to a
    whole step of `grad_accum`; a stream runs as one endless pass of full steps
    (mmdp.training.recipes.batches_forever).
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


class MMDPTrainerMixin:
    """Trainer on an mmdp loader: put it before Trainer (or a Trainer subclass) in the bases.

    `train_loader`: a PackedDataLoader or StreamingDataLoader (not passed to accelerate).
    `eval_loader`: a PackedDataLoader of an eval split (optional), for evaluate() and
    eval_strategy. `model_inputs(batch, model)`: the batch keys the model takes (default
    mmdp.models.inputs's, for a Hugging Face model; TinyVLM: mmdp.models.tiny_vlm.vlm_inputs).
    `compute_loss_func` defaults to token_loss.
    """

    def __init__(
        self, *args, train_loader, eval_loader=None, model_inputs=packed_model_inputs, **kwargs
    ):
        kwargs.setdefault("compute_loss_func", token_loss)
        if kwargs.get("eval_dataset") is not None:
            raise ValueError(NO_EVAL_DATASET)
        args_given = kwargs.get("args", args[1] if len(args) > 1 else None)
        if eval_loader is None and args_given is not None and args_given.eval_strategy != "no":
            raise ValueError(NO_EVAL_LOADER)
        if args_given is not None and args_given.ddp_find_unused_parameters is None:
            args_given.ddp_find_unused_parameters = False  # item 6
        if eval_loader is not None:
            # Trainer requires an eval set when eval_strategy is set; only evaluate() reads it
            kwargs["eval_dataset"] = self.eval_placeholder(eval_loader)
        super().__init__(*args, **kwargs)
        self.eval_loader = eval_loader
        # the processes that share one replica's batches (tensor, context, sequence parallel)
        shared = self.get_tp_size() * self.get_cp_size() * self.get_sp_size()
        check_arguments(self.args, train_loader, self.args.world_size // shared)
        # whole epochs become max_steps: Trainer then runs one pass (LoaderForTrainer)
        self.args.max_steps = planned_max_steps(train_loader, self.args)
        self.train_loader = train_loader
        self.loader_for_trainer = LoaderForTrainer(
            train_loader, self.args.gradient_accumulation_steps
        )
        self.model_inputs = model_inputs
        if self.loader_for_trainer.planned:
            self.add_callback(LoaderEpoch(train_loader))

    def get_train_dataloader(self):
        return self.loader_for_trainer  # as it is: not through accelerator.prepare

    def eval_placeholder(self, eval_loader):
        """What Trainer holds as its eval_dataset: the eval loader's dataset (never read)."""
        return eval_loader.dataset

    def get_eval_dataloader(self, eval_dataset=None):
        if self.eval_loader is None:
            raise ValueError(NO_EVAL_LOADER)
        return self.eval_loader

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """eval_loader's exact loss (mmdp.training.evaluation), logged and handed to callbacks as
        Trainer.evaluate does; `eval_dataset` may be another PackedDataLoader to evaluate."""
        loader = self.get_eval_dataloader() if eval_dataset is None else eval_dataset
        if not isinstance(loader, PackedDataLoader):
            raise ValueError(NO_EVAL_DATASET)
        start = time.time()
        # as Trainer.evaluation_loop: the model as it runs (DDP unwrapped, FSDP as wrapped)
        model = self._wrap_model(self.model, training=False)
        metrics = evaluation.evaluate(
            model,
            loader,
            lambda batch, _: self.model_inputs(batch, self.model),  # as compute_loss calls it
            device=self.args.device,
            autocast=self.compute_loss_context_manager,
            prefix=metric_key_prefix,
        )
        metrics[f"{metric_key_prefix}_runtime"] = round(time.time() - start, 4)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(
            self.args, self.state, self.control, metrics
        )
        return metrics

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The batch's loss in one forward, whatever Trainer subclass comes next (not SFTTrainer's
        second one): a filler's, token_loss's, or that of a compute_loss_func of your own
        (Trainer.compute_loss itself: the full logits); under DDP with every trainable parameter
        in its backward (item 6: touch_every_parameter)."""
        model_inputs = self.model_inputs(inputs, self.model)  # unwrapped: Gemma 3 reads its config
        if inputs.get("filler"):
            forward = inputs.get("forward", True)
            result = self.filler_loss(model, model_inputs, inputs, return_outputs, forward)
        elif self.compute_loss_func is token_loss:
            result = self.token_loss(
                model, model_inputs, inputs, return_outputs, num_items_in_batch
            )
        elif inputs.get("loss_weights") is not None:
            raise ValueError(
                "the batch carries a mixture's loss_weights, which only "
                "mmdp.training.trainer.token_loss applies: leave compute_loss_func unset"
            )
        else:
            result = Trainer.compute_loss(
                self, model, model_inputs, return_outputs, num_items_in_batch
            )
        if return_outputs:
            return touch_every_parameter(result[0], model), result[1]
        return touch_every_parameter(result, model)

    def token_loss(self, model, model_inputs, batch, return_outputs, num_items_in_batch):
        """token_loss over the trained positions only (batch_loss): the micro-batch's summed
        (weighted) token loss and router term over `num_items_in_batch`, the step's label tokens
        on every rank (BatchLoss.over), times the processes as Trainer.compute_loss does with
        average_tokens_across_devices (transformers 5.23), since DDP averages gradients. Trainer
        takes it as scaled for gradient accumulation: compute_loss_func is set."""
        if num_items_in_batch is None:
            raise ValueError("Trainer counted no label tokens: the batches need a 'labels' key")
        parts = batch_loss(model, model_inputs, batch)
        loss = parts.over(num_items_in_batch)
        if self.args.average_tokens_across_devices:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        return (loss, parts.outputs) if return_outputs else loss

    def filler_loss(self, model, model_inputs, batch, return_outputs=False, forward=True):
        """A filler's loss: exactly 0, with a gradient of exactly 0 for every parameter the
        forward used (so DDP and FSDP still reduce at the step's last micro-batch). Every label
        of a filler is ignored, so batch_loss computes no logits; never divided by its label
        tokens (0: a per-batch mean would be NaN).

        An epoch's end pads its last step with fillers on every rank alike (LoaderForTrainer):
        those before the step's last micro-batch (`forward` False) run no forward under one
        process or DDP (Trainer's no_sync: nothing to meet), only a 0 on one parameter, which
        backward() needs. Under FSDP or DeepSpeed every filler runs the model."""
        if not (forward or return_outputs or self.is_fsdp_enabled or self.is_deepspeed_enabled):
            return next(p for p in model.parameters() if p.requires_grad).view(-1)[0] * 0.0
        parts = batch_loss(model, model_inputs, batch)
        loss = parts.over(1) * 0.0
        return (loss, parts.outputs) if return_outputs else loss

    def set_initial_training_values(self, args, dataloader):
        """Trainer's "Num examples" and samples/s in samples rather than packs (item 7)."""
        values = list(super().set_initial_training_values(args, dataloader))
        if self.loader_for_trainer.planned:
            values[2], values[3] = self.planned_samples(values[6])
        return tuple(values)

    def planned_samples(self, max_steps: int) -> tuple[int, int]:
        """(samples of epoch 0 on all ranks, samples of max_steps steps at epoch 0's samples
        per step): exact for epoch 0, an estimate beyond it, without planning every epoch."""
        dataset, grad_accum = self.train_loader.dataset, self.args.gradient_accumulation_steps
        samples = len(dataset.plan(0).rows)
        steps = max(epoch_steps(dataset, 0, grad_accum), 1)
        return samples, round(samples * max_steps / steps)

    def _track_num_input_tokens(self, inputs):
        """Tokens seen, counted on real tokens, not on tokens other than the pad id (item 7). A
        filler counts none."""
        name = getattr(self.model, "main_input_name", "input_ids")
        real = inputs.get("real_token_mask", inputs.get("attention_mask"))
        if real is None:
            return super()._track_num_input_tokens(inputs)
        ids = inputs[name][:0] if inputs.get("filler") else inputs[name]
        return super()._track_num_input_tokens({name: ids, "attention_mask": real})

    def _save_checkpoint(self, model, trial):
        """Every rank writes its loader state into the checkpoint folder first, then Trainer
        saves the rest (item 4): a state written in on_save, which runs after Trainer's
        rotate_checkpoints, would leave a kill in between with a newest checkpoint that cannot
        resume, and the previous one deleted."""
        folder = os.path.join(
            self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        )
        save_loader_state(self.train_loader, folder, self.args.process_index)
        self.accelerator.wait_for_everyone()  # every rank's file, before rank 0 rotates
        return super()._save_checkpoint(model, trial)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        """Trainer's resume, with a full model's weights loaded by its class (load_model_weights)."""
        model = self.model if model is None else model
        if self.is_fsdp_enabled or self.is_deepspeed_enabled:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        if not load_model_weights(model, resume_from_checkpoint):
            super()._load_from_checkpoint(resume_from_checkpoint, model)

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
        transformers.trainer at module level, called in Trainer._run_epoch; transformers 5.23)
        restores our loader from `checkpoint` instead; any other loader still goes to accelerate's.

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
        """Load this rank's loader state; check a planned one is where Trainer resumes (item 3)."""
        load_loader_state(self.train_loader, checkpoint, self.args.process_index)
        if self.loader_for_trainer.planned:
            dataset = self.train_loader.dataset
            done = self.loader_for_trainer.batches_before(dataset.epoch, dataset.batches_done)
            if done != batches_trained:
                raise RuntimeError(
                    f"the checkpoint's loader state is {done} micro-batches into the run (epoch "
                    f"{dataset.epoch}, batch {dataset.batches_done}), Trainer resumes after "
                    f"{batches_trained}: the run was saved with other settings (ranks, gradient "
                    "accumulation, packs per batch?)"
                )


class MMDPTrainer(MMDPTrainerMixin, Trainer):
    """transformers' Trainer on an mmdp loader (see the module's docstring)."""


def __getattr__(name: str):
    """`MMDPSFTTrainer`, made on first use: TRL is an optional dependency."""
    if name != "MMDPSFTTrainer":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from datasets import Dataset
    from trl import SFTTrainer

    class MMDPSFTTrainer(MMDPTrainerMixin, SFTTrainer):
        """TRL's SFTTrainer on an mmdp loader (see the module's docstring)."""

        def __init__(self, *args, **kwargs):
            # SFTTrainer requires a dataset and looks at its first row; the batches are the loader's
            kwargs.setdefault("train_dataset", Dataset.from_dict({"input_ids": [[0]]}))
            with warnings.catch_warnings():
                # TRL warns that compute_loss_func costs a second forward: not here (compute_loss)
                warnings.filterwarnings(
                    "ignore", "`compute_loss_func` is deprecated", FutureWarning
                )
                super().__init__(*args, **kwargs)

        def eval_placeholder(self, eval_loader):
            """SFTTrainer tokenizes an eval set it is given: a one-row placeholder, never read."""
            return Dataset.from_dict({"input_ids": [[0]]})

    globals()[name] = MMDPSFTTrainer
    return MMDPSFTTrainer
