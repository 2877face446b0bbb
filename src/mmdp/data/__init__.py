"""Stages 1-3: rows in the_cauldron's schema (yours read into it), turned into tokenized samples with
their images.

reading/      load_vqa_dataset(), load_vqa_stream(): the synthetic default, your own files
              (JSON, JSON Lines, save_to_disk, parquet; local or remote; a LLaMA-Factory
              dataset_info.json entry), or the Hub; the formats; column maps
synthetic/    the generators behind the default dataset (rows, videos)
files         local and remote files (s3://, gs://, hf://, https://): ranged reads, retries
hub           is the Hub reachable? (one sentence, not minutes of retries)
tokenizer     get_tokenizer(): SmolLM2's tokenizer shipped here, or any other
conversation  tokenize_conversation(): input_ids + labels from the chat template
images        load_image(): decode, convert to RGB, resize; bad images become named skips
videos        a clip's metadata and frames, decoded with PyAV; bad clips become named skips
vqa_dataset   VQADataset: one row in, one sample out (stage 2's map-style dataset)
padding       NaivePadCollator (stage 2), ConstrainedPadCollator (stage 3)
mixture       a mixture of sources: shares, loss weights, label policies (which rows make
              an epoch: mmdp.planning.source_shares)
families      the model families: what each processor makes of a row (base; tiny: TinyVLM's;
              one module per real family), family_for(processor)
"""
