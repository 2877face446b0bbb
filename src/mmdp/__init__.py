"""mmdp: efficient multimodal (image + text) training-data pipelines, stage by stage.

The face below holds what a user's trainer needs, grouped by what it does: read your data, pad,
pack, load for training, feed a model, the loss, train in your own loop, ranks. Each name is
listed under the module that defines it, and a module is its file: `from mmdp import
PackedDataset` and `from mmdp.loading.packed_dataset import PackedDataset` are the same class,
the second naming src/mmdp/loading/packed_dataset.py (the stages import that way: the import line
is the file to open). Everything else is imported from its module. `import mmdp` alone loads none
of torch, transformers or datasets (a name's module is imported the first time it is used). The
house, one room per job:

    data/       stages 1-3: rows (reading/: your files, streams; synthetic/: the default), the
                tokenizer and chat template, images, videos, VQADataset, the padding collators;
                families/: what each real model's processor makes of a row
    packing/    stages 4-5, the pure core: the blog's loops (knapsack), pack(), the budgets,
                PackingConfig
    weighing/   what every row weighs, once (cached, prepared, shared over ranks)
    planning/   an epoch's packs, batches and ranks from the weights
    loading/    the planned packs built in DataLoader workers (PackedDataset; streaming); stage
                5's ConstantLengthDataset, the blog's
    batch       the batch contract: what a packed batch holds and how it is collated
    models/     TinyVLM and the attention a packed batch needs
    training/   stage 6: the loss, the loop, DDP, Trainer and accelerate recipes
    report/     what the stages print, their epoch reports and figures
    flags, config, errors, drop_reasons, ranks   the scripts' flags, defaults, one-line errors,
                why rows are left out, which rank this is
"""

from mmdp._lazy import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        # read your data
        "mmdp.data.reading.sources": ["load_vqa_dataset", "with_videos"],
        "mmdp.data.reading.stream": ["load_vqa_stream"],
        "mmdp.data.reading.settings": ["DataSettings"],
        "mmdp.data.tokenizer": ["get_tokenizer"],
        "mmdp.data.families": ["family_for", "offline_processor"],
        "mmdp.data.vqa_dataset": ["VQADataset"],
        # pad (stages 2-3)
        "mmdp.data.padding": ["NaivePadCollator", "ConstrainedPadCollator"],
        # pack (stages 4-5): the blog's loops, then the library's packer and its budgets
        "mmdp.packing.knapsack": ["greedy_packing", "bin_packing"],
        "mmdp.packing.packers": ["pack", "STRATEGIES"],
        "mmdp.packing.packing_config": ["PackingConfig", "default_config"],
        # load for training: weigh once, plan the epoch, build its packs in workers
        "mmdp.weighing.weigh": ["weigh_rows"],
        "mmdp.loading.packed_dataset": ["PackedDataset", "PackedDataLoader"],
        "mmdp.loading.streaming": ["StreamingPackedDataset", "StreamingDataLoader"],
        "mmdp.planning.grouping": ["ModalityLengthBatchSampler"],  # padded, grouped by length
        "mmdp.training.strategies": ["compare_padding"],  # every batching of an epoch, compared
        # feed a model: the batch contract (mmdp.batch) made the model's keywords
        "mmdp.models.inputs": ["model_inputs"],
        "mmdp.batch": ["real_token_mask"],
        # the loss
        "mmdp.training.loss": [
            "summed_loss",
            "label_tokens",
            "mean_over_tokens",
            "mean_over_samples",
        ],
        # train in your own loop: accelerate, torchrun (Trainer: mmdp.training.trainer.MMDPTrainer)
        "mmdp.training.recipes": [
            "optimizer_steps",
            "step_label_tokens",
            "micro_batch_loss",
            "gradient_sync",
            "touch_every_parameter",
            "save_loader_state",
            "load_loader_state",
            "checkpoint_loader_with",
        ],
        # ranks: several processes
        "mmdp.ranks": ["start_ranks", "gather_from_ranks"],
    },
)
