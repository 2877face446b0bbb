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

import dataclasses
import time
from typing import Literal

from mmdp import config
from mmdp.config import setting
from mmdp.data.families import family_for
from mmdp.data.reading.settings import DataSettings, ModelSettings
from mmdp.errors import UserError, exit_on_user_error
from mmdp.flags import FAMILY_BUDGETS, flag_values, parse_flags
from mmdp.packing.packing_config import PackingConfig, default_config
from mmdp.planning.planner import filter_rows
from mmdp.report.printing import print_settings
from mmdp.weighing.prepared import describe, rows_digest, write_prepared
from mmdp.weighing.weigh import weigh_rows


@dataclasses.dataclass(frozen=True)
class PrepareSettings:
    """What to weigh, for which model and budgets, and where the weights go."""

    out: str = setting(help="where to write: a path or an fsspec URL (s3://, gs://, hf://, ...)")
    data: DataSettings = DataSettings(num_rows=config.DEFAULT_NUM_ROWS)
    model: ModelSettings = ModelSettings()
    tokenizer: str | None = setting(
        None, "tiny's tokenizer name or path", shown="the SmolLM2 tokenizer shipped in the repo"
    )
    # the budgets the rows are checked against: the model family's where not given
    packing: PackingConfig = setting(
        PackingConfig(max_length=None),
        flags=("max_length", "max_images", "max_patches"),
        shown=FAMILY_BUDGETS,
    )
    pretokenize: bool = setting(False, "also write every sample's input_ids and labels")
    num_proc: int | None = setting(
        None,
        "weighing processes; with --engine ray, the local Ray instance's CPUs",
        shown="every core (local: from 20,000 rows on)",
        min=1,
    )
    engine: Literal["local", "ray"] = setting(
        "local", "where to weigh: this machine, or Ray Data (the extra ray)"
    )
    ray_address: str | None = setting(
        None,
        "with --engine ray: the Ray cluster to weigh on, e.g. ray://head:10001",
        shown="RAY_ADDRESS's, which `ray job submit` sets, else a local instance",
    )


def main(argv=None):
    settings = parse_flags(PrepareSettings, __doc__, argv, prog="python -m mmdp.prepare")
    if settings.engine == "ray" and settings.pretokenize:
        raise UserError(
            "--pretokenize needs --engine local (on Ray, every sample's tokens would pass "
            "through its driver into one file that each training machine copies)"
        )
    start = time.perf_counter()
    family = family_for(settings.model.load_processor(settings.tokenizer))
    packing = default_config(family, **settings.packing.settings())  # the family's where unset
    print_settings(flag_values(settings), packing)

    # Weigh every row (and keep its tokens): the same pass a training run would make, here or on Ray
    if settings.engine == "ray":
        from mmdp.weighing.on_ray import weigh_on_ray

        weighing, digest = weigh_on_ray(
            settings.data, family, num_proc=settings.num_proc, address=settings.ray_address
        )
    else:
        rows = settings.data.load()
        weighing = weigh_rows(
            rows, family, pretokenize=settings.pretokenize, num_proc=settings.num_proc
        )
        digest = rows_digest(rows)

    # Describe what the weights depend on, check them against the budgets, write them
    num_rows = len(weighing.weights)
    run = describe(family, packing, num_rows, digest)
    source = {
        "name": settings.data.dataset or "synthetic",
        "subset": settings.data.subset,
        "split": settings.data.split,
        "rows": num_rows,
        "share": 1.0,
    }
    usable, by_reason = filter_rows(weighing.weights, packing.budgets)
    report = {"usable": len(usable), "dropped": dict(sorted(by_reason.items()))}
    manifest = write_prepared(
        settings.out,
        weighing.weights,
        weighing.tokens,
        {**run, "sources": [source], "report": report},
    )
    dropped = ", ".join(f"{reason} {n:,}" for reason, n in report["dropped"].items()) or "none"
    print(f"{report['usable']:,} of {num_rows:,} rows fit the budgets (dropped: {dropped})")
    print(
        f"Wrote {', '.join(manifest['files'])} and manifest.json to {settings.out} in {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    with exit_on_user_error():
        main()
