"""CPU stand-ins for the two kernels that keep packed samples apart in Qwen3.5's linear-attention
(Gated DeltaNet) layers, installed through transformers' own kernel resolution.

    fla.chunk_gated_delta_rule       (flash-linear-attention) the recurrence; bounds: cu_seqlens
    causal_conv1d.causal_conv1d_fn   (causal-conv1d) the conv of 4 taps before it; bounds: seq_idx

Like the real kernels, each keeps samples apart only when handed the bounds, and the varlen
recurrence refuses a batch of more than one row (fla/ops/gated_delta_rule/chunk.py, fla-core
0.6.0: "The batch size is expected to be 1 rather than B when using `cu_seqlens`"). They compute
with transformers' own torch code, one sample at a time, so a sample packed and the sample alone
run the same arithmetic.

How transformers finds them (integrations/hub_kernels.py, transformers 5.23):
use_kernel_func_from_hub_with_fallback (990) imports the package when the model's module is
imported (1011) and keeps its function, else the module's torch code (1023-1025); the torch code
refuses the bounds (1033-1040: "can't keep packed sequences apart without ..."); a kernel gets only
the keyword arguments its signature names (1050). Qwen3.5's layer calls the conv with every
keyword the model was given (modeling_qwen3_5.py:587-593) and the recurrence with
cu_seqlens=kwargs.pop("cu_seq_lens_q") (632-643). `linear_attention_kernels` puts stand-in
packages in sys.modules and runs that resolution again on the already imported modules.
"""

import sys
import types
from contextlib import contextmanager

import torch
from torch.nn import functional as F
from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback
from transformers.models.qwen3_5 import modeling_qwen3_5
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe

# transformers' torch recurrence, under its decorator (functools.wraps keeps it as __wrapped__)
torch_chunk_gated_delta_rule = modeling_qwen3_5.torch_chunk_gated_delta_rule.__wrapped__


def chunk_gated_delta_rule(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
    use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs,
):  # fmt: skip
    """fla's chunk_gated_delta_rule: q, k [B, T, H, K], v [B, T, HV, V], g and beta [B, T, HV];
    each row one sequence, or with cu_seqlens (ONE row) each segment its own, from a zero state.
    `scale` is fla's default, 1 / sqrt(K), as transformers' torch code applies it."""
    run = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    if cu_seqlens is None:
        return torch_chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=initial_state,
            output_final_state=output_final_state, **run,
        )  # fmt: skip
    if q.shape[0] != 1:
        raise ValueError(
            f"The batch size is expected to be 1 rather than {q.shape[0]} when using `cu_seqlens`."
        )
    bounds = cu_seqlens.tolist()
    out = [
        torch_chunk_gated_delta_rule(*(t[:, a:b] for t in (q, k, v, g, beta)), **run)[0]
        for a, b in zip(bounds, bounds[1:])
    ]
    return torch.cat(out, dim=1), None


def causal_conv1d_fn(
    x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
    final_states_out=None, activation=None,
):  # fmt: skip
    """causal-conv1d's causal_conv1d_fn: x [B, D, T], weight [D, W]; output t sums tap j on
    input t - j, of its own segment only when seq_idx [B, T] numbers them."""
    width, length = weight.shape[-1], x.shape[-1]
    out = torch.zeros_like(x) if bias is None else bias[None, :, None].expand_as(x)
    for j in range(width):
        back = F.pad(x, (j, 0))[..., :length]
        if seq_idx is not None:  # only inputs of the same segment
            back = back * (F.pad(seq_idx, (j, 0), value=-1)[:, :length] == seq_idx)[:, None]
        out = out + weight[:, width - 1 - j, None] * back
    return F.silu(out) if activation in ("silu", "swish") else out


def package(name: str, **functions) -> types.ModuleType:
    """A module `name` holding `functions`: a stand-in for an installed package."""
    module = types.ModuleType(name)
    vars(module).update(functions)
    return module


FLA = package("fla", chunk_gated_delta_rule=chunk_gated_delta_rule)
CAUSAL_CONV1D = package("causal_conv1d", causal_conv1d_fn=causal_conv1d_fn)
# each decorated kernel of Qwen3.5's modules: transformers' name for it and the package it tries
KERNELS = {
    "torch_chunk_gated_delta_rule": ("chunk_gated_delta_rule", "fla"),
    "causal_conv1d_fn": ("causal_conv1d_fn", "causal_conv1d"),
}


@contextmanager
def linear_attention_kernels(fla=FLA, causal_conv1d=CAUSAL_CONV1D):
    """Inside the block, transformers resolves Qwen3.5's (and Qwen3.5-MoE's) kernels from these
    packages, as if installed (None: not installed), its guard and signature filter included."""
    packages = {"fla": fla, "causal_conv1d": causal_conv1d}
    saved = {name: sys.modules.pop(name, None) for name in packages}
    sys.modules.update({name: p for name, p in packages.items() if p is not None})
    kernels = {}
    try:
        for module in (modeling_qwen3_5, modeling_qwen3_5_moe):
            for name, (function, package) in KERNELS.items():
                kernels[module, name] = getattr(module, name)
                torch_code = kernels[module, name].__wrapped__
                resolve = use_kernel_func_from_hub_with_fallback(function, package)
                setattr(module, name, resolve(torch_code))
        yield
    finally:
        for (module, name), kernel in kernels.items():
            setattr(module, name, kernel)
        for name in packages:
            sys.modules.pop(name, None)
            if saved[name] is not None:
                sys.modules[name] = saved[name]
