"""Stages 4-5: knapsack packing, from the toy to a loader a trainer can use.

The pure core (numpy, no torch) is here; the rest is in rooms named by what they do:

    packers         pack(), pack_flat(): greedy, binpack, bfd, images_first_bfd, balanced_greedy
                    (the readable loops; the fast engines are in _engines)
    weights         Weights: what planning knows of each row (tokens, images, patches, reason)
    packing_config  PackingConfig: budgets, packs per batch, strategy, buffer, seed
    weighing/       weigh every row once, cached or prepared (weights in)
    planning/       an epoch's packs, batches and ranks from the weights (pure)
    loading/        build, lay out and collate the planned packs; both loaders (streaming/: from a stream)

The data flows weigh -> plan -> build -> lay out -> collate; both loaders share every step.
"""
