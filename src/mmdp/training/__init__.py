"""Stage 6: does packing pay off?

loss        the loss of any mmdp batch, per token or per sample, and its parts for DDP;
            batch_loss: one forward and the loss of its trained positions only (the trainers')
loop        train and evaluate a TinyVLM, timing each part of a step
ddp         packed batches under DDP: the loss that gives one process's gradient
strategies  compare_strategies(): every batching strategy on one epoch, from weights
experiments 06_packing_pays_off.py's parts: same loss, same learning, speed, every strategy
recipes     in your own loop (accelerate, torchrun): the micro-batches of each optimizer step,
            the loss that gives one process's gradient, gradient sync, the loader's state per rank
trainer     MMDPTrainer: transformers' Trainer on an mmdp loader (needs the accelerate extra)
examples    what examples/*.py share: their settings, the embedded data, a tiny model, the sample log
"""
