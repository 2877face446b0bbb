"""Stage 6's experiments (06_packing_pays_off.py): the computing, apart from the script's flags
and printing. Every function takes the script's settings as `settings` (ExperimentSettings).

data            StageData, load_data(): the rows, their weights, which fit, which are held out;
                every strategy's batches of the same rows
same_loss       part 1: the loss of the same samples through every strategy's batches
same_learning   part 2: every strategy trained from the same weights on the same samples
speed           part 3: real tokens per second, and where the time goes
same_gradient   part 4: one step of two ranks under torchrun against one process
settings        ExperimentSettings: what the experiments read of the flags
"""
