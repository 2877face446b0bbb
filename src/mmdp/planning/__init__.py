"""Planning: an epoch's packs, batches and ranks from the weights alone (pure, numpy).

planner        plan_epoch(): filter, shuffle and pack, deal batches to ranks
processes      an epoch's buffers packed in several processes (the same plan)
buffer         pack_buffer(): the planner's steps on one buffer of a stream
source_shares  MixturePlan: which rows of a mixture's sources make an epoch, each its share
held_out       eval_split(): the rows held out for evaluation, from the seed alone
grouping       stage 3's padded batches grouped by modality and length, planned alike
               (examples/group_by_length.py)
"""
