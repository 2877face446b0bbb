"""The stage scripts, run as a user runs them (in this process): what they print, write and
report; and what they print is what the README and docs/ quote (tests/doc_blocks.py: exactly
when a test runs the quoted command, else as a template; the `docs` marker: -k docs)."""

import json
import re
import socket

import pytest
from conftest import REPO
from doc_blocks import check_output, quoted_batch_keys

from mmdp import config
from mmdp.drop_reasons import LEFT_OUT_TO_EQUALISE_RANKS, TOO_LONG

KEYS = {"samples", "dropped", "batches", "real_tokens", "computed_tokens", "utilization"}


@pytest.mark.docs
def test_stage1_saves_the_sample_figure(run_main, tmp_path):
    argv = ["01_check_dataset.py", "--seed", "5", "--out-dir", str(tmp_path)]
    status, out, err = run_main(*argv)
    assert status == 0, err
    assert (tmp_path / "01.png").stat().st_size > 10_000
    assert f"Saved the sample to {tmp_path / '01.png'}" in out
    assert check_output("uv run 01_check_dataset.py --seed 5", argv, out, paths=assets(tmp_path))


def assets(tmp_path) -> dict:
    """A test's output folder, read as the docs' `assets` (the scripts' default)."""
    return {str(tmp_path): "assets"}


@pytest.mark.parametrize(
    ("script", "extra"),
    [
        ("02_naive_pad_dataloader.py", []),
        ("03_constrained_pad_dataloader.py", ["--max-length", "256"]),
    ],
)
@pytest.mark.docs
def test_padding_stages_write_figure_and_consistent_metrics(run_main, tmp_path, script, extra):
    metrics = tmp_path / "m.json"
    argv = [script, "--num-rows", "96", "--batch-size", "8", "--out-dir", str(tmp_path),
            "--metrics-json", str(metrics), *extra]  # fmt: skip
    status, out, err = run_main(*argv)
    assert status == 0, err
    check_output(f"uv run {script}", argv, out, paths=assets(tmp_path))  # as a template
    figure = tmp_path / f"{script[:2]}.png"
    assert figure.stat().st_size > 10_000
    report = json.loads(metrics.read_text())
    assert KEYS <= set(report)
    assert report["samples"] + sum(report["dropped"].values()) == 96
    assert report["utilization"] == pytest.approx(
        report["real_tokens"] / report["computed_tokens"], abs=1e-6
    )
    if script.startswith("03"):
        assert report["computed_tokens"] == report["batches"] * 8 * 256 - 256 * sum(
            report["dropped"].values()
        )
        assert report["dropped"].get(TOO_LONG, 0) > 0
    else:
        assert report["batches"] == 12 and report["dropped"] == {}


@pytest.mark.docs
def test_stage4_prints_the_blogs_packs_and_saves_both_figures(run_main, tmp_path):
    argv = ["04_knapsack_toy.py", "--out-dir", str(tmp_path)]
    status, out, err = run_main(*argv)
    assert status == 0, err
    assert check_output("uv run 04_knapsack_toy.py", argv, out, paths=assets(tmp_path)) == "exact"
    lines = out.splitlines()
    greedy = lines[lines.index("=== Strategy: GREEDY ===") + 1 :][:4]
    binpack = lines[lines.index("=== Strategy: BINPACK ===") + 1 :][:3]
    assert [line.split(": ", 1)[1] for line in greedy] == [
        " ".join(map(str, range(1, 14))),
        "14 15 16 17 18 19",
        "20 21 22 23",
        "24",
    ]
    assert [line.split(": ", 1)[1] for line in binpack] == [
        "24 23 22 21 10",
        "20 19 18 17 16 9 1",
        "15 14 13 12 11 8 7 6 5 4 3 2",
    ]
    for name in ("04_greedy.png", "04_binpack.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def readme_image_budget() -> dict:
    """What the README's stage 5 says of the image budget: "(at most 6 images a pack here):
    `--max-images 4` makes 554 packs, 87.4% real (PackedDataset: 558, 86.8%)"."""
    text = " ".join((REPO / "README.md").read_text().split())
    found = re.search(
        r"at most (\d+) images a pack here\): `--max-images (\d+)` makes ([\d,]+) packs, "
        r"([\d.]+%) real \(PackedDataset: ([\d,]+), ([\d.]+%)\)",
        text,
    )
    keys = ("most_here", "max_images", "packs", "utilization", "library_packs", "library_use")
    return dict(zip(keys, found.groups()))


# The README's sentence on a tight image budget, its run at 2,000 rows (-m slow): a change in the
# knapsack or the budgets that moves a number fails here. Its epoch decodes every image in 2
# workers, about 16 s of CPU.
@pytest.mark.slow
@pytest.mark.docs
def test_the_readmes_tight_image_budget_is_what_the_run_reports(run_main, tmp_path):
    said = readme_image_budget()
    metrics = tmp_path / "m.json"
    argv = ["05_knapsack_multimodal.py", "--max-images", said["max_images"],
            "--out-dir", str(tmp_path), "--metrics-json", str(metrics)]  # fmt: skip
    status, out, err = run_main(*argv)
    assert status == 0, err
    report = json.loads(metrics.read_text())
    library = re.search(r"^PackedDataset \(\w+\): ([\d,]+) packs, ([\d.]+%)", out, flags=re.M)
    assert [f"{report['packs']:,}", f"{report['utilization']:.1%}", *library.groups()] == [
        said["packs"],
        said["utilization"],
        said["library_packs"],
        said["library_use"],
    ]
    assert report["images_per_row"]["max"] == int(said["max_images"])


# The README quotes the 2,000-row run: checked exactly in the slow group, as a template on 400.
@pytest.mark.docs
@pytest.mark.parametrize(
    "num_rows", [pytest.param(None, marks=pytest.mark.slow, id="default-2000-rows"), 400]
)
def test_stage5_packs_with_the_blogs_dataset_and_checks_it_against_packed_dataset(
    run_main, tmp_path, num_rows
):
    metrics = tmp_path / "m.json"
    batch = tmp_path / "batch.pt"
    argv = ["05_knapsack_multimodal.py", *(["--num-rows", str(num_rows)] if num_rows else []),
            "--out-dir", str(tmp_path), "--metrics-json", str(metrics), "--save-batch", str(batch)]  # fmt: skip
    status, out, err = run_main(*argv)
    assert status == 0, err
    how = check_output("uv run 05_knapsack_multimodal.py", argv, out, paths=assets(tmp_path))
    assert how == ("template" if num_rows else "exact")
    report = json.loads(metrics.read_text())
    assert KEYS <= set(report)
    rows = num_rows or config.DEFAULT_NUM_ROWS
    assert report["samples"] + sum(report["dropped"].values()) == report["rows_read"] == rows
    assert set(report["dropped"]) == {TOO_LONG}  # the knapsack's filter, counted
    # 2,000 rows: 95.7% (the README's); 400 rows, 200 a worker, less: the blog's delta opens 5
    # spare packs a buffer, and the smaller the buffer the more they weigh
    assert report["utilization"] >= 0.85
    assert len(report["sample_index"]) == len(set(report["sample_index"])) == report["samples"]
    assert report["images_per_row"]["max"] <= config.MAX_IMAGES
    if num_rows is None:  # the README: "at most 6 images a pack here"
        assert report["images_per_row"]["max"] == int(readme_image_budget()["most_here"])
    # the check against PackedDataset: the same samples, and its numbers in one line
    checked = [line for line in out.splitlines() if line.startswith("PackedDataset")]
    assert len(checked) == 1 and checked[0].endswith(f"the same {report['samples']:,} samples")
    assert f"the knapsack above: {report['packs']:,} packs, {report['utilization']:.1%}" in out
    for name in ("05.png", "05_vs_03.png", "05_samples.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    import torch

    from mmdp.models.inputs import model_inputs

    saved = torch.load(batch)
    # what the docs' batch contract lists, but the batch's number (no one numbers them here)
    assert set(saved) == quoted_batch_keys("tiny") - {"batch_index"}
    inputs = model_inputs(saved)
    assert inputs["input_ids"].shape == (8, 512)
    # the four FlashAttention kwargs, as transformers takes them
    assert inputs["cu_seq_lens_q"].dtype == inputs["cu_seq_lens_k"].dtype == torch.int32
    assert inputs["cu_seq_lens_q"][-1] == 8 * 512
    assert (
        isinstance(inputs["max_length_q"], int) and inputs["max_length_q"] == inputs["max_length_k"]
    )


TORCHRUN_2 = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")


# a torchrun job of 3 processes, each importing torch: 90 s on a loaded 2-core machine. The default
# suite checks two ranks' step in one process (tests/test_ddp.py); equal batches per rank:
# tests/test_planner.py
@pytest.mark.slow
@pytest.mark.docs
def test_the_planned_loader_under_torchrun_two_ranks_two_workers(run_script, tmp_path):
    metrics, cache = tmp_path / "m.json", tmp_path / "fresh-cache"
    argv = ["examples/pack_planned.py", "--num-rows", "300", "--num-workers", "2",
            "--pretokenize", "--out-dir", str(tmp_path), "--metrics-json", str(metrics)]  # fmt: skip
    result = run_script(*TORCHRUN_2, *argv, python_args=True, env={"MMDP_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr[-3000:]
    check_output(
        "uv run torchrun --standalone --nproc_per_node 2 examples/pack_planned.py "
        "--metrics-json /tmp/05.json",
        argv,
        result.stdout,
        paths={**assets(tmp_path), str(metrics): "/tmp/05.json", str(cache): "~/.cache/mmdp"},
    )
    report = json.loads(metrics.read_text())
    # every rank yielded the same number of batches: no DDP hang at the end of the epoch
    yielded = report["batches_per_rank_yielded"]
    assert len(yielded) == 2 and yielded[0] == yielded[1] > 0
    assert report["rank_balance"]["batches_per_rank"] == yielded
    # no row twice, none lost: used + dropped (left-out remainder included) = rows read
    rows = report["sample_index"]
    assert len(rows) == len(set(rows)) == report["samples"]
    assert report["samples"] + sum(report["dropped"].values()) == report["rows_read"] == 300
    # pre-tokenized rows are weighed (and tokenized) once on this machine, by local rank 0 (the
    # tokens stay on the machine; plain weights are shared out: tests/test_weighing.py)
    assert report["weighing"]["rows_weighed_per_rank"] == [300, 0]


@pytest.mark.docs
def test_grouped_by_modality_length_pads_little_and_puts_the_heaviest_batch_first(
    run_main, tmp_path
):
    metrics = tmp_path / "m.json"
    argv = ["examples/group_by_length.py", "--num-rows", "300", "--num-workers", "1",
            "--out-dir", str(tmp_path), "--metrics-json", str(metrics)]  # fmt: skip
    status, out, err = run_main(*argv)
    assert status == 0, err
    check_output("uv run examples/group_by_length.py", argv, out, paths=assets(tmp_path))
    report = json.loads(metrics.read_text())
    assert report["samples"] + sum(report["dropped"].values()) == report["rows_read"] == 300
    waste = {name: 1 - r["utilization"] for name, r in report["comparison"].items()}
    assert waste["modality_length"] < 0.1 < 0.5 < waste["constrained"]
    assert 1 - report["utilization"] == pytest.approx(waste["modality_length"], abs=1e-6)
    padded = [max(step) for step in report["padded_tokens"]]  # as the loader gave them
    assert padded[0] == max(padded) and len(padded) == report["batches"]
    assert (tmp_path / "03_grouped.png").stat().st_size > 10_000
    assert "modality_length " in out and "naive " in out


@pytest.mark.slow  # two processes, each weighing and loading a whole epoch
@pytest.mark.docs
def test_grouped_under_torchrun_two_ranks(run_script, tmp_path):
    metrics = tmp_path / "m.json"
    argv = ["examples/group_by_length.py", "--num-rows", "300", "--num-workers", "1",
            "--out-dir", str(tmp_path), "--metrics-json", str(metrics)]  # fmt: skip
    result = run_script(*TORCHRUN_2, *argv, python_args=True)
    assert result.returncode == 0, result.stderr[-3000:]
    check_output(
        "uv run torchrun --standalone --nproc_per_node 2 examples/group_by_length.py",
        argv,
        result.stdout,
        paths=assets(tmp_path),
    )
    report = json.loads(metrics.read_text())
    # every rank yielded the same number of batches: no DDP hang at the end of the epoch
    yielded = report["batches_per_rank_yielded"]
    assert len(yielded) == 2 and yielded[0] == yielded[1] > 0
    assert report["rank_balance"]["batches_per_rank"] == yielded
    # disjoint and complete: every row in one rank's batches, or counted as dropped by reason
    rank_0, rank_1 = (set(rows) for rows in report["sample_index_per_rank"])
    assert not rank_0 & rank_1
    assert len(rank_0) + len(rank_1) == report["samples"]
    assert report["samples"] + sum(report["dropped"].values()) == 300
    assert set(report["dropped"]) <= {TOO_LONG, LEFT_OUT_TO_EQUALISE_RANKS}
    # the heaviest step first; ranks within a few tokens of each other at every step
    padded = [max(step) for step in report["padded_tokens"]]
    assert padded[0] == max(padded)
    assert report["rank_balance"]["token_spread_per_step"]["mean"] < 20


@pytest.mark.parametrize(
    ("script", "args", "says"),
    [
        ("01_check_dataset.py", ["--num-rows", "0"], "--num-rows: must be at least 1"),
        (
            "02_naive_pad_dataloader.py",
            ["--num-rows", "-5"],
            "--num-rows: must be at least 1",
        ),
        ("02_naive_pad_dataloader.py", ["--batch-size", "0"], "--batch-size: must be at least 1"),
        ("02_naive_pad_dataloader.py", ["--dataset", "/nonexistent/x.parquet"], "no such file"),
        ("03_constrained_pad_dataloader.py", ["--max-length", "10"], "nothing to do"),
        ("examples/group_by_length.py", ["--max-length", "10"], "nothing to do"),
        ("04_knapsack_toy.py", ["--max-length", "0"], "--max-length: must be at least 1"),
        ("04_knapsack_toy.py", ["--max-length", "10"], "raise --max-length to at least 24"),
        ("04_knapsack_toy.py", ["--start", "30"], "no items to pack"),
        ("05_knapsack_multimodal.py", ["--max-length", "10"], "nothing to do"),
        ("05_knapsack_multimodal.py", ["--num-workers", "-1"], "--num-workers: must be at least 0"),
        ("05_knapsack_multimodal.py", ["--seed", "x"], "--seed: must be a whole number"),
        ("05_knapsack_multimodal.py", ["--tokenizer", "./no/such/dir"], "no such directory"),
        ("06_packing_pays_off.py", ["--seeds", "0"], "--seeds: must be at least 1"),
        ("06_packing_pays_off.py", ["--lr", "0"], "--lr: must be above 0"),
        ("06_packing_pays_off.py", ["--eval-every", "-1"], "--eval-every: must be at least 1"),
        ("06_packing_pays_off.py", ["--max-length", "10"], "nothing to do"),
        ("06_packing_pays_off.py", ["--train-samples", "500"], "--train-samples 500: only"),
    ],
)
def test_impossible_settings_get_one_sentence_and_status_2(run_main, tmp_path, script, args, says):
    status, _, stderr = run_main(
        script,
        "--out-dir",
        str(tmp_path),
        *args,
        *(
            ["--num-rows", "40"]
            if "--num-rows" not in args and script != "04_knapsack_toy.py"
            else []
        ),
    )
    assert status == 2
    last = stderr.strip().splitlines()[-1]
    assert "error:" in last and says in last
    assert "Traceback" not in stderr


@pytest.mark.docs
def test_without_a_network_a_hub_dataset_is_the_sentence_the_docs_quote(run_main, monkeypatch):
    """No name resolves (a machine without a network): stage 2 ends in the one sentence
    docs/use-in-your-trainer.md quotes, word for word (tests/doc_blocks.py)."""

    def no_name_resolves(address, *args, **kwargs):
        raise socket.gaierror(-3, "Temporary failure in name resolution")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setattr(socket, "create_connection", no_name_resolves)
    argv = [
        "02_naive_pad_dataloader.py",
        "--dataset",
        "HuggingFaceM4/the_cauldron",
        "--subset",
        "ai2d",
    ]
    status, _, err = run_main(*argv)
    assert status == 2
    command = "uv run 02_naive_pad_dataloader.py --dataset HuggingFaceM4/the_cauldron --subset ai2d"
    assert check_output(command, argv, err) == "exact"


@pytest.mark.slow  # two processes, each loading and packing a whole epoch
def test_pack_mixture_under_torchrun_realises_the_asked_token_shares(run_script, tmp_path):
    metrics = tmp_path / "m.json"
    result = run_script(
        *TORCHRUN_2,
        "examples/pack_mixture.py",
        "--mixture",
        "examples/mixture.json",
        "--num-workers",
        "1",
        "--metrics-json",
        str(metrics),
        python_args=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sources = json.loads(metrics.read_text())["mixture"]["sources"]
    assert [s["source"] for s in sources] == ["describe", "charts", "multiturn"]
    for source in sources:
        assert abs(source["realised_share"] - source["asked_share"]) < 0.01
        for share in source["realised_share_per_rank"]:
            assert abs(share - source["asked_share"]) < 0.01
    assert "The mixture (tokens):" in result.stdout


def test_pack_mixture_prints_and_writes_every_sources_share(run_main, tmp_path):
    """A small run of examples/pack_mixture.py (the README's is 2,000 rows, -m slow): a line per
    source, the same under "mixture" in --metrics-json, and the batch's loss weights."""
    metrics = tmp_path / "m.json"
    argv = ["examples/pack_mixture.py", "--mixture", "examples/mixture.json", "--num-rows", "120",
            "--num-workers", "0", "--metrics-json", str(metrics)]  # fmt: skip
    status, out, err = run_main(*argv)
    assert status == 0, err
    assert "loss_weights" in out and "The mixture (tokens):" in out
    report = json.loads(metrics.read_text())
    assert [s["source"] for s in report["mixture"]["sources"]] == [
        "describe",
        "charts",
        "multiturn",
    ]
    assert report["samples"] + sum(report["dropped"].values()) == report["rows_read"]
    assert set(report["weighing"]) == {"seconds", "rows_weighed_per_rank"}


# The README's runs of stages 2, 3, examples/group_by_length.py and examples/pack_mixture.py at
# their full 2,000 rows, in the README's order (the grouped run weighs the rows that stage 5 then
# loads), each output held exactly to the README's block: the default suite holds smaller runs to
# the same blocks as templates (above). About 15 s of CPU each (stage 5's own run:
# test_stage5_default_run_packs_at_least_98_percent).
@pytest.mark.slow
@pytest.mark.docs
@pytest.mark.parametrize(
    "command",
    [
        "uv run 02_naive_pad_dataloader.py",
        "uv run 03_constrained_pad_dataloader.py",
        "uv run examples/group_by_length.py",
        "uv run examples/pack_mixture.py --mixture examples/mixture.json",
    ],
)
def test_the_readmes_runs_print_what_it_quotes(run_main, tmp_path, command):
    mixture = "--mixture" in command
    batch = tmp_path / "batch.pt"
    argv = [*command.split()[2:]]
    argv += ["--save-batch", str(batch)] if mixture else ["--out-dir", str(tmp_path)]
    status, out, err = run_main(*argv)
    assert status == 0, err
    assert check_output(command, argv, out, paths=assets(tmp_path)) == "exact"
    if mixture:  # the contract's keys, and a mixture's loss weights
        import torch

        assert set(torch.load(batch)) == quoted_batch_keys("tiny") | {"loss_weights"}
