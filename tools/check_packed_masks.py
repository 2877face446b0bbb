"""Does this transformers keep packed samples apart under eager and sdpa attention?

    python tools/check_packed_masks.py        # with any torch + transformers installed

Three sequences packed into one row with restarting position_ids, through a small random Llama:
the logits must equal those of each sequence run alone. This is how mmdp's transformers floor
(mmdp.models.attention.MIN_TRANSFORMERS) was found, in throwaway virtual environments with
`pip install torch==2.13.0 transformers==<version>`: 4.53.0 mixes the samples (max difference
1.9e+01), 4.53.1 keeps them apart (8e-06 eager, 1e-05 sdpa). Exits with status 1 when the samples mix.
It needs only torch and transformers, so that it runs on old versions mmdp itself does not.
"""

import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM


def max_difference(attn_implementation: str) -> float:
    torch.manual_seed(0)
    model_config = LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.5,
    )
    model_config._attn_implementation = attn_implementation
    model = LlamaForCausalLM(model_config).eval()
    sequences = [torch.randint(0, 100, (n,)) for n in (5, 7, 4)]
    input_ids = torch.cat(sequences)[None]
    position_ids = torch.cat([torch.arange(len(s)) for s in sequences])[None]
    with torch.no_grad():
        packed = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits[0]
        alone = torch.cat([model(input_ids=s[None], use_cache=False).logits[0] for s in sequences])
    return float((packed - alone).abs().max())


if __name__ == "__main__":
    mixed = False
    for implementation in ("eager", "sdpa"):
        difference = max_difference(implementation)
        verdict = "samples kept apart" if difference < 1e-3 else "SAMPLES MIX"
        mixed |= difference >= 1e-3
        print(
            f"transformers {transformers.__version__}, {implementation}: {difference:.1e} ({verdict})"
        )
    sys.exit(1 if mixed else 0)
