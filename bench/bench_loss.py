"""The loss over the trained positions against the full logits: forward and backward time and
peak memory of a VLM's output layer and its loss, on a Qwen-sized vocabulary (151,936, Qwen3-VL's)
and one pack of 2k-16k tokens, in float32 and in bfloat16 (issue 47).

    uv run bench/bench_loss.py                                  # CPU: 3-4 min of CPU time
    PYTHONPATH=src python3 bench/bench_loss.py --device cuda    # a GPU: torch + transformers only

Each case starts from the final hidden states of one pack [1, L, H] and ends with the gradient of
the hidden states and of the output layer's weight [V, H]:

    full logits        summed_loss(lm_head(hidden), labels): the [1, L, V] logits of every
                       position, their cross entropy in float32, backward (the trainers before)
    trained positions  head_loss(lm_head, hidden, labels): the output layer on the positions
                       whose next label is trained only, a chunk at a time, its gradient computed
                       in the same pass (mmdp.training.loss, what the trainers compute now)

The pack holds samples of 200-600 tokens, each a prompt (labels ignored) then a reply: --trained
of the positions are trained (0.42: stage 5's first batch). fp32: weights, hidden states and
logits in float32; bf16: under torch.autocast(bfloat16), weights in float32 (Trainer's
bf16=True). The last column: the largest relative difference between the two paths' loss and
gradient norms.

Defaults. A GPU: hidden size 3,584 (Qwen2.5-VL-7B's), packs of 2,048 to 16,384 tokens in both
dtypes, the median of 5 runs after one more (synchronized). A CPU: hidden size 64 (TinyVLM's)
and float32 packs of 2,048 and 4,096 tokens (8,192 would hold some 14 GB for the full logits);
bfloat16 on a pack of 128 tokens only, because a CPU without a bfloat16 unit (this machine: AVX2)
runs torch's reference bfloat16 products, 50-100x slower than float32 (a [64, 151,936] x
[151,936, 128] product: 35 s against 0.3 s): a bfloat16 pack of 2,048 tokens would take some
20 minutes. On a CPU every run is timed (2 by default).

Peak memory: the most the case holds above its inputs (weights, hidden states, labels), the
weight's gradient (V x H, float32) included, which both paths hold: in a short pack it outweighs
the logits. CUDA: torch.cuda.max_memory_allocated. CPU: every case runs in a process of its own,
which reports its resident-set high-water mark (ru_maxrss) above its resident set before the
first run; torch's CPU tensors are plain malloc'ed memory (no caching allocator), and glibc
returns blocks this large (mmap) to the system when freed, so the high-water mark is the most the
case held at once.

The last line: per dtype, the median over its pack lengths of the time ratio; the median over
every case of the memory ratio (the table gives each case's).

Runs with no GPU and without mmdp's data side: on a machine with torch and transformers alone
(datasets, PIL absent) it loads mmdp.training.loss by itself (import_loss).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch
from torch import nn

SRC = Path(__file__).resolve().parents[1] / "src"
VOCAB = 151_936  # Qwen3-VL's (Qwen2.5-VL's: 152,064)
MODES = ("full logits", "trained positions")
DTYPES = ("fp32", "bf16")


def import_loss():
    """mmdp.training.loss. On a machine without mmdp's dependencies (a lent GPU with torch and
    transformers only), import it without mmdp's package __init__ (which imports the data side:
    datasets, PIL): its packages as bare namespaces, and the batch contract it uses elsewhere
    (real_token_mask, sample_ids) left out."""
    try:
        from mmdp.training import loss

        return loss
    except ImportError as error:
        missing = error.name
    for name in [name for name in sys.modules if name.split(".")[0] == "mmdp"]:
        del sys.modules[name]
    for name in ("mmdp", "mmdp.training", "mmdp.packing"):
        package = types.ModuleType(name)
        package.__path__ = [str(SRC.joinpath(*name.split(".")))]
        sys.modules[name] = package
    batch = types.ModuleType("mmdp.batch")
    batch.real_token_mask = batch.sample_ids = None
    sys.modules["mmdp.batch"] = batch
    from mmdp.training import loss

    print(f"(mmdp's package needs {missing}, absent here: mmdp.training.loss loaded alone)")
    return loss


def pack_labels(length: int, trained: float, vocab: int, seed: int) -> torch.Tensor:
    """[1, length] labels of samples of 200-600 tokens (a pack shorter than 1,200: a quarter to
    a half of it), each a prompt (ignored) then a reply (`trained` of its tokens)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, vocab, (1, length), generator=generator)
    low, high = min(200, length // 4), min(600, length // 2)
    start = 0
    while start < length:
        size = int(torch.randint(low, high + 1, (1,), generator=generator))
        labels[0, start : start + round(size * (1 - trained))] = -100
        start += size
    return labels


def make_case(mode: str, dtype: str, length: int, args, loss):
    """The case's inputs (the output layer, the hidden states, the labels), and its step: the
    loss, forward and backward."""
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    head = nn.Linear(args.hidden, VOCAB, bias=False, device=device)
    nn.init.normal_(head.weight, std=0.02)
    hidden = torch.randn(1, length, args.hidden, device=device).requires_grad_()
    labels = pack_labels(length, args.trained, VOCAB, args.seed).to(device)

    def step():
        hidden.grad, head.weight.grad = None, None
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            if mode == "full logits":
                summed = loss.summed_loss(head(hidden), labels)
            else:
                chunk = args.logits_per_chunk or loss.LOGITS_PER_CHUNK
                summed, _ = loss.head_loss(head, hidden, labels, logits_per_chunk=chunk)
        summed.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        # what the two paths must agree on: the loss and the gradients' sizes
        return [float(summed.detach()), float(hidden.grad.norm()), float(head.weight.grad.norm())]

    return step


def timed(step, result: dict) -> float:
    start = time.perf_counter()
    result["values"] = step()
    return time.perf_counter() - start


def run_case(mode: str, dtype: str, length: int, args, loss) -> dict:
    """CUDA: the first run for the peak memory above the inputs, the others for the time."""
    step, result = make_case(mode, dtype, length, args, loss), {}
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    seconds = [timed(step, result) for _ in range(args.repeats + 1)]
    peak = torch.cuda.max_memory_allocated() - base
    return {**result, "seconds": seconds[1:], "peak_bytes": peak}


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def case_in_own_process(mode: str, dtype: str, length: int, argv: list[str]) -> dict:
    """CPU: the case in a process of its own (see the module's docstring), its result as JSON."""
    command = [sys.executable, __file__, *argv, "--case", mode, dtype, str(length)]
    path = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path}
    )
    if done.returncode != 0:
        raise RuntimeError(f"{mode}, {dtype}, {length}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def child(args, loss) -> None:
    """--case, in its own process: every run timed, the first also for the peak (ru_maxrss above
    the resident set before it: the inputs made, and every code path run once on a short pack);
    printed as one JSON line."""
    mode, dtype, length = args.case[0], args.case[1], int(args.case[2])
    make_case(mode, dtype, 16, args, loss)()  # one-time costs: thread pools, first calls
    step, result = make_case(mode, dtype, length, args, loss), {}
    base = resident_bytes()
    seconds = [timed(step, result)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    seconds += [timed(step, result) for _ in range(args.repeats - 1)]
    print(json.dumps({**result, "seconds": seconds, "peak_bytes": peak}))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=None,
        help="pack lengths in float32 (default: 2048 4096 on a CPU, 2048 4096 8192 16384 on a GPU)",
    )
    parser.add_argument(
        "--bf16-lengths",
        type=int,
        nargs="*",
        default=None,
        help="pack lengths in bfloat16 (default: 128 on a CPU without a bfloat16 unit, where "
        "bfloat16 products run 50-100x slower than float32; --lengths on a GPU)",
    )
    parser.add_argument(
        "--hidden",
        type=int,
        default=None,
        help="hidden size (default: 64, TinyVLM's, on a CPU; 3584, Qwen2.5-VL-7B's, on a GPU)",
    )
    parser.add_argument("--trained", type=float, default=0.42, help="share of trained positions")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed runs per case (default: 2 on a CPU, 5 on a GPU)",
    )
    parser.add_argument(
        "--logits-per-chunk", type=int, default=None, help="default: mmdp.training.loss's"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    on_gpu = args.device.startswith("cuda")
    if args.lengths is None:
        args.lengths = [2048, 4096, 8192, 16384] if on_gpu else [2048, 4096]
    if args.bf16_lengths is None:
        args.bf16_lengths = args.lengths if on_gpu else [128]
    if args.hidden is None:
        args.hidden = 3584 if on_gpu else 64
    if args.repeats is None:
        args.repeats = 5 if on_gpu else 2
    return args


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    loss = import_loss()
    if args.case:
        child(args, loss)
        return
    device = torch.device(args.device)
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU, {os.cpu_count()} cores"
    )
    print(
        f"{name}; torch {torch.__version__}; vocabulary {VOCAB:,}, hidden size {args.hidden}, "
        f"{args.trained:.0%} of the positions trained; median of {args.repeats} runs; "
        f"{(args.logits_per_chunk or loss.LOGITS_PER_CHUNK):,} logits a chunk\n"
    )
    print(
        "| pack | trained | dtype | full logits: s | GB | trained positions: s | GB | time "
        "| memory | same loss and gradients |"
    )
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ratios = {dtype: {"time": [], "memory": []} for dtype in DTYPES}
    cases = [(length, "fp32") for length in args.lengths]
    cases += [(length, "bf16") for length in args.bf16_lengths]
    for length, dtype in sorted(cases):
        results = {}
        for mode in MODES:
            if device.type == "cuda":
                results[mode] = run_case(mode, dtype, length, args, loss)
                torch.cuda.empty_cache()
            else:
                results[mode] = case_in_own_process(mode, dtype, length, argv)
        full, ours = (results[mode] for mode in MODES)
        time_ratio = statistics.median(ours["seconds"]) / statistics.median(full["seconds"])
        memory_ratio = ours["peak_bytes"] / full["peak_bytes"]
        ratios[dtype]["time"].append(time_ratio)
        ratios[dtype]["memory"].append(memory_ratio)
        # the largest relative difference of the loss and the gradients' norms
        same = max(abs(a - b) / abs(b) for a, b in zip(ours["values"], full["values"]))
        trained = loss.label_tokens(pack_labels(length, args.trained, VOCAB, args.seed))
        print(
            f"| {length:,} | {trained:,} | {dtype} | {statistics.median(full['seconds']):.3f} | "
            f"{full['peak_bytes'] / 2**30:.2f} | {statistics.median(ours['seconds']):.3f} | "
            f"{ours['peak_bytes'] / 2**30:.2f} | {time_ratio:.2f}x | {memory_ratio:.2f}x | "
            f"{same:.1e} |",
            flush=True,
        )
    memory = statistics.median(m for r in ratios.values() for m in r["memory"])
    times = {
        dtype: f"{statistics.median(r['time']):.2f}x" if r["time"] else "not run"
        for dtype, r in ratios.items()
    }
    print(
        f"\nloss over trained positions: fp32 {times['fp32']}, bf16 {times['bf16']} time; "
        f"memory {memory:.2f}x of full logits"
    )


if __name__ == "__main__":
    main()
