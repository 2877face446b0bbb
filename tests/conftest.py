import gc
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# PyTorch's CPU allocator backs each tensor of 2 MB or more with transparent huge pages when
# THP_MEM_ALLOC_ENABLE=1 (c10/core/alloc_cpu.cpp reads it once, at the first allocation: so here,
# before torch is imported; this process's children inherit it). The tiny models' logits over a
# 49k-token vocabulary are fresh 100 MB tensors at every step, and with 4 KB pages the kernel spent
# two fifths of the trainers' launch's CPU time faulting them in: 245 -> 188 s (docs/benchmarks.md).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
# torch is imported where it is used, not here: pytest-xdist's controller process, which loads this
# file too, runs no test, and importing torch there cost every run about 3 s before its workers
# started and 1.5 s more at its exit (git log -S "The ninth round" -- docs/benchmarks.md).

REPO = Path(__file__).resolve().parents[1]

# Tests never touch the user's cache or the committed figures, and leave nothing behind: all they
# create goes into one folder, removed when the run ends. Generated datasets (MMDP_CACHE, shared by
# the scripts the tests start), pytest's tmp_path, torch's compile cache, and whatever this process
# and its children (scripts, torchrun) write to the temp folder.
# Under pytest-xdist, each worker's folder is inside the controller's, and the workers share the
# run's cache (generated datasets and weighings: each made once, written whole or not at all,
# mmdp.data.reading.sources.save_once and mmdp.weighing.weigh, so two workers never see half
# of one) and torch's compile cache (flex_attention's kernels compiled once for both). Paths stay
# short: DataLoader workers hand tensors over through a Unix socket in the temp folder, and one
# nested folder deeper its path was over the 108 bytes Linux allows (mmdp.loading.workers.
# check_temp_folder).
if "PYTEST_XDIST_WORKER" in os.environ:
    RUN_DIR = Path(os.environ["MMDP_TESTS_DIR"]) / os.environ["PYTEST_XDIST_WORKER"]
    RUN_DIR.mkdir(exist_ok=True)
else:
    RUN_DIR = Path(tempfile.mkdtemp(prefix="mmdp-tests-"))
    os.environ["MMDP_TESTS_DIR"] = str(RUN_DIR)
    os.environ["MMDP_CACHE"] = str(RUN_DIR / "cache")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(RUN_DIR / "torchinductor")
os.environ["TMPDIR"] = str(RUN_DIR / "tmp")
(RUN_DIR / "tmp").mkdir(exist_ok=True)
tempfile.tempdir = None  # this process, too, reads TMPDIR again


# A full garbage collection walks every object of the process: Python's own, every so often,
# and Trainer.train()'s at its start (transformers trainer.py:1593, accelerator.free_memory ->
# gc.collect()), 0.3-0.5 s each in a process holding torch, transformers and the collected tests.
# Those objects live to the end anyway: frozen, no collection walks them. The default suite:
# 192 -> 169 s, 310 -> 270 s of CPU (docs/benchmarks.md, "Test suite durations").
def pytest_collection_finish(session):
    gc.freeze()


def pytest_unconfigure(config):
    shutil.rmtree(RUN_DIR, ignore_errors=True)


# The default suite runs in 2 pytest-xdist workers (pyproject's addopts: 1 on a 1-core machine),
# a file's tests on the same worker (its module fixtures built once): 187 s against 250 s in one
# process (docs/benchmarks.md). The slow group (`-m slow`) runs in 2 workers too, scheduled below.
# Any other selection (`-m faults`...) runs in this one process, unless the command asks for
# workers (-n).
@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    asked = any(arg.startswith(("-n", "--numprocesses")) for arg in config.invocation_params.args)
    if config.option.markexpr not in ("not slow", "slow") and not asked:
        config.option.numprocesses = 0
    if config.option.markexpr == "slow":
        config.option.loadscopereorder = False  # the collection's order (below)


# The slow group alone keeps one of 2 cores idle a third of the time: flex_attention's g++
# compiles and most tests in this process run on one core, the ranks' jobs wait on each other.
# In 2 workers, in this order: the trainers' launch first (its three files share the session
# fixture trainers_under_torchrun: one worker, one launch), then the files whose tests run here,
# then those that start ranks, longest first, a file at a time per worker, whichever is free. Every
# process on one thread (torch's intra-op threads; 2 threads fighting another job on 2 cores made
# steps up to 9x slower). (xdist's own per-group scheduling, --dist loadgroup, cannot keep the
# launch's files together: with pytest 9.2 its xdist_group suffix never reaches the node ids.)
LAUNCH = ("test_ddp.py", "test_trainers.py", "test_trainer_matrix.py")  # trainers_under_torchrun
# Longest first (2026-11-27, in 2 workers: 222, 79, 76, 28, 21 s; test_seed_run.py, issue 45's
# four launches, several minutes), so that the last file one worker takes is a short one: in
# alphabetical order test_weighing.py came last, and one worker ran it alone for 27 s at the end.
STARTS_RANKS = (  # under torchrun, or as plain processes; tools/figures.py --check: every figure
    "test_figures.py", "test_seed_run.py", "test_faults.py", "test_stage_scripts.py",
    "test_weighing.py", "test_prepared.py", "test_streaming.py", "test_bench_and_examples.py",
)  # fmt: skip
# Files whose slow tests share nothing (each runs a script in a fresh process): each test goes to
# whichever worker is free, not the whole file to one, so that they fill the group's end.
ONE_TEST_AT_A_TIME = ("test_bench_and_examples.py",)


def slow_group_place(nodeid: str) -> tuple[int, int]:
    """(0, 0) for the trainers' launch, (1, 0) for the tests that run in this process, (2, i)
    for the i-th file of STARTS_RANKS."""
    file = nodeid.split("::")[0].rsplit("/", 1)[-1]
    if file in LAUNCH:
        return 0, 0
    return (2, STARTS_RANKS.index(file)) if file in STARTS_RANKS else (1, 0)


def pytest_collection_modifyitems(config, items):
    if config.option.markexpr == "slow":
        items.sort(key=lambda item: slow_group_place(item.nodeid))  # stable: files keep order


def pytest_xdist_make_scheduler(config, log):
    if config.option.markexpr != "slow":
        return None  # pyproject's --dist loadfile
    from xdist.scheduler import LoadFileScheduling

    class SlowGroupScheduling(LoadFileScheduling):
        """A file's tests on one worker, and the trainers' launch's three files together;
        each test of ONE_TEST_AT_A_TIME on its own."""

        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::")[0]
            if slow_group_place(nodeid)[0] == 0:
                return "the trainers' launch"
            return nodeid if file.rsplit("/", 1)[-1] in ONE_TEST_AT_A_TIME else file

    return SlowGroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.option.basetemp = str(RUN_DIR / "pytest")
    if config.option.markexpr == "slow" and "PYTEST_XDIST_WORKER" in os.environ:
        import torch

        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"  # the scripts and ranks this worker starts


def image_cell(image) -> dict:
    """A PIL image as a row of the_cauldron's schema stores it: {"bytes": PNG, "path": None}."""
    from mmdp.data.synthetic.rows import encode_png

    return {"bytes": encode_png(image), "path": None}


def config_and_rest(settings: dict) -> tuple:
    """A test's loader keywords split into a PackingConfig of its fields and the rest (rank=...,
    image_size=...): the loaders take their budgets as a PackingConfig only."""
    import dataclasses

    from mmdp.packing.packing_config import PackingConfig

    fields = {field.name for field in dataclasses.fields(PackingConfig)}
    config = PackingConfig(**{key: settings[key] for key in fields if key in settings})
    return config, {key: value for key, value in settings.items() if key not in fields}


@pytest.fixture
def one_thread():
    """One intra-op thread for tests of tiny real models (tests/test_lora.py,
    tests/test_trainer_matrix.py): on a busy 2-core machine, 2 threads make their steps 9x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer():
    from mmdp.data.tokenizer import get_tokenizer

    return get_tokenizer()


@pytest.fixture(scope="session")
def trainers_under_torchrun(tmp_path_factory) -> Path:
    """tests/torchrun_trainers.py under torchrun, 2 processes: test_trainers.py's checks,
    test_ddp.py's DDP step and test_trainer_matrix.py's matrix in one launch (the slow group).
    Its folder."""
    out = tmp_path_factory.mktemp("trainers")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(REPO / "tests" / "torchrun_trainers.py"), str(out),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


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

# flex_attention compiles its kernels for each shape of the batch (inductor and g++: 15-40 s of
# CPU each on 2 cores) and reuses them, in this process and from the run's compile cache, for any
# batch of the same shape and attention geometry. The tiny language models of the families and of
# TinyVLM, and test_attention's Llama, share one geometry (4 heads of 16, 2 key-value heads), so
# every packed batch of several rows their flex tests run is [2, PACKED_LENGTH]: one kernel for
# Qwen2.5-VL, Qwen3-VL, SmolVLM, LLaVA-OneVision, TinyVLM, the video batches and the text packs
# (Gemma 3's masks are its own). Before, each had its own length: the slow tests of
# test_attention, test_families and test_video took 314 s of CPU, then 221 s; with the text packs
# too, test_attention's alone 91-100 -> 71-73 s (docs/benchmarks.md, "Test suite durations"; each
# round: git log -S "The tenth round" -- docs/benchmarks.md). The kernel takes each batch's masks
# as inputs: a family's flex test on another family's kernel still fails if its own samples see
# each other (test_attention's test_flex_attention_keeps_the_samples_its_positions_say shows it on
# the shared kernel).
PACKED_LENGTH = 320


def two_packs_of_three(family, samples: list[dict]) -> dict:
    """Six samples in two packs of three, each padded to PACKED_LENGTH tokens (a padding tail in
    both), collated by the family."""
    from mmdp.batch import build_pack, collate_packs

    packs = []
    for three in (samples[:3], samples[3:]):
        lengths = [len(s["input_ids"]) for s in three]
        assert sum(lengths) < PACKED_LENGTH, f"{sum(lengths)} tokens in a pack: raise PACKED_LENGTH"
        packs.append(
            build_pack(
                three,
                lengths,
                max_length=PACKED_LENGTH,
                pad_token_id=family.pad_token_id,
                batch_index=0,
            )
        )
    return collate_packs(packs, family)


def tiny_llama(vocab_size: int, attn_implementation: str = "sdpa"):
    """A small randomly initialised LlamaForCausalLM, float32, in eval mode.

    Large initial weights (initializer_range=0.5) make attention matter, so a sample that sees
    another one shows in the loss. flash_attention_2 only runs inside
    mmdp.models.attention.flash_attention_on_cpu() (transformers' routing, reference kernels).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mmdp.models.attention import use_attention

    model_config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(model_config).eval()
    return use_attention(model, attn_implementation)


def tiny_vlm_losses(batch, sample_of_row, tokenizer, attention: str) -> tuple[float, float]:
    """(packed, one at a time): the summed loss of a packed batch on a TinyVLM with 32-pixel
    images and large weights, under `attention`, and of its samples run alone (eager)."""
    import torch

    from mmdp.models.attention import use_attention
    from mmdp.models.tiny_vlm import TinyVLM, TinyVLMConfig, vlm_inputs
    from mmdp.training.loss import summed_loss

    torch.manual_seed(0)
    vlm_config = TinyVLMConfig(
        len(tokenizer),
        tokenizer.image_token_id,
        image_size=32,
        vit_patch_size=4,
        initializer_range=0.5,
        attn_implementation="eager",
    )
    model = TinyVLM(vlm_config).eval()
    with torch.no_grad():
        alone = 0.0
        for row in batch["sample_index"].tolist():
            s = sample_of_row(row)
            logits = model(input_ids=s["input_ids"][None], pixel_values=s["pixel_values"]).logits
            alone += float(summed_loss(logits, s["labels"][None]))
        use_attention(model.lm, attention)  # the packed language model; images are not packed
        packed = float(summed_loss(model(**vlm_inputs(batch)).logits, batch["labels"]))
    return packed, alone


@pytest.fixture
def attention(request):
    """Run a test under one attention implementation (the test's `implementation` parameter):
    FlashAttention through transformers' routing with reference kernels, flex_attention compiled
    for static shapes (torch 2.15's CPU code for dynamic shapes does not compile)."""
    import torch._dynamo

    from mmdp.models.attention import flash_attention_on_cpu

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


@pytest.fixture
def run_main(capsys, monkeypatch):
    """Run a stage script in this process, as `python NAME ARGS...` would from the repository
    root (no new process: no second import of torch and transformers, about 10 s of CPU each):
    returns (exit status, stdout, stderr)."""
    import runpy

    def run(name: str, *args: str) -> tuple[int, str, str]:
        monkeypatch.chdir(REPO)
        monkeypatch.setattr(sys, "argv", [name, *args])
        try:
            runpy.run_path(str(REPO / name), run_name="__main__")
            status = 0
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else 1
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    return run
