"""Reading: rows from wherever they are kept, into the_cauldron's schema.

sources      load_vqa_dataset(): the synthetic default, your own files, or the Hub
formats      the formats users keep rows in (the_cauldron, messages, LLaVA), into one schema
column_maps  columns named otherwise: LLaMA-Factory's dataset_info.json entries, ms-swift's
             --columns
stream       load_vqa_stream(): the same sources, read as a stream (examples/pack_streaming.py)
"""
