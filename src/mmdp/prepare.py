"""Prepare a dataset once: weigh every row for a model and its budgets, and write the weights (and,
with --pretokenize, every sample's input_ids and labels) with a manifest to a path or any fsspec
URL, for every later run on every machine (mmdp.weighing.prepared).

    uv run -m mmdp.prepare --out /data/prepared/synthetic --num-rows 2000
    uv run --extra s3 -m mmdp.prepare --out s3://bucket/prepared/ai2d \\
        --dataset HuggingFaceM4/the_cauldron --subset ai2d --model qwen2_5_vl --pretokenize
    uv run examples/pack_prepared.py --prepared s3://bucket/prepared/ai2d --dataset ... --model qwen2_5_vl
    uv run --extra ray -m mmdp.prepare --engine ray --out /tmp/prepared/ray  # on Ray Data

Weighing runs here (--engine local) or on Ray (--engine ray: a local instance, or the cluster of
--ray-address or of `ray job submit`), to the same result (mmdp.weighing.on_ray).

Prints how many rows fit the budgets (and why the others do not) and where it wrote. The run
that reads it must load the same rows with the same model, processor and budgets, or it is
refused in one sentence.
"""

import argparse
import time

from mmdp import config
from mmdp.data.families import MODELS, family_for
from mmdp.data.reading.settings import DataSettings
from mmdp.errors import UserError, exit_on_user_error
from mmdp.flags import (
    add_dataset_args,
    add_model_and_budget_args,
    config_for,
    description,
    model_processor,
    positive_int,
    settings_of,
)
from mmdp.report.printing import print_settings
from mmdp.weighing.prepared import budget_report, describe, rows_digest, write_prepared
from mmdp.weighing.weigh import weigh_rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m mmdp.prepare", description=description(__doc__)
    )
    parser.add_argument(
        "--out",
        required=True,
        help="where to write: a path or an fsspec URL (s3://, gs://, hf://, ...)",
    )
    add_dataset_args(parser)
    parser.add_argument("--subset", default=None, help="Hub subset (config), e.g. ai2d")
    parser.add_argument("--split", default="train", help="dataset split (default: train)")
    parser.add_argument(
        "--num-rows",
        type=positive_int,
        default=config.DEFAULT_NUM_ROWS,
        help=f"rows of the dataset to read (default: {config.DEFAULT_NUM_ROWS:,})",
    )
    add_model_and_budget_args(parser, MODELS)
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tiny's tokenizer name or path (default: the SmolLM2 tokenizer shipped in the repo)",
    )
    parser.add_argument(
        "--pretokenize", action="store_true", help="also write every sample's input_ids and labels"
    )
    parser.add_argument(
        "--num-proc",
        type=positive_int,
        default=None,
        help="weighing processes (default: every core from 20,000 rows on); with --engine ray, "
        "the local Ray instance's CPUs (default: every core)",
    )
    parser.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="where to weigh: this machine (default), or Ray Data (the extra ray)",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="with --engine ray: the Ray cluster to weigh on, e.g. ray://head:10001 (default: "
        "RAY_ADDRESS's, which `ray job submit` sets, else a local instance)",
    )
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.engine == "ray" and args.pretokenize:
        raise UserError(
            "--pretokenize needs --engine local (on Ray, every sample's tokens would pass "
            "through its driver into one file that each training machine copies)"
        )
    start = time.perf_counter()
    family = family_for(model_processor(args))
    packing = config_for(family, args)  # the family's budgets where a flag is unset
    print_settings(args, packing)

    # Weigh every row (and keep its tokens): the same pass a training run would make, here or on Ray
    settings = settings_of(DataSettings, args)
    if args.engine == "ray":
        from mmdp.weighing.on_ray import weigh_on_ray

        weighing, digest = weigh_on_ray(
            settings, family, num_proc=args.num_proc, address=args.ray_address
        )
    else:
        rows = settings.load()
        weighing = weigh_rows(rows, family, pretokenize=args.pretokenize, num_proc=args.num_proc)
        digest = rows_digest(rows)

    # Describe what the weights depend on, check them against the budgets, write them
    num_rows = len(weighing.weights)
    run = describe(family, packing, num_rows, digest)
    source = {
        "name": args.dataset or "synthetic",
        "subset": args.subset,
        "split": args.split,
        "rows": num_rows,
        "share": 1.0,
    }
    report = budget_report(weighing.weights, run)
    manifest = write_prepared(
        args.out, weighing.weights, weighing.tokens, {**run, "sources": [source], "report": report}
    )
    dropped = ", ".join(f"{reason} {n:,}" for reason, n in report["dropped"].items()) or "none"
    print(f"{report['usable']:,} of {num_rows:,} rows fit the budgets (dropped: {dropped})")
    print(
        f"Wrote {', '.join(manifest['files'])} and manifest.json to {args.out} in {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    with exit_on_user_error():
        main()
