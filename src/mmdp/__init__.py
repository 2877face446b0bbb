"""mmdp: efficient multimodal (image + text) training-data pipelines, stage by stage.

Modules, in the order the stages use them:
    config          shared defaults (image tokens per image, image size, chat template...)
    tokenizer       get_tokenizer(): SmolLM2's tokenizer shipped in the repo, or any other
    data            load_vqa_dataset(): the synthetic default, a local copy, or the Hub
    synthetic       the generator behind the default dataset
    conversation    tokenize_conversation(): input_ids + labels from the chat template
    images          load_image(): decode, convert to RGB, resize; bad images become named skips
    vqa_dataset     VQADataset: stage 2's map-style dataset
    collate         NaivePadCollator (stage 2), ConstrainedPadCollator (stage 3), real_token_mask()
    drop_reasons    why a row is left out: every reason under one name
    metrics         EpochReport, PackReport: utilization and dropped samples over an epoch
    plots           the figures under assets/
    packing         pack(): greedy, binpack, bfd, images_first_bfd, balanced_greedy (stages 4-6)
    background      iterate_in_background(): the producer-consumer thread, done safely
    toy             ToyPackingDataset: stage 4's iterable dataset of integers
    weighing        weigh_rows(): tokens, images and drop reason of every row, once, cached
    planner         plan_epoch(): an epoch's packs, batches and ranks from the weights (pure)
    packed_batch    layout_pack(), collate_packs(), model_inputs(): what a packed batch is
    attention       which attention keeps packed samples apart; FlashAttention's routing on CPU
    packed_dataset  PackedDataset, PackedDataLoader: stage 5
    streaming       StreamingPackedDataset, StreamingDataLoader: stage 5 from a stream
    data_stream     load_vqa_stream(): data's sources, read as a stream (stage 5 --streaming)
    model           TinyVLM: stage 6's tiny vision-language model, its two loss reductions
    training        train and evaluate a TinyVLM, timing each part of a step (stage 6)
    ddp             packed batches under DDP: the loss that gives one process's gradient
    strategies      compare_strategies(): every strategy on one epoch (stage 6)
    cli, errors, hub  command-line flags, one-line errors, is the Hub reachable
"""
