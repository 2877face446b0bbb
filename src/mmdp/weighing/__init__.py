"""Weighing: every row's tokens, images, patches and drop reason, once.

weigh        weigh_rows(): every row, in parallel, cached on disk (or shared out over ranks)
cache        the weights on disk, saved atomically and checked
local_wait   the other local ranks wait for local rank 0's weights
rank_shares  every rank weighs a share; the shares are gathered
prepared     weights (and tokens) written once to a URL, read by every job
"""
