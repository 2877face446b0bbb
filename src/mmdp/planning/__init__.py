"""Planning: an epoch's packs, batches and ranks from the weights alone (pure, numpy).

planner        plan_epoch(): hold out, filter, shuffle and pack (a big epoch's buffers in several
               processes), deal batches to ranks; the same steps on one buffer of a stream
source_shares  MixturePlan: which rows of a mixture's sources make an epoch, each its share
grouping       stage 3's padded batches grouped by modality and length, planned alike
               (examples/group_by_length.py)
"""
