"""Stages 4-5, the pure core: items (and their image and patch counts) in, packs out. numpy only.

    knapsack        stage 4's loops as the blog writes them: greedy_packing, bin_packing (first-fit
                    decreasing) and the producer-consumer thread, on integers, pure Python
    packers         pack(), pack_flat(): greedy, binpack, bfd, images_first_bfd, balanced_greedy
                    (their rules; the engines that place the items are the private _engines,
                    _best_fit, _placements)
    weights         Weights: what each row weighs (tokens, images, patches) and why it is
                    unusable; Budgets: what a pack may hold, in the same units
    packing_config  PackingConfig: budgets (`config.budgets`), packs per batch, strategy, seed

The rooms beside it take the data the rest of the way: mmdp.weighing (weights in) ->
mmdp.planning (an epoch's packs) -> mmdp.loading (built, laid out, collated: mmdp.batch).
"""
