"""Stages 4-5: knapsack packing, from the toy to a loader a trainer can use.

The pure core (numpy, no torch) is here; the rest is in rooms named by what they do:

    packers         pack(), pack_flat(): greedy, binpack, bfd, images_first_bfd, balanced_greedy
                    (the readable loops; the fast engines are in _engines)
    weights         Weights: what each row weighs (tokens, images, patches) and why it is
                    unusable; Budgets: what a pack may hold, in the same units
    packing_config  PackingConfig: budgets (`config.budgets`, one Budgets value), packs per
                    batch, strategy, buffer, seed
    weighing/       weigh every row once, cached or prepared (weights in)
    planning/       an epoch's packs, batches and ranks from the weights (pure)
    loading/        build, lay out and collate the planned packs; both loaders (streaming/:
                    from a stream)

The data flows weigh -> plan -> build -> lay out -> collate; both loaders share every step.
"""
