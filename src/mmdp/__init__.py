"""mmdp: efficient multimodal (image + text) training-data pipelines, stage by stage.

The package follows the blog's parts; to use mmdp in your trainer, copy `src/mmdp/`:

    data/       stages 1-3: the rows (reading/: sources, streams; synthetic/: the default), the
                tokenizer and the chat template, images, VQADataset, the padding collators
    packing/    stages 4-5: the packers and PackingConfig (a pure core), then weighing/,
                planning/ and loading/ (the batch contract, and the two loaders: planned,
                PackedDataset; streamed, loading/streaming/)
    models/     TinyVLM (stage 6's tiny vision-language model) and the attention helpers
    training/   stage 6: the loss, the training loop, DDP, every strategy compared; training
                with Trainer, accelerate or torchrun (recipes, trainer)
    report/     epoch metrics and the figures
    config, errors, cli, drop_reasons, ranks   shared defaults, one-line errors, flags, why
                rows are left out, which rank this is

The public names below are what to import (`from mmdp import PackedDataset`); they keep working
when files move. Everything else is reachable by its module, and names starting with `_` are
private.
"""

from mmdp.data.padding import ConstrainedPadCollator, NaivePadCollator
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.reading.stream import load_vqa_stream
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.models.inputs import model_inputs
from mmdp.packing.loading.batch import collate_packs, real_token_mask, sample_ids
from mmdp.packing.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.loading.streaming.loader import StreamingDataLoader, StreamingPackedDataset
from mmdp.packing.packers import STRATEGIES, pack, pack_flat
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.planning.planner import EpochPlan, Weights, plan_epoch
from mmdp.packing.weighing.weigh import weigh_rows
from mmdp.training.loss import label_tokens, mean_over_samples, mean_over_tokens, summed_loss
from mmdp.training.recipes import (
    checkpoint_loader_with,
    gradient_sync,
    load_loader_state,
    micro_batch_loss,
    optimizer_steps,
    save_loader_state,
    step_label_tokens,
)

__all__ = [
    # data (stages 1-3)
    "load_vqa_dataset",
    "load_vqa_stream",
    "get_tokenizer",
    "VQADataset",
    "NaivePadCollator",
    "ConstrainedPadCollator",
    # packing (stages 4-5)
    "pack",
    "pack_flat",
    "STRATEGIES",
    "weigh_rows",
    "PackingConfig",
    "Weights",
    "EpochPlan",
    "plan_epoch",
    "PackedDataset",
    "PackedDataLoader",
    "StreamingPackedDataset",
    "StreamingDataLoader",
    # the batch contract
    "collate_packs",
    "model_inputs",
    "real_token_mask",
    "sample_ids",
    # the loss (stage 6)
    "summed_loss",
    "label_tokens",
    "mean_over_tokens",
    "mean_over_samples",
    # training in your own loop: accelerate, torchrun (Trainer: mmdp.training.trainer.MMDPTrainer)
    "optimizer_steps",
    "step_label_tokens",
    "micro_batch_loss",
    "gradient_sync",
    "save_loader_state",
    "load_loader_state",
    "checkpoint_loader_with",
]
