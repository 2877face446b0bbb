"""Transparent huge pages for PyTorch's CPU tensors (THP_MEM_ALLOC_ENABLE=1), off against on.

    uv run bench/bench_huge_pages.py              # 3 pairs, each run a fresh process
    uv run bench/bench_huge_pages.py --pairs 5 --steps 40

The step is the one that makes the test suite's training slow on CPU: a tiny model's output
layer (64 -> 49,152: SmolLM2's vocabulary) and its cross-entropy, forward and backward, on 512
tokens, in one thread. Its logits and their gradients are fresh 100 MB tensors at every step.
With 4 KB pages the kernel faults each of them in page by page; with THP_MEM_ALLOC_ENABLE=1,
PyTorch's allocator asks for 2 MB pages (madvise) for every tensor of 2 MB or more. The variable
is read once, at the first allocation: tests/conftest.py sets it before importing torch.

Prints, per setting, the median wall time of a run's steps, its user and system CPU time and its
minor page faults; the runs alternate (off, on, off, on, ...).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def steps(count: int) -> dict:
    """`count` steps of the output layer and its loss, after one to warm up."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 49152, bias=False)
    hidden = torch.randn(512, 64, requires_grad=True)
    targets = torch.randint(0, 49152, (512,))

    def step():
        torch.nn.functional.cross_entropy(head(hidden), targets).backward()

    step()
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(count):
        step()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "wall": time.perf_counter() - start,
        "user": after.ru_utime - before.ru_utime,
        "sys": after.ru_stime - before.ru_stime,
        "faults": after.ru_minflt - before.ru_minflt,
    }


def run(huge_pages: bool, count: int) -> dict:
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "1" if huge_pages else "0"}
    command = [sys.executable, __file__, "--one-run", str(count)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="off/on pairs of runs (3)")
    parser.add_argument("--steps", type=int, default=20, help="steps a run (20)")
    parser.add_argument("--one-run", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_run is not None:
        print(json.dumps(steps(args.one_run)))
        return
    if os.path.exists(THP):
        with open(THP) as f:
            print(f"{THP}: {f.read().strip()}")
    results = {False: [], True: []}
    for _ in range(args.pairs):
        for huge_pages in (False, True):
            results[huge_pages].append(run(huge_pages, args.steps))
    print(f"{args.steps} steps a run, medians of {args.pairs} runs each (seconds, page faults):")
    for huge_pages, runs in results.items():
        median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(
            f"  THP_MEM_ALLOC_ENABLE={int(huge_pages)}: wall {median['wall']:.2f}  user "
            f"{median['user']:.2f}  sys {median['sys']:.2f}  faults {median['faults']:,.0f}"
        )
    off, on = (statistics.median(r["wall"] for r in results[k]) for k in (False, True))
    print(f"  on / off: {on / off:.2f}x the wall time")


if __name__ == "__main__":
    main()
