"""Stage 6: does packing pay off?

loss        the loss of any mmdp batch, per token or per sample, and its parts for DDP
loop        train and evaluate a TinyVLM, timing each part of a step
ddp         packed batches under DDP: the loss that gives one process's gradient
strategies  compare_strategies(): every batching strategy on one epoch, from weights
"""
