"""Packed DDP, same gradient as one process: a torchrun run of mmdp.training.ddp (two ranks, gloo, CPU)."""

from mmdp.training.ddp import run_torchrun


def test_packed_ddp_matches_one_process_only_with_tokens_counted_over_all_ranks():
    # two ranks x two gradient-accumulation micro-steps x two packs of 512 tokens
    result = run_torchrun("--num-rows", "64", "--micro-steps", "2", "--packs-per-batch", "2")
    assert result["world_size"] == 2 and result["micro_steps"] == 2
    tokens = result["label_tokens_per_rank"]
    assert tokens[0] != tokens[1]  # packs hold as many tokens, not as many label tokens
    # summed loss / label tokens all-reduced over ranks and micro-steps: one process's gradient
    assert result["grad_rel_diff_global_tokens"] < 1e-5
    # each rank's own mean, averaged by DDP: tokens weigh unequally, and the gradient is
    # another one (by how much depends on how unequal the ranks' label tokens are)
    weight = result["token_weight_per_rank_mean"]
    assert weight["min"] < 0.9 and weight["max"] > 1.1
    assert result["grad_rel_diff_per_rank_mean"] > 1e-2
