"""Streaming: stage 5 from a stream you cannot (or will not) download first.

loader   StreamingDataLoader: the loader a trainer iterates (its docstring tells how)
dataset  StreamingPackedDataset: what each reader of the stream runs
reader   a reader's share of the stream, and its state for a resume
"""
