"""bench/bench_train_step.py: the padded rows it builds for a real family, its figures from the
steps it times, and (slow) the gpu preset run end to end on a CPU at a small size."""

import re
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import bench_train_step as bench  # noqa: E402 - the benches are scripts, not a package

LAST_LINE = re.compile(
    r"train step: packed/naive real tok/s (\d+\.\d\d)x \(waste (\d+\.\d\d)x\), peak memory packed "
    r"(\d+\.\d) GB / naive (\d+\.\d) GB, loader wait (\d+\.\d)%"
)


@pytest.fixture(scope="module")
def samples(tokenizer):
    """Four TinyVLM samples of the embedded rows (the family needs no image processor)."""
    from mmdp import VQADataset, load_vqa_dataset

    dataset = VQADataset(load_vqa_dataset(num_rows=2000), tokenizer)
    return dataset, [dataset[i] for i in range(4)]


def test_naive_rows_hold_one_sample_each_padded_to_the_longest(samples):
    from mmdp import real_token_mask

    dataset, items = samples
    lengths = [len(s["input_ids"]) for s in items]
    batch = bench.PaddedRows(dataset.family)(items)
    assert batch["input_ids"].shape == (4, max(lengths))
    assert real_token_mask(batch).sum(dim=1).tolist() == lengths
    assert batch["samples_per_pack"].tolist() == [1, 1, 1, 1]
    assert batch["sample_index"].tolist() == [s["row"] for s in items]
    for row, sample in enumerate(items):  # each row: its sample, then padding
        assert batch["input_ids"][row, : lengths[row]].tolist() == sample["input_ids"].tolist()


def test_constrained_rows_drop_longer_samples_and_pad_to_the_length(samples):
    from mmdp import real_token_mask

    dataset, items = samples
    lengths = sorted(len(s["input_ids"]) for s in items)
    length = lengths[1]  # the two shortest fit (and any of their length)
    batch = bench.PaddedRows(dataset.family, length)(items)
    kept = [n for n in (len(s["input_ids"]) for s in items) if n <= length]
    assert batch["input_ids"].shape == (len(kept), length)
    assert real_token_mask(batch).sum(dim=1).tolist() == kept
    assert bench.PaddedRows(dataset.family, lengths[0] - 1)(items) is None  # none fits


# Two counted steps of naive padding and of packing, worked by hand, and their memory steps:
#   naive   2 s and 4 s (median 3), 100 real tokens each of 200 and 250 computed: 200 real
#           tokens in 6 s, 33.3 real tok/s; waste 450 / 200 = 2.25; loader wait 0.4 of 6 s; CPU
#           1 s and 2 s, 15 ms a real token; peak 2 GB
#   packed  1 s each, 100 real tokens of 110 computed: 100 real tok/s, waste 1.1, wait 0.2 of 2 s;
#           peak 1 GB
def step(seconds, wait, real, computed):
    return {"seconds": seconds, "wait": wait, "real": real, "computed": computed,
            "trained": real // 2, "patches": real // 4, "cpu": seconds / 2}  # fmt: skip


NAIVE = {"steps": [step(2.0, 0.2, 100, 200), step(4.0, 0.2, 100, 250)], "peak": 2e9}
PACKED = {"steps": [step(1.0, 0.1, 100, 110), step(1.0, 0.1, 100, 110)], "peak": 1e9}


def test_a_strategys_figures_over_its_steps():
    naive = bench.summarize(**NAIVE)
    assert naive["real_tok_s"] == pytest.approx(200 / 6)
    assert naive["computed_tok_s"] == pytest.approx(450 / 6)
    assert naive["step_s"] == 3.0
    assert naive["waste"] == 2.25
    assert naive["wait_share"] == pytest.approx(0.4 / 6)
    assert naive["ms_per_real_token"] == pytest.approx(30)
    assert naive["peak_gb"] == 2.0
    assert naive["trained_share"] == 0.5
    assert naive["cpu_ms_per_real_token"] == pytest.approx(15)


def test_a_packed_steps_products_split_by_the_positions_each_part_runs_on():
    # per real token: layers 100 x 1.1 computed, output layer 40 x 0.5 trained, vision tower
    # 40 x 0.25 patches: 110, 20 and 10 of 140
    counts = {"decoder layers": 100, "output layer": 40, "vision tower": 40}
    shares = bench.matmul_shares(counts, {bench.PACKER: bench.summarize(**PACKED)})
    assert shares == pytest.approx({"decoder layers": 110 / 140, "output layer": 20 / 140,
                                    "vision tower": 10 / 140})  # fmt: skip


def test_the_last_line_compares_packing_with_naive_padding_on_the_same_batches():
    summary = {"naive": bench.summarize(**NAIVE), bench.PACKER: bench.summarize(**PACKED)}
    ratios = bench.compare(summary)
    assert ratios["speed"] == pytest.approx(100 / (200 / 6))
    assert ratios["waste"] == pytest.approx(2.25 / 1.1)
    assert bench.last_line(summary) == (
        "train step: packed/naive real tok/s 3.00x (waste 2.05x), peak memory packed 1.0 GB / "
        "naive 2.0 GB, loader wait 10.0%"
    )
    assert LAST_LINE.fullmatch(bench.last_line(summary))


def test_the_figure_draws_every_strategy_for_each_attention_implementation():
    summary = {name: bench.summarize(**NAIVE) for name in ("naive", "constrained")}
    summary[bench.PACKER] = bench.summarize(**PACKED)
    fig = bench.draw_figure({"sdpa": summary, "flex_attention": summary}, "a title")
    ax = fig.axes[0]
    assert ax.get_title() == "a title"
    assert "ms per real token" in ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["sdpa", "flex_attention", "of which: loader wait"]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["naive\n(waste 2.25x)", "constrained\n(waste 2.25x)",
                     f"{bench.PACKER}\n(waste 1.10x)"]  # fmt: skip


@pytest.mark.slow
def test_the_gpu_preset_runs_on_a_cpu_at_a_small_size(run_script, tmp_path):
    """Qwen2.5-VL-3B's widths, one decoder layer and one vision block, float32 on the CPU (no
    fast bfloat16 here), sdpa (the only implementation of the preset's that runs on a CPU), one
    counted step a strategy: the day a GPU is lent, the preset's code has run."""
    figure = tmp_path / "train_step.png"
    done = run_script(
        "bench/bench_train_step.py", "--preset", "gpu", "--device", "cpu", "--dtype", "float32",
        "--layers", "1", "--batch-size", "2", "--packs-per-batch", "1", "--max-length", "384",
        "--warmup", "0", "--steps", "1", "--rounds", "1", "--num-rows", "64",
        "--num-workers", "1", "--threads", "1", "--figure", str(figure), timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    match = LAST_LINE.fullmatch(lines[-1])
    assert match, lines[-1]
    speed, waste_ratio, packed_gb, naive_gb, wait = map(float, match.groups())
    assert speed > 0 and waste_ratio > 0 and packed_gb > 0 and naive_gb > 0 and 0 <= wait < 100
    assert "hidden 2,048" in done.stdout or "decoder layers of 2,048" in done.stdout
    rows = [line.split("|") for line in lines if line.startswith("| ") and "x |" in line]
    waste = {row[1].strip(): float(row[5].strip().rstrip("x")) for row in rows}
    assert set(waste) == set(bench.STRATEGIES)
    assert all(w >= 1 for w in waste.values())  # a batch computes at least its real tokens
    assert waste_ratio == pytest.approx(waste["naive"] / waste[bench.PACKER], abs=0.01)
    assert figure.exists()
