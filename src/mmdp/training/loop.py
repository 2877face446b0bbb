"""Train and evaluate a TinyVLM on any mmdp batch, timing each part of a step, and read a run's
speed from its log (stage 6).

One optimizer step, in the order it runs, and the name each part is timed under:

    vision + embeddings       TinyVLM.embed: the vision encoder on every image, the projector,
                              the token embeddings
    language model            TinyVLM.hidden_states: the transformer layers
    logits + loss             the output layer and the mean over label tokens, on the label
                              positions only, a chunk at a time, with its gradient in the same
                              pass (mmdp.training.loss.head_loss): no 49,153-wide logits of
                              padding or prompt positions
    backward: logits + loss   that gradient, scaled, down to the hidden states
    backward: the rest        on through the language model, projector and vision encoder
    optimizer                 AdamW's step

The backward is cut in two at the hidden states (a detached copy that requires grad); the
gradient is the same as that of one loss.backward(). On a GPU in bf16 (mixed_precision), on a
CPU in float32.
"""

import statistics
import time

import torch

from mmdp import config
from mmdp.batch import real_token_mask
from mmdp.models.tiny_vlm import TinyVLM, vlm_inputs
from mmdp.training.loss import batch_loss, head_loss, label_tokens
from mmdp.training.recipes import mixed_precision

PARTS = (
    "vision + embeddings",
    "language model",
    "logits + loss",
    "backward: logits + loss",
    "backward: the rest",
    "optimizer",
)


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class PartTimer:
    """Seconds per part: lap(part) adds the time since the previous lap to `part`."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.last = time.perf_counter()

    def lap(self, part: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # GPU work is asynchronous: wait for it before reading
        now = time.perf_counter()
        self.seconds[part] += now - self.last
        self.last = now


def train_step(model: TinyVLM, batch: dict, optimizer) -> tuple[float, dict]:
    """One optimizer step on the mean loss over label tokens (transformers' loss); returns the
    loss and the seconds of each part (PARTS)."""
    device = next(model.parameters()).device
    inputs = vlm_inputs(to_device(batch, device))
    timer = PartTimer(device)
    with mixed_precision(device, device.type == "cuda"):
        embeds = model.embed(inputs.pop("input_ids"), inputs.pop("pixel_values"))
        timer.lap("vision + embeddings")
        labels = inputs.pop("labels")
        hidden = model.hidden_states(embeds, **inputs)
        timer.lap("language model")
        cut = hidden.detach().requires_grad_()
        summed, _ = head_loss(model.get_output_embeddings(), cut, labels)
        loss = summed / label_tokens(labels)
        timer.lap("logits + loss")
    loss.backward()
    timer.lap("backward: logits + loss")
    hidden.backward(cut.grad)
    timer.lap("backward: the rest")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    timer.lap("optimizer")
    return loss.item(), timer.seconds


@torch.no_grad()
def evaluate(model: TinyVLM, batches: list[dict]) -> float:
    """The mean loss over every label token of `batches` (held-out samples), in eval mode."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    for batch in batches:
        batch = to_device(batch, device)
        with mixed_precision(device, device.type == "cuda"):
            parts = batch_loss(model, vlm_inputs(batch), batch)  # label positions only
        total += float(parts.summed)
        tokens += parts.label_tokens
    model.train(was_training)
    return total / tokens


def train_in_turns(runs: dict, *, lr: float, checkpoints, evaluate_on) -> dict:
    """Train several models, each on its own batches (`runs`: {name: (model, batches)}), one AdamW
    step of each in turn (on a shared machine the load changes from minute to minute; in turns,
    every run meets the same load, and their timings can be compared), and evaluate each on
    `evaluate_on` (held-out batches) at each checkpoint: a number of samples seen (0: before the
    first step).

    A checkpoint is evaluated after the first step that reaches it (a packed step may pass it by
    a few samples; `eval_samples_seen` says by how many), and the ones the batches never reach
    (samples dropped as too long) after the last step, so every run has one loss per checkpoint.
    Returns {name: log}, a log per step: samples_seen, loss, real/computed/label tokens, seconds
    per part; per checkpoint: eval_loss, eval_samples_seen and eval_steps (optimizer steps done).
    """
    logs = {}
    turns = []
    for name, (model, batches) in runs.items():
        logs[name] = {
            "samples_seen": [],
            "loss": [],
            "real_tokens": [],
            "computed_tokens": [],
            "label_tokens": [],
            "seconds": {part: [] for part in PARTS},
            "eval_loss": [],
            "eval_samples_seen": [],
            "eval_steps": [],
        }
        turns.append(steps(model, batches, logs[name], lr, sorted(checkpoints), evaluate_on))
    while turns:
        turns = [turn for turn in turns if next(turn, False)]
    return logs


def steps(model, batches, log: dict, lr: float, checkpoints: list, evaluate_on):
    """Train `model` on `batches`, filling `log`; yields True after every step (train_in_turns)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()

    def evaluate_up_to(seen: int, last: bool) -> None:
        reached = [c for c in checkpoints[len(log["eval_loss"]) :] if c <= seen or last]
        if reached:
            loss = evaluate(model, evaluate_on)
            log["eval_loss"] += [loss] * len(reached)
            log["eval_samples_seen"] += [seen] * len(reached)
            log["eval_steps"] += [len(log["loss"])] * len(reached)

    seen = 0
    evaluate_up_to(seen, last=not batches)
    for step, batch in enumerate(batches):
        loss, seconds = train_step(model, batch, optimizer)
        mask = real_token_mask(batch)
        seen += len(batch["sample_index"])
        log["samples_seen"].append(seen)
        log["loss"].append(loss)
        log["real_tokens"].append(int(mask.sum()))
        log["computed_tokens"].append(mask.numel())
        log["label_tokens"].append(label_tokens(batch["labels"]))
        for part, value in seconds.items():
            log["seconds"][part].append(value)
        evaluate_up_to(seen, last=step == len(batches) - 1)
        yield True


def time_logits_per_position(
    model: TinyVLM, shapes: list[tuple[int, int]], repeats: int = 3
) -> dict:
    """Seconds per position of "logits + loss" and its backward, for batches of each shape
    (rows, length): does a large batch's loss cost more than its share?

    Hidden states are random and a third of the labels ignored, as in a reply (their positions
    cost nothing: the loss reads the label positions only); the median of `repeats` runs.
    Returns {"rows x length": microseconds per position}.
    """
    device = next(model.parameters()).device
    vocab_size, hidden_size = model.lm.lm_head.weight.shape
    generator = torch.Generator().manual_seed(0)
    result = {}
    for rows, length in shapes:
        runs = []
        for _ in range(repeats):
            hidden = torch.randn(rows, length, hidden_size, generator=generator)
            labels = torch.randint(0, vocab_size, (rows, length), generator=generator)
            labels[:, ::3] = config.IGNORE_INDEX
            hidden = hidden.to(device).requires_grad_()
            timer = PartTimer(device)
            with mixed_precision(device, device.type == "cuda"):
                summed, _ = head_loss(model.get_output_embeddings(), hidden, labels.to(device))
            (summed / label_tokens(labels)).backward()
            timer.lap("logits + loss")
            runs.append(timer.seconds["logits + loss"])
        model.zero_grad(set_to_none=True)
        result[f"{rows} x {length}"] = round(statistics.median(runs) / (rows * length) * 1e6, 1)
    return result


# What a log says about speed (stage 6) ----------------------------------------------------------


def timed_steps(log: dict) -> slice:
    """The steps a run is timed on: all but its first (one-time allocations), unless it is the
    only one."""
    return slice(1 if len(log["loss"]) > 1 else 0, None)


def speed_of_run(log: dict) -> dict:
    """A run's real and computed tokens, seconds and real tokens per second over its timed steps
    (every part of a step counted), its steps, and the median seconds of a timed step."""
    timed = timed_steps(log)
    seconds = [sum(parts) for parts in zip(*log["seconds"].values())][timed]
    real, computed = sum(log["real_tokens"][timed]), sum(log["computed_tokens"][timed])
    return {
        "real_tokens": real,
        "computed_tokens": computed,
        "seconds": round(sum(seconds), 3),
        "steps": len(log["loss"]),
        "real_tokens_per_s": round(real / sum(seconds), 1),
        "seconds_per_step": statistics.median(seconds),
    }


def median_time_per_part(logs: list[dict]) -> dict:
    """Seconds of each part of a step (PARTS) over a run's timed steps: the median over runs."""
    return {
        part: round(
            statistics.median(sum(log["seconds"][part][timed_steps(log)]) for log in logs), 3
        )
        for part in PARTS
    }
