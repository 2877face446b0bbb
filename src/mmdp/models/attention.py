"""Attention implementations and packed batches: which transformers keeps samples apart, and a
CPU stand-in for FlashAttention so that its routing can be tested without a GPU.

What keeps the samples of a packed batch apart (see mmdp.batch and
docs/use-in-your-trainer.md):

    eager, sdpa, flex_attention   the per-sample causal mask transformers builds from restarting
                                  position_ids (masking_utils.find_packed_sequence_indices),
                                  since transformers 4.53.1; before, it silently mixed samples
    flash_attention_2 / 3         the varlen kernels, given cu_seq_lens_q/k and max_length_q/k;
                                  from position_ids alone only when the batch has ONE row
"""

from contextlib import contextmanager

import torch
import transformers


def attend(q, k, v, causal: bool, scale: float | None, window_size=(-1, -1)) -> torch.Tensor:
    """Plain softmax attention of one sequence: q [Lq, H, D], k and v [Lk, Hkv, D] -> [Lq, H, D].

    FlashAttention's conventions: queries align bottom-right with the keys (query i stands at key
    position i + Lk - Lq), so a causal query sees keys up to its own position; window_size =
    (left, right) keeps only keys within `left` positions before and `right` after it (-1: no
    limit), which is how transformers runs sliding-window layers (Gemma 3's, Mistral's). Key/value
    heads are repeated for grouped-query attention.
    """
    groups = q.shape[1] // k.shape[1]
    q, k, v = q.transpose(0, 1), k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(0, 1).transpose(1, 2) * (scale or q.shape[-1] ** -0.5)
    lq, lk = q.shape[1], k.shape[0]
    query_at = torch.arange(lq)[:, None] + (lk - lq)  # each query's position among the keys
    key_at = torch.arange(lk)[None, :]
    left, right = window_size
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed &= key_at <= query_at
    if left >= 0:
        allowed &= key_at >= query_at - left
    if right >= 0:
        allowed &= key_at <= query_at + right
    scores = scores.masked_fill(~allowed.to(scores.device), float("-inf"))
    weights = scores.float().softmax(dim=-1).to(v.dtype)
    return (weights @ v.transpose(0, 1)).transpose(0, 1)


def reference_flash_attn_func(
    q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1)
):
    """flash_attn_func's contract in plain torch: q, k, v [B, L, heads, D], no padding.

    It declares `window_size` as flash_attn's does: transformers passes only the arguments a
    kernel's signature names (_lazy_define_process_function in modeling_flash_attention_utils,
    transformers 5.23), and without it every sliding-window layer would silently run as full causal
    attention.
    """
    return torch.stack(
        [attend(q[b], k[b], v[b], causal, softmax_scale, window_size) for b in range(len(q))]
    )


def reference_flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
):
    """flash_attn_varlen_func's contract in plain torch: q, k, v [total tokens, heads, D], and
    sequence i is q[cu_seqlens_q[i] : cu_seqlens_q[i + 1]] (keys likewise). Each sequence attends
    only to itself: that is what keeps packed samples apart. window_size as in `attend`."""
    out = torch.empty_like(q)
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(bounds_q) - 1):
        (q0, q1), (k0, k1) = bounds_q[i : i + 2], bounds_k[i : i + 2]
        out[q0:q1] = attend(q[q0:q1], k[k0:k1], v[k0:k1], causal, softmax_scale, window_size)
    return out


@contextmanager
def flash_attention_on_cpu(implementation: str = "flash_attention_2"):
    """Run transformers' own FlashAttention routing with the reference kernels above.

    Inside the block, a model whose config says `implementation` goes through the real dispatch
    (integrations.flash_attention.flash_attention_forward -> _flash_attention_forward: varlen when
    cu_seq_lens_* are given or position_ids restart in a single row, plain causal attention over
    each whole row otherwise); only the two kernels are replaced. That is how a CPU test sees what
    a GPU run with FlashAttention would compute, sliding windows included (the kernels take
    window_size, as flash_attn's do). Set the model's implementation with
    `use_attention(model, implementation)`.
    """
    from transformers import modeling_flash_attention_utils as fa

    names = (
        "_loaded_implementation",
        "_flash_fn",
        "_flash_varlen_fn",
        "_pad_fn",
        "_unpad_fn",
        "_process_flash_kwargs_fn",
    )
    if not all(hasattr(fa, name) for name in names):
        raise RuntimeError(
            f"transformers {transformers.__version__} routes FlashAttention differently; the CPU "
            "stand-in needs the version in uv.lock"
        )
    saved = {name: getattr(fa, name) for name in names}
    fa._loaded_implementation = implementation
    fa._flash_fn = reference_flash_attn_func
    fa._flash_varlen_fn = reference_flash_attn_varlen_func
    fa._pad_fn, fa._unpad_fn = fa._pad_input, fa._unpad_input
    fa._process_flash_kwargs_fn = fa._lazy_define_process_function(reference_flash_attn_varlen_func)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(fa, name, value)


def use_attention(model: torch.nn.Module, implementation: str) -> torch.nn.Module:
    """Switch a built model (and every sub-model) to another attention implementation, without
    transformers' check that its kernels are installed: with FlashAttention on a CPU, only
    inside `flash_attention_on_cpu()`."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = implementation
    return model
