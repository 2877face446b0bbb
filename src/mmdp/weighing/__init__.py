"""Weighing: every row's tokens, images, patches and drop reason, once.

weigh        weigh_rows(): every row, in parallel, cached on disk (or shared out over ranks:
             every rank weighs a share, or local rank 0 weighs while the others wait)
cache        the weights on disk, saved atomically and checked
row_tokens   each row's pre-computed tokens (pretokenize=True), read back as numpy views
overflow     the rows over max_length weighed again at their cut length (overflow="truncate")
prepared     weights (and tokens) written once to a URL, read by every job; weigh_dataset():
             a dataset's weights, read from there or weighed (what PackedDataset asks)
"""
