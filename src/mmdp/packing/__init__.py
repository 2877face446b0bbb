"""Stages 4-5: knapsack packing, from the toy to a loader a trainer can use.

    packers         pack(), pack_flat(): greedy, binpack, bfd, images_first_bfd, balanced_greedy
                    (the readable loops; the fast engines are in _engines)
    background      iterate_in_background(): the blog's producer-consumer thread, done safely
    toy             ToyPackingDataset: stage 4's iterable dataset of integers
    weighing        weigh_rows(): tokens, images and drop reason of every row, once, cached
    planner         plan_epoch(): an epoch's packs, batches and ranks from the weights (pure)
    batch           the batch contract: build_pack(), collate_packs(), real_token_mask(),
                    sample_ids() (what a model takes of it: mmdp.models.inputs)
    sharding        which rank this is; do all ranks still have a batch?
    grouping        modality-grouped padded batches, planned the same way (stage 3's option)
    packed_dataset  PackedDataset, PackedDataLoader: stage 5, planned up front
    streaming       StreamingPackedDataset, StreamingDataLoader: stage 5 from a stream

The data flows weigh -> plan -> build -> lay out -> collate; both loaders share every step.
"""
