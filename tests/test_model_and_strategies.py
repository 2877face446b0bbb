import json

import pytest
import torch
from torch.utils.data import DataLoader

from mmdp import config
from mmdp.collate import ConstrainedPadCollator, NaivePadCollator, real_token_mask
from mmdp.data import load_vqa_dataset
from mmdp.metrics import EpochReport
from mmdp.model import TinyVLM, TinyVLMConfig, summed_loss, vlm_inputs
from mmdp.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing import STRATEGIES
from mmdp.strategies import compare_strategies
from mmdp.vqa_dataset import VQADataset
from mmdp.weighing import weigh_rows


@pytest.fixture(scope="module")
def samples(tokenizer):
    return VQADataset(load_vqa_dataset(num_rows=64), tokenizer)


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    vlm_config = TinyVLMConfig(len(tokenizer), tokenizer.image_token_id, initializer_range=0.5)
    return TinyVLM(vlm_config).eval()


def test_packed_padded_and_alone_give_the_same_loss_with_images(samples, model, tokenizer):
    batch = next(iter(PackedDataLoader(PackedDataset(samples, packs_per_batch=3), num_workers=0)))
    rows = batch["sample_index"].tolist()
    assert len(batch["images"]) >= 2
    padded = NaivePadCollator(tokenizer.pad_token_id)([samples[r] for r in rows])
    with torch.no_grad():
        packed = summed_loss(model(**vlm_inputs(batch)).logits, batch["labels"])
        naive = summed_loss(model(**vlm_inputs(padded)).logits, padded["labels"])
        alone = 0.0
        for row in rows:
            s = samples[row]
            labels = s["labels"].clone()
            labels[0] = config.IGNORE_INDEX  # as in a pack: the first token has no label
            logits = model(input_ids=s["input_ids"][None], images=s["images"]).logits
            alone += summed_loss(logits, labels[None])
        # the same batch with every image moved onto another sample's image tokens
        wrong = summed_loss(
            model(**vlm_inputs({**batch, "images": batch["images"].roll(1, dims=0)})).logits,
            batch["labels"],
        )
    assert abs(packed - alone) / alone < 1e-5
    assert abs(naive - alone) / alone < 1e-5
    assert abs(wrong - alone) / alone > 1e-3


def test_image_count_must_match_the_image_tokens(samples, model):
    batch = next(iter(PackedDataLoader(PackedDataset(samples, packs_per_batch=2), num_workers=0)))
    with pytest.raises(ValueError, match="image tokens"):
        model(**vlm_inputs({**batch, "images": batch["images"][1:]}))


def loader_report(samples, collate):
    loader = DataLoader(
        samples, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0),
        collate_fn=collate,
    )  # fmt: skip
    report = EpochReport()
    for batch in loader:
        report.add_batch(batch)
    return report


def test_strategy_comparison_matches_the_stages_own_loaders(samples, tokenizer):
    weights = weigh_rows(samples.dataset, tokenizer).weights
    results = compare_strategies(weights, max_length=512, max_images=18, batch_size=8, seed=0)
    assert list(results) == ["naive", "constrained", *STRATEGIES]
    naive = loader_report(samples, NaivePadCollator(tokenizer.pad_token_id))
    constrained = loader_report(samples, ConstrainedPadCollator(tokenizer.pad_token_id, 512))
    for name, report in (("naive", naive), ("constrained", constrained)):
        assert results[name]["useful_tokens"] == report.useful_tokens
        assert results[name]["computed_tokens"] == report.computed_tokens
        assert results[name]["batches"] == report.batches
    packed = PackedDataset(samples, max_length=512, packs_per_batch=8)
    batches = list(PackedDataLoader(packed, num_workers=0))
    assert results["images_first_bfd"]["batches"] == len(batches)
    assert results["images_first_bfd"]["useful_tokens"] == sum(
        int(real_token_mask(b).sum()) for b in batches
    )
    assert results["greedy"]["utilization"] < results["binpack"]["utilization"]


def test_stage6_runs_and_reports(run_script, tmp_path):
    metrics = tmp_path / "m.json"
    result = run_script(
        "06_packing_pays_off.py", "--num-samples", "120", "--check-samples", "16",
        "--train-samples", "24", "--out-dir", str(tmp_path), "--metrics-json", str(metrics),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(metrics.read_text())
    assert set(report["loss"]) == {"naive", "constrained", "packed", "max_rel_diff"}
    assert report["loss"]["max_rel_diff"] < 1e-4
    assert report["wrong_image_mapping_rel_diff"] > 1e-4  # the wrong mapping fails the check
    for name in ("naive", "constrained", "packed"):
        speed = report["speed"][name]
        assert {
            "useful_tokens",
            "computed_tokens",
            "seconds",
            "useful_tokens_per_s",
            "steps",
        } <= set(speed)
        assert speed["useful_tokens"] <= speed["computed_tokens"]
    assert report["device"] == "cpu"
    for name in ("06.png", "strategies.png"):
        assert (tmp_path / name).stat().st_size > 10_000
