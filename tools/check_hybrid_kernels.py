"""Qwen3.5 packed == alone with the real linear-attention kernels, on a GPU: the check
tests/test_qwen3_5.py runs on a CPU with stand-ins, here with flash-linear-attention's.

    PYTHONPATH=src python3 tools/check_hybrid_kernels.py             # float32; --dtype bfloat16

Needs CUDA and fla-core 0.6.0 (its `fla.ops.gated_delta_rule.chunk_gated_delta_rule` takes the
bounds as cu_seqlens). causal-conv1d ships only as source (a CUDA build), so `causal_conv1d_fn`
is served here by fla's own Triton conv (`fla.modules.causal_conv1d.causal_conv1d`, which takes
the bounds as cu_seqlens) through the adapter below, installed as the package `causal_conv1d`
before transformers imports Qwen3.5's module (integrations/hub_kernels.py resolves kernels
then). A tiny random Qwen3.5 (mmdp.models.tiny) runs 2 packs of 3 samples (mmdp's batch, through
model_inputs: one row, cu_seq_lens and seq_idx) and each sample alone; the table gives each
sample's largest logit difference, relative to its largest logit, with both bounds and without
each (the controls: they must differ). Without CUDA or fla it says so and exits 0.
"""

import argparse
import io
import sys
import types

import torch
from torch.nn import functional as F


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, activation=None):
    """causal-conv1d's causal_conv1d_fn (x [B, D, T], weight [D, W], seq_idx [1, T]) on fla's
    Triton conv ([B, T, D]), each segment of seq_idx a sequence of its own (cu_seqlens)."""
    from fla.modules.causal_conv1d import causal_conv1d

    bounds = None
    if seq_idx is not None:
        starts = torch.nonzero(seq_idx[0, 1:] != seq_idx[0, :-1])[:, 0] + 1
        bounds = F.pad(starts, (1, 1), value=0)
        bounds[-1] = seq_idx.shape[-1]
    out, _ = causal_conv1d(
        x.transpose(1, 2), weight, bias, activation=activation, cu_seqlens=bounds
    )
    return out.transpose(1, 2)


def rows() -> list[dict]:
    """Six samples: images of several sizes, a text-only one, two images in one."""
    from PIL import Image

    def image(width, height, colour):
        png = io.BytesIO()
        Image.new("RGB", (width, height), colour).save(png, format="PNG")
        return {"bytes": png.getvalue(), "path": None}

    def texts(*turns):
        return [{"user": u, "assistant": a, "source": "check"} for u, a in turns]

    red, green = (200, 30, 30), (10, 200, 10)
    return [
        {"images": [image(64, 48, red)], "texts": texts(("What is this?", "A red box."))},
        {"images": [], "texts": texts(("Spell cat.", "C-A-T."), ("And dog?", "D-O-G."))},
        {"images": [image(32, 96, red), image(90, 30, green)], "texts": texts(("Both?", "Red."))},
        {"images": [image(120, 40, green)], "texts": texts(("Colour?", "Green."))},
        {"images": [], "texts": texts(("2 + 2?", "4."))},
        {"images": [image(56, 56, red)], "texts": texts(("Colour?", "Red, I think."))},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--moe", action="store_true", help="Qwen3.5-MoE's class")
    args = parser.parse_args()
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except ImportError as error:
        print(f"flash-linear-attention is not installed ({error}): nothing checked")
        return
    if not torch.cuda.is_available():
        print("no CUDA device: nothing checked (fla's kernels are Triton's, for a GPU)")
        return
    package = types.ModuleType("causal_conv1d")
    package.causal_conv1d_fn = causal_conv1d_fn
    sys.modules["causal_conv1d"] = package  # before transformers imports modeling_qwen3_5
    from mmdp.batch import build_pack, collate_packs, sample_ids
    from mmdp.data.families import family_for, tiny_processor
    from mmdp.models.inputs import model_inputs
    from mmdp.models.tiny import tiny_model

    family = family_for(tiny_processor("qwen3_5"))
    dtype = getattr(torch, args.dtype)
    model = tiny_model(family.processor, moe=args.moe).to("cuda", dtype)
    samples = [family.make_sample(row, i) for i, row in enumerate(rows())]
    packs = [
        build_pack(s, [len(x["input_ids"]) for x in s], max_length=320,
                   pad_token_id=family.pad_token_id, batch_index=0)
        for s in (samples[:3], samples[3:])
    ]  # fmt: skip
    batch = collate_packs(packs, family)
    cuda = lambda d: {k: v.to("cuda") if torch.is_tensor(v) else v for k, v in d.items()}  # noqa: E731
    inputs = cuda(model_inputs(batch, model))
    with torch.no_grad():
        alone = []
        for s in samples:
            one = {key: s[key][None] for key in ("input_ids", "mm_token_type_ids")}
            if s["image_count"]:
                one.update(family.collate_vision([s]))
            alone.append(model(**cuda(one), use_cache=False).logits[0].float())
        owner = sample_ids(batch).to("cuda")  # the samples' ids, in order; -1 on padding
        ids = [i for i in owner.unique().tolist() if i >= 0]
        columns = {"both bounds": inputs}
        columns["no seq_idx"] = {k: v for k, v in inputs.items() if k != "seq_idx"}
        columns["no cu_seqlens"] = {k: v for k, v in inputs.items() if not k.startswith("cu_seq")}
        errors = {}
        for name, given in columns.items():
            logits = model(**given).logits.float().view(*batch["input_ids"].shape, -1)
            errors[name] = [
                float((logits[owner == i] - a).abs().max() / a.abs().max())
                for i, a in zip(ids, alone)
            ]
    print(f"Qwen3.5{'-MoE' if args.moe else ''}, {args.dtype}, {torch.cuda.get_device_name()}: "
          "largest logit difference, packed vs alone, relative to the sample's largest logit\n")  # fmt: skip
    print("| sample | tokens | " + " | ".join(columns) + " |")
    print("| --- | --- |" + " --- |" * len(columns))
    for i, s in enumerate(samples):
        cells = " | ".join(f"{errors[name][i]:.1e}" for name in columns)
        print(f"| {i} | {len(s['input_ids'])} | {cells} |")


if __name__ == "__main__":
    main()
