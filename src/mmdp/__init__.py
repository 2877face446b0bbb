"""mmdp: efficient multimodal (image + text) training-data pipelines, stage by stage.

Import the names below from here (`from mmdp import PackedDataset`): they keep working when files
move, and `import mmdp` alone loads none of torch, transformers or datasets (a name's module is
imported the first time the name is used). The house, one room per job:

    data/       stages 1-3: rows (reading/: your files, streams; synthetic/: the default), the
                tokenizer and chat template, images, videos, VQADataset, the padding collators;
                families/: what each real model's processor makes of a row
    packing/    stages 4-5, the pure core: the blog's loops (knapsack), pack(), the budgets,
                PackingConfig
    weighing/   what every row weighs, once (cached, prepared, shared over ranks)
    planning/   an epoch's packs, batches and ranks from the weights
    loading/    the planned packs built in DataLoader workers (PackedDataset; streaming)
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
        # data (stages 1-3)
        "mmdp.data.reading.sources": ["load_vqa_dataset", "load_synthetic_videos", "with_videos"],
        "mmdp.data.reading.stream": ["load_vqa_stream"],
        "mmdp.data.reading.settings": ["DataSettings", "ModelSettings"],
        "mmdp.data.tokenizer": ["get_tokenizer"],
        "mmdp.data.conversation": ["marked_turns", "system_prompt"],
        "mmdp.data.images": ["BadImage", "decode_image"],
        "mmdp.data.vqa_dataset": ["VQADataset"],
        "mmdp.data.padding": ["NaivePadCollator", "ConstrainedPadCollator", "stage3_batch"],
        "mmdp.data.families": ["MODELS", "OFFLINE", "family_for", "offline_processor"],
        # packing (stages 4-5): the blog's loops, then the library's packer
        "mmdp.packing.knapsack": [
            "greedy_packing",
            "bin_packing",
            "packs_in_background",
            "TOY_STRATEGIES",
        ],
        "mmdp.packing.packers": ["pack", "pack_flat", "STRATEGIES"],
        "mmdp.packing.weights": ["Budgets", "Weights"],
        "mmdp.packing.packing_config": ["PackingConfig", "default_config"],
        "mmdp.weighing.weigh": ["weigh_rows"],
        "mmdp.planning.planner": ["EpochPlan", "plan_epoch"],
        "mmdp.planning.grouping": ["ModalityLengthBatchSampler"],  # examples/group_by_length.py
        "mmdp.loading.packed_dataset": ["PackedDataset", "PackedDataLoader"],
        "mmdp.loading.streaming": ["StreamingPackedDataset", "StreamingDataLoader"],
        # the batch contract
        "mmdp.batch": ["collate_packs", "real_token_mask", "sample_ids"],
        "mmdp.models.inputs": ["model_inputs"],
        # the loss (stage 6)
        "mmdp.training.loss": [
            "summed_loss",
            "label_tokens",
            "mean_over_tokens",
            "mean_over_samples",
        ],
        # training in your own loop: accelerate, torchrun (Trainer: mmdp.training.trainer.MMDPTrainer)
        "mmdp.training.recipes": [
            "optimizer_steps",
            "step_label_tokens",
            "micro_batch_loss",
            "gradient_sync",
            "save_loader_state",
            "load_loader_state",
            "checkpoint_loader_with",
        ],
        # every batching of an epoch compared, from the weights alone
        "mmdp.training.strategies": ["compare_padding"],
        # several processes
        "mmdp.ranks": ["start_ranks", "gather_from_ranks"],
    },
)
