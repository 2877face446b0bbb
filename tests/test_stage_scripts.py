import json

import pytest

KEYS = {"samples", "dropped", "batches", "useful_tokens", "computed_tokens", "utilization"}


def test_stage1_saves_the_sample_figure(run_script, tmp_path):
    result = run_script("01_check_dataset.py", "--seed", "3", "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "01.png").stat().st_size > 10_000
    assert f"Saved the sample to {tmp_path / '01.png'}" in result.stdout


@pytest.mark.parametrize(
    ("script", "extra"),
    [
        ("02_naive_pad_dataloader.py", []),
        ("03_constrained_pad_dataloader.py", ["--max-length", "256"]),
    ],
)
def test_padding_stages_write_figure_and_consistent_metrics(run_script, tmp_path, script, extra):
    metrics = tmp_path / "m.json"
    result = run_script(
        script,
        "--num-samples",
        "96",
        "--batch-size",
        "8",
        "--out-dir",
        str(tmp_path),
        "--metrics-json",
        str(metrics),
        *extra,
    )
    assert result.returncode == 0, result.stderr
    figure = tmp_path / f"{script[:2]}.png"
    assert figure.stat().st_size > 10_000
    report = json.loads(metrics.read_text())
    assert KEYS <= set(report)
    assert report["samples"] + sum(report["dropped"].values()) == 96
    assert report["utilization"] == pytest.approx(
        report["useful_tokens"] / report["computed_tokens"], abs=1e-6
    )
    if script.startswith("03"):
        assert report["computed_tokens"] == report["batches"] * 8 * 256 - 256 * sum(
            report["dropped"].values()
        )
        assert report["dropped"].get("too_long", 0) > 0
    else:
        assert report["batches"] == 12 and report["dropped"] == {}
