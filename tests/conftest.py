import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# Tests never touch the user's cache or the committed figures: generated datasets go to a
# temporary cache shared by this test session (and by the scripts it starts).
os.environ["MMDP_CACHE"] = tempfile.mkdtemp(prefix="mmdp-test-cache-")


@pytest.fixture(scope="session")
def tokenizer():
    from mmdp.tokenizer import get_tokenizer

    return get_tokenizer()


@pytest.fixture(scope="session")
def run_script():
    return _run_script


def _run_script(
    name: str, *args: str, env: dict | None = None, timeout: int = 300, python_args: bool = False
):
    """Run a stage script as a user would; returns the CompletedProcess (never raises).

    With python_args=True, `name` and `args` are passed to python as they are (e.g. "-m", ...).
    """
    command = (
        [sys.executable, name, *args] if python_args else [sys.executable, str(REPO / name), *args]
    )
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2")


def tiny_llama(vocab_size: int, attn_implementation: str = "sdpa"):
    """A small randomly initialised LlamaForCausalLM, float32, in eval mode.

    Large initial weights (initializer_range=0.5) make attention matter, so a sample that sees
    another one shows in the loss. flash_attention_2 only runs inside
    mmdp.attention.flash_attention_on_cpu() (transformers' routing, reference kernels).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    from mmdp.attention import use_attention

    model_config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(model_config).eval()
    return use_attention(model, attn_implementation)


@pytest.fixture
def attention(request):
    """Run a test under one attention implementation (the test's `implementation` parameter):
    FlashAttention through transformers' routing with reference kernels, flex_attention compiled
    for static shapes (torch 2.15's CPU code for dynamic shapes does not compile)."""
    import torch._dynamo

    from mmdp.attention import flash_attention_on_cpu

    implementation = request.param
    if implementation.startswith("flash"):
        with flash_attention_on_cpu(implementation):
            yield implementation
        return
    saved = torch._dynamo.config.automatic_dynamic_shapes
    torch._dynamo.config.automatic_dynamic_shapes = False
    try:
        yield implementation
    finally:
        torch._dynamo.config.automatic_dynamic_shapes = saved
