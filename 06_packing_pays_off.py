"""Stage 6 (beyond the blog): does packing pay off? Same loss, more useful tokens per second,
measured on a tiny vision-language model (mmdp.model.TinyVLM).

    uv run 06_packing_pays_off.py                    # about two minutes on 2 CPU cores
    uv run 06_packing_pays_off.py --train-samples 128 --metrics-json /tmp/06.json

1. Correctness: the forward loss summed over the same samples, images included, is the same
   whether they come naively padded, constrained-padded or knapsack-packed (restarting
   position_ids). A wrong image-to-sample mapping is shown to break it.
2. Speed: from the same initial weights, each strategy trains on the same number of samples;
   useful (non-padding) tokens per second, steps and wall time per epoch.
3. Learning: training loss against samples seen, per strategy: assets/06.png.
4. Every strategy on one epoch (from lengths): assets/strategies.png.
On a GPU (bf16 autocast, sdpa) the same script runs unchanged.
"""

import argparse
import copy
import math
import statistics
import time

import numpy as np
import torch

from mmdp import config
from mmdp.cli import add_data_args, display_path, print_settings
from mmdp.collate import ConstrainedPadCollator, NaivePadCollator, real_token_mask
from mmdp.data import load_vqa_dataset
from mmdp.errors import exit_on_user_error
from mmdp.metrics import write_json
from mmdp.model import TinyVLM, TinyVLMConfig, summed_loss, vlm_inputs
from mmdp.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.planner import plan_epoch
from mmdp.plots import plot_learning_curves, plot_strategies, save_figure
from mmdp.strategies import compare_strategies
from mmdp.tokenizer import get_tokenizer
from mmdp.vqa_dataset import VQADataset
from mmdp.weighing import weigh_rows

STRATEGIES = ("naive", "constrained", "packed")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_args(parser)
    parser.add_argument("--tokenizer", default=None, help="default: the shipped SmolLM2 tokenizer")
    parser.add_argument("--batch-size", type=int, default=config.BATCH_SIZE,
                        help="samples (padding) or packs (packing) per batch (default: 8)")  # fmt: skip
    parser.add_argument("--max-length", type=int, default=config.MAX_LENGTH,
                        help="pack length, and constrained padding's max length (default: 512)")  # fmt: skip
    parser.add_argument("--check-samples", type=int, default=48,
                        help="samples in the loss-equivalence check (default: 48)")  # fmt: skip
    parser.add_argument("--train-samples", type=int, default=256,
                        help="samples each strategy trains on (default: 256)")  # fmt: skip
    parser.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate")
    parser.add_argument("--metrics-json", default=None, help="write the results as JSON here")
    return parser.parse_args()


def device_and_autocast():
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.device("cpu"), torch.autocast("cpu", enabled=False)


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def padded_batches(samples, rows, collate, batch_size):
    return [
        collate([samples[r] for r in rows[i : i + batch_size]])
        for i in range(0, len(rows), batch_size)
    ]


def packed_batches(rows_dataset, tokenizer, args, packs_per_batch=None):
    """Stage 5's batches of a dataset (all of them) and the PackedDataset that made them."""
    packed = PackedDataset(
        VQADataset(rows_dataset, tokenizer), max_length=args.max_length,
        packs_per_batch=packs_per_batch or args.batch_size, seed=args.seed,
    )  # fmt: skip
    return list(PackedDataLoader(packed, num_workers=0)), packed


def check_losses(model, samples, rows, tokenizer, args) -> tuple[dict, list]:
    """Summed loss of the same samples through each strategy's batches, and a wrong mapping."""
    naive = padded_batches(samples, rows, NaivePadCollator(tokenizer.pad_token_id), args.batch_size)
    constrained = padded_batches(
        samples,
        rows,
        ConstrainedPadCollator(tokenizer.pad_token_id, args.max_length),
        args.batch_size,
    )
    packed, _ = packed_batches(samples.dataset.select(rows), tokenizer, args)
    losses = {}
    with torch.no_grad():
        for name, batches in (("naive", naive), ("constrained", constrained), ("packed", packed)):
            losses[name] = sum(
                float(summed_loss(model(**vlm_inputs(b)).logits, b["labels"])) for b in batches
            )
        # The same packed batches with each batch's images shifted by one: every image now
        # lands on another sample's image tokens.
        wrong = 0.0
        for b in packed:
            shifted = {**b, "images": b["images"].roll(1, dims=0)}
            wrong += float(summed_loss(model(**vlm_inputs(shifted)).logits, b["labels"]))
    reference = losses["naive"]
    losses["max_rel_diff"] = max(abs(losses[n] - reference) / reference for n in STRATEGIES)
    losses["wrong_image_mapping_rel_diff"] = abs(wrong - reference) / reference
    return losses, packed


def train(model, batches, lr, device, autocast) -> dict:
    """Train on the batches; returns the per-step log and the totals (the first step, which
    includes one-time allocation, is left out of the timing)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    log = {"samples_seen": [], "loss": [], "seconds": []}
    useful = computed = seen = 0
    timed_useful = timed_computed = 0
    for step, batch in enumerate(batches):
        batch = to_device(batch, device)
        mask = real_token_mask(batch)
        start = time.perf_counter()
        with autocast:
            loss = model(**vlm_inputs(batch)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        seen += len(batch["sample_index"])
        useful += int(mask.sum())
        computed += mask.numel()
        log["samples_seen"].append(seen)
        log["loss"].append(loss.item())
        log["seconds"].append(seconds)
        if step > 0:
            timed_useful += int(mask.sum())
            timed_computed += mask.numel()
    timed_seconds = sum(log["seconds"][1:]) or sum(log["seconds"])
    return {
        "log": log,
        "useful_tokens": useful,
        "computed_tokens": computed,
        "steps": len(batches),
        "seconds": round(timed_seconds, 3),
        "useful_tokens_per_s": round((timed_useful or useful) / timed_seconds, 1),
        "seconds_per_step": statistics.median(log["seconds"][1:] or log["seconds"]),
    }


def main():
    args = parse_args()
    print_settings(args)
    device, autocast = device_and_autocast()
    torch.manual_seed(args.seed)

    # The samples, and stage 2's tokenized dataset
    tokenizer = get_tokenizer(args.tokenizer)
    rows = load_vqa_dataset(args.dataset, args.subset, args.split, args.num_samples)
    samples = VQADataset(rows, tokenizer)
    vlm_config = TinyVLMConfig(vocab_size=len(tokenizer), image_token_id=tokenizer.image_token_id)

    # 1. Correctness: the samples every strategy keeps (usable, at most max_length tokens)
    weights = weigh_rows(rows, tokenizer).weights
    kept = np.flatnonzero((weights.reasons == 0) & (weights.lengths <= args.max_length))
    kept = kept[: args.check_samples].tolist()
    # a model with large initial weights, so that what it sees (masks, images) shows in the loss
    checker = TinyVLM(TinyVLMConfig(**{**vlm_config.__dict__, "initializer_range": 0.5})).eval()
    losses, packed_check_batches = check_losses(checker, samples, kept, tokenizer, args)
    print(f"\n1. Loss summed over the same {len(kept)} samples (float32, CPU):")
    for name in STRATEGIES:
        print(f"   {name:<12} {losses[name]:,.4f}")
    ok = "OK" if losses["max_rel_diff"] < 1e-4 else "MISMATCH"
    print(f"   max relative difference: {losses['max_rel_diff']:.1e} ({ok}: < 1e-4)")
    wrong = losses["wrong_image_mapping_rel_diff"]
    verdict = "fails the check, as it must" if wrong >= 1e-4 else "NOT caught by the check"
    print(f"   the same packs with each image on the wrong sample: {wrong:.1e} ({verdict})")

    # 2. Speed: the same initial weights, the same number of samples for every strategy
    order = torch.randperm(
        len(samples), generator=torch.Generator().manual_seed(args.seed)
    ).tolist()
    train_batches = {
        "naive": padded_batches(
            samples,
            order[: args.train_samples],
            NaivePadCollator(tokenizer.pad_token_id),
            args.batch_size,
        ),
        "constrained": padded_batches(
            samples,
            order[: args.train_samples],
            ConstrainedPadCollator(tokenizer.pad_token_id, args.max_length),
            args.batch_size,
        ),  # fmt: skip
    }
    # Each optimizer step sees about the same number of samples: batch_size samples for padding,
    # the packs that hold as many for packing (the learning rate then means the same thing).
    samples_per_pack = len(kept) / sum(len(b["samples_per_pack"]) for b in packed_check_batches)
    packs_per_step = max(1, round(args.batch_size / samples_per_pack))
    train_batches["packed"], _ = packed_batches(
        rows.select(order[: args.train_samples]), tokenizer, args, packs_per_batch=packs_per_step
    )
    whole_epoch = plan_epoch(
        weights, max_length=args.max_length, max_images=config.MAX_IMAGES, packs_per_batch=1,
        seed=args.seed,
    )  # fmt: skip
    num_packs = len(whole_epoch.pack_starts) - 1
    steps_per_epoch = {
        "naive": math.ceil(len(samples) / args.batch_size),
        "constrained": math.ceil(len(samples) / args.batch_size),
        "packed": math.ceil(num_packs / packs_per_step),
    }
    initial = TinyVLM(vlm_config).state_dict()
    speed, curves = {}, {}
    for name in STRATEGIES:
        model = TinyVLM(vlm_config)
        model.load_state_dict(copy.deepcopy(initial))
        result = train(model.to(device), train_batches[name], args.lr, device, autocast)
        curves[name] = (result["log"]["samples_seen"], result["log"]["loss"])
        result["steps_per_epoch"] = steps_per_epoch[name]
        result["seconds_per_epoch"] = round(steps_per_epoch[name] * result["seconds_per_step"], 1)
        speed[name] = {k: v for k, v in result.items() if k != "log"}

    naive, packed = speed["naive"], speed["packed"]
    waste_ratio = naive["computed_tokens"] / naive["useful_tokens"]
    gain = packed["useful_tokens_per_s"] / naive["useful_tokens_per_s"]
    print(
        f"\n2. Training on {args.train_samples} samples per strategy ({device.type}); a step is "
        f"{args.batch_size} samples padded, or {packs_per_step} packs of {args.max_length}:"
    )
    print(
        f"   {'strategy':<12} {'useful tok/s':>12} {'steps':>6} {'steps/epoch':>12} {'s/epoch':>8}"
    )
    for name in STRATEGIES:
        s = speed[name]
        print(f"   {name:<12} {s['useful_tokens_per_s']:>12,.0f} {s['steps']:>6} "
              f"{s['steps_per_epoch']:>12} {s['seconds_per_epoch']:>8.1f}")  # fmt: skip
    print(
        f"   packed / naive useful tokens per second: {gain:.2f}x; naive padding computes "
        f"{waste_ratio:.2f}x its useful tokens; recovered {gain / waste_ratio:.0%} of that waste"
    )

    # 3. Learning: loss against samples seen
    fig = plot_learning_curves(
        curves, f"Training loss per strategy (TinyVLM, {device.type}, same initial weights)"
    )
    print(
        f"\n3. Saved the learning curves to {display_path(save_figure(fig, args.out_dir, '06.png'))}"
    )

    # 4. Every strategy on one epoch of the dataset, from lengths
    results = compare_strategies(
        weights, max_length=args.max_length, max_images=config.MAX_IMAGES,
        batch_size=args.batch_size, seed=args.seed,
    )  # fmt: skip
    print(f"\n4. One epoch of {len(samples):,} samples, max_length {args.max_length}, "
          f"batch size {args.batch_size}:")  # fmt: skip
    print(f"   {'strategy':<12} {'utilization':>11} {'batches':>8} {'dropped':>8} "
          f"{'tokens/row':>16} {'images/row':>11} {'samples/row':>12}")  # fmt: skip
    for name, r in results.items():
        tokens, images, per_row = r["tokens_per_row"], r["images_per_row"], r["samples_per_row"]
        print(f"   {name:<12} {r['utilization']:>11.1%} {r['batches']:>8} "
              f"{sum(r['dropped'].values()):>8} {tokens['mean']:>9.0f} ± {tokens['std']:<4.0f} "
              f"{images['mean']:>6.1f} ± {images['std']:<3.1f} {per_row['mean']:>7.1f} ± {per_row['std']:<3.1f}")  # fmt: skip
    fig = plot_strategies(
        results,
        f"Every strategy on one epoch ({len(samples):,} samples, rows of {args.max_length})",
    )
    print(
        f"   Saved the comparison to {display_path(save_figure(fig, args.out_dir, 'strategies.png'))}"
    )

    if args.metrics_json:
        metrics = {
            "loss": {k: v for k, v in losses.items() if k in (*STRATEGIES, "max_rel_diff")},
            "wrong_image_mapping_rel_diff": losses["wrong_image_mapping_rel_diff"],
            "speed": {
                name: {
                    k: speed[name][k]
                    for k in (
                        "useful_tokens",
                        "computed_tokens",
                        "seconds",
                        "useful_tokens_per_s",
                        "steps",
                        "steps_per_epoch",
                        "seconds_per_epoch",
                    )
                }  # fmt: skip
                for name in STRATEGIES
            },
            "strategies": {
                n: {k: v for k, v in r.items() if k != "per_row"} for n, r in results.items()
            },
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        }
        print(f"Wrote the results to {display_path(write_json(metrics, args.metrics_json))}")


if __name__ == "__main__":
    with exit_on_user_error():
        main()
