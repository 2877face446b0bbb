"""One rank of a training job that is killed, resumed or left alone by another rank (issue 22,
docs/faults.md rows 1 and 3). tests/test_faults.py starts it; by hand:

    uv run torchrun --standalone --nproc-per-node 2 tests/faults_under_torchrun.py \\
        train --loader planned --loader streaming --out /tmp/faults --kill-at 7 --kill-rank 1

No model: a step logs the ids of its batch's samples (the loader's `sample_index`, the stream
a trainer would see) and all-reduces a number, as DDP's gradient all-reduce would, so the ranks
move in step. Every `--checkpoint-every` steps each rank saves `loader.state_dict()` atomically
(written beside, then renamed), all ranks meet at a barrier, and rank 0 then names that step the
latest checkpoint (also atomically): a restart resumes from the latest step every rank saved.

`train`: an epoch of the planned (PackedDataLoader) and/or the streaming (StreamingDataLoader)
loader, 2 DataLoader workers each per rank, resumed from the latest checkpoint in `--out` if
there is one; rank `--kill-rank` sends itself SIGKILL when it reaches step `--kill-at`. With
both loaders, each step takes a batch from each (until each one's epoch ends) and a checkpoint
holds both states: one job kills and resumes both loaders at once (each torchrun launch starts
3 processes that import torch, so the fault test launches half as many jobs as with one loader
a job), and each loader's stream is logged apart (`--launch`-rank-R-LOADER.jsonl).

`rank-dies`: rank 1 leaves (os._exit) or hangs, while rank 0 waits for it: in the streaming
loader's end-of-data all-reduce (`--where stream` or `hang`, at step 3) or in the weighing
across ranks (`--where weighing`). Rank 0 should raise RanksStoppedAnswering naming rank 1.

Acts only when run: pytest imports this file for its doctests, so imports wait in the functions.
"""

import argparse
import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

NUM_ROWS = 200  # about 26 steps per rank of one 512-token pack each, 2 ranks
PACKS_PER_BATCH = 1
BUFFER_SIZE = 16  # streaming: several buffers per reader, so a resume lands inside one


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="an epoch, checkpointed, maybe killed")
    train.add_argument(
        "--loader", choices=["planned", "streaming"], action="append", required=True,
        help="the loader to train with; twice for both, side by side",
    )  # fmt: skip
    train.add_argument("--out", type=Path, required=True, help="checkpoints and sample-id logs")
    train.add_argument("--launch", default="run", help="this launch's name, for its logs")
    train.add_argument("--checkpoint-every", type=int, default=3, help="steps between saves")
    train.add_argument("--kill-at", type=int, default=None, help="step at which to SIGKILL")
    train.add_argument("--kill-rank", type=int, default=0, help="the rank that is killed")
    dies = commands.add_parser("rank-dies", help="rank 1 leaves while rank 0 waits for it")
    dies.add_argument("--where", choices=["stream", "hang", "weighing"], required=True)
    dies.add_argument("--answer-timeout", type=float, default=3.0, help="seconds (stream, hang)")
    return parser.parse_args()


def rows_and_tokenizer():
    from mmdp.data.reading.sources import load_vqa_dataset
    from mmdp.data.tokenizer import get_tokenizer

    return load_vqa_dataset(None, num_rows=NUM_ROWS), get_tokenizer()


def make_loader(kind: str, rows, tokenizer, **loader_args):
    """A loader over `rows` with 2 workers on this rank: the planned or the streaming one."""
    from mmdp.data.vqa_dataset import VQADataset
    from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
    from mmdp.loading.streaming import StreamingDataLoader, StreamingPackedDataset
    from mmdp.packing.packing_config import PackingConfig

    config = PackingConfig(max_length=512, packs_per_batch=PACKS_PER_BATCH, buffer_size=BUFFER_SIZE)
    if kind == "planned":
        return PackedDataLoader(PackedDataset(VQADataset(rows, tokenizer), config=config), 2)
    # 4 shards: one per reader (2 ranks x 2 workers)
    stream = rows.to_iterable_dataset(num_shards=4)
    dataset = StreamingPackedDataset(stream, tokenizer, config=config)
    return StreamingDataLoader(dataset, 2, **loader_args)


# Checkpoints: one file per rank per step, and a note of the latest step every rank saved -------


def write_atomically(path: Path, save) -> None:
    """`save(file)` into a file beside `path`, then renamed over it: a reader (or a restart after
    a kill) sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    save(partial)
    os.replace(partial, path)


def save_checkpoint(out: Path, steps_done: int, state: dict, rank: int) -> None:
    import torch
    import torch.distributed as dist

    write_atomically(out / f"step-{steps_done}" / f"rank-{rank}.pt", lambda f: torch.save(state, f))
    dist.barrier()  # every rank has saved this step: now it may become the latest
    if rank == 0:
        note = json.dumps({"steps_done": steps_done})
        write_atomically(out / "latest.json", lambda f: f.write_text(note))


def latest_checkpoint(out: Path, rank: int) -> dict | None:
    import torch

    if not (out / "latest.json").exists():
        return None
    steps_done = json.loads((out / "latest.json").read_text())["steps_done"]
    return torch.load(out / f"step-{steps_done}" / f"rank-{rank}.pt", weights_only=True)


# train --------------------------------------------------------------------------------------------


def train(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from mmdp.ranks import start_ranks

    rank = start_ranks()
    rows, tokenizer = rows_and_tokenizer()
    loaders = {kind: make_loader(kind, rows, tokenizer) for kind in args.loader}
    state = latest_checkpoint(args.out, rank)
    if state is not None:
        for kind, loader in loaders.items():
            loader.load_state_dict(state[kind])
        print(f"rank {rank}: resuming after {state[kind]['batches_done']} steps", flush=True)
    logs = {
        kind: open(args.out / f"{args.launch}-rank-{rank}-{kind}.jsonl", "a") for kind in loaders
    }
    batches = {kind: iter(loader) for kind, loader in loaders.items()}
    step = state[kind]["batches_done"] if state is not None else 0
    while batches:
        if step == args.kill_at and rank == args.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)  # the training process dies, mid-epoch
        for kind in list(batches):  # the same order on every rank: the loaders' collectives meet
            batch = next(batches[kind], None)
            if batch is None:  # this loader's epoch is over (on every rank: equal batches)
                del batches[kind]
                continue
            assert batch["batch_index"] == step, (kind, batch["batch_index"], step)
            logs[kind].write(json.dumps({"step": step, "ids": batch["sample_index"].tolist()}))
            logs[kind].write("\n")
            logs[kind].flush()
            dist.all_reduce(torch.tensor([len(batch["sample_index"])]))  # DDP's gradient sync
        step += 1
        if batches and step % args.checkpoint_every == 0:
            states = {kind: loader.state_dict() for kind, loader in loaders.items()}
            save_checkpoint(args.out, step, states, rank)
    print(f"rank {rank}: epoch done", flush=True)
    dist.destroy_process_group()


# rank-dies ----------------------------------------------------------------------------------------


def leave(how: str) -> None:
    """Rank 1 stops answering: its process ends at once (no clean-up, as a crash), or it hangs."""
    print(f"rank 1: {'hanging' if how == 'hang' else 'leaving'} at {time.time():.3f}", flush=True)
    if how == "hang":
        time.sleep(600)
    os._exit(3)


def rank_dies(args: argparse.Namespace) -> None:
    from mmdp.ranks import start_ranks
    from mmdp.weighing import weigh as weighing

    rank = start_ranks()
    rows, tokenizer = rows_and_tokenizer()
    if args.where == "weighing":
        # rows no cache has weighed yet (the same on both ranks), and rank 1 leaves mid-weighing
        rows = rows.select(
            range(len(rows)), new_fingerprint=f"rank-dies-{os.environ['MASTER_PORT']}"
        )
        if rank == 1:
            weighing.weigh = lambda *args, **kwargs: leave("exit")
        make_loader("planned", rows, tokenizer)
        return
    timeout = timedelta(seconds=args.answer_timeout)
    for batch in make_loader("streaming", rows, tokenizer, answer_timeout=timeout):
        print(f"rank {rank}: step {batch['batch_index']}", flush=True)
        if rank == 1 and batch["batch_index"] == 3:
            leave(args.where)


if __name__ == "__main__":
    arguments = parse_args()
    train(arguments) if arguments.command == "train" else rank_dies(arguments)
