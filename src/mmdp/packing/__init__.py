"""Stages 4-5: knapsack packing, from the toy to a loader a trainer can use.

    packers         pack(), pack_flat(): greedy, binpack, bfd, images_first_bfd, balanced_greedy
                    (the readable loops; the fast engines are in _engines)
    background      iterate_in_background(): the blog's producer-consumer thread, done safely
    toy             ToyPackingDataset: stage 4's iterable dataset of integers
    packing_config  PackingConfig: budgets, packs per batch, strategy, buffer, seed; one resume
                    check for both loaders
    weights         Weights: what planning knows of each row (tokens, images, patches, reason)
    weighing        weigh_rows(): tokens, images and drop reason of every row, once, cached
    weights_cache   the weights on disk, saved atomically and checked (weighing, prepared)
    local_wait      other local ranks wait for local rank 0's weights
    rank_shares     every rank weighs a share; the shares are gathered
    planner         plan_epoch(): an epoch's packs, batches and ranks from the weights (pure)
    planning_processes  an epoch's buffers packed in several processes (same plan)
    mixture_plan    MixturePlan: which rows of a mixture's sources make an epoch
    batch           the batch contract: build_pack(), collate_packs(), real_token_mask(),
                    sample_ids() (what a model takes of it: mmdp.models.inputs)
    sharding        which rank this is; do all ranks still have a batch? shards enough?
    grouping        modality-grouped padded batches, planned the same way (stage 3's option)
    packed_dataset  PackedDataset, PackedDataLoader: stage 5, planned up front
    prepared        weights (and tokens) written once to a URL, read by every job
    streaming       StreamingDataLoader: stage 5 from a stream (the module docstring tells how)
    streaming_dataset  StreamingPackedDataset: what each reader of the stream runs
    stream_reader   a reader's share of the stream, and its state for a resume
    buffer          pack_buffer(): the planner's steps on one buffer (pure)

The data flows weigh -> plan -> build -> lay out -> collate; both loaders share every step.
"""
