import ast
import importlib
import json
import math

import pytest
import torch
from conftest import REPO
from torch.utils.data import DataLoader

from mmdp import config
from mmdp.batch import collate_packs, layout_pack, real_token_mask, sample_ids
from mmdp.data.padding import ConstrainedPadCollator, NaivePadCollator
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.models.tiny_vlm import TinyVLM, TinyVLMConfig, vlm_inputs
from mmdp.packing.packers import STRATEGIES
from mmdp.packing.packing_config import PackingConfig
from mmdp.report.metrics import EpochReport
from mmdp.training.loop import PARTS, median_time_per_part, speed_of_run
from mmdp.training.loss import (
    mean_over_samples,
    mean_over_tokens,
    summed_loss,
    summed_sample_means,
)
from mmdp.training.strategies import compare_strategies
from mmdp.weighing.weigh import weigh_rows


@pytest.fixture(scope="module")
def samples(tokenizer):
    return VQADataset(load_vqa_dataset(num_rows=64), tokenizer)


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    vlm_config = TinyVLMConfig(len(tokenizer), tokenizer.image_token_id, initializer_range=0.5)
    return TinyVLM(vlm_config).eval()


@pytest.fixture(scope="module")
def three_packs(samples, model, tokenizer) -> dict:
    """A batch of 3 packs and the same samples naively padded, with the model's outputs on each
    (computed once: the logits over the 49k-token vocabulary are most of these tests' time)."""
    loader = PackedDataLoader(
        PackedDataset(samples, config=PackingConfig(packs_per_batch=3)), num_workers=0
    )
    batch = next(iter(loader))
    padded = NaivePadCollator(tokenizer.pad_token_id)(
        [samples[r] for r in batch["sample_index"].tolist()]
    )
    with torch.no_grad():
        return {
            "batch": batch,
            "padded": padded,
            "packed_logits": model(**vlm_inputs(batch)).logits,
            "padded_output": model(**vlm_inputs(padded)),
        }


def test_packed_padded_and_alone_give_the_same_loss_with_images(three_packs, samples, model):
    batch, padded = three_packs["batch"], three_packs["padded"]
    rows = batch["sample_index"].tolist()
    assert len(batch["pixel_values"]) >= 2
    with torch.no_grad():
        packed = summed_loss(three_packs["packed_logits"], batch["labels"])
        naive = summed_loss(three_packs["padded_output"].logits, padded["labels"])
        alone = 0.0
        for row in rows:
            s = samples[row]
            labels = s["labels"].clone()
            labels[0] = config.IGNORE_INDEX  # as in a pack: the first token has no label
            logits = model(input_ids=s["input_ids"][None], pixel_values=s["pixel_values"]).logits
            alone += summed_loss(logits, labels[None])
        # the same batch with every image moved onto another sample's image tokens
        wrong = summed_loss(
            model(
                **vlm_inputs({**batch, "pixel_values": batch["pixel_values"].roll(1, dims=0)})
            ).logits,
            batch["labels"],
        )
    assert abs(packed - alone) / alone < 1e-5
    assert abs(naive - alone) / alone < 1e-5
    assert abs(wrong - alone) / alone > 1e-3


def test_image_count_must_match_the_image_tokens(samples, model):
    loader = PackedDataLoader(
        PackedDataset(samples, config=PackingConfig(packs_per_batch=2)), num_workers=0
    )
    batch = next(iter(loader))
    with pytest.raises(ValueError, match="image tokens"):
        model(**vlm_inputs({**batch, "pixel_values": batch["pixel_values"][1:]}))


def test_both_reductions_are_the_same_for_padded_and_packed_batches(three_packs):
    batch, padded = three_packs["batch"], three_packs["padded"]
    rows = batch["sample_index"].tolist()
    assert (batch["samples_per_pack"] > 1).all()
    packed_logits = three_packs["packed_logits"]
    padded_logits = three_packs["padded_output"].logits
    # mean over label tokens: transformers' own loss
    packed = mean_over_tokens(packed_logits, batch["labels"])
    assert abs(packed - three_packs["padded_output"].loss) / packed < 1e-5
    assert abs(packed - mean_over_tokens(padded_logits, padded["labels"])) / packed < 1e-5
    # mean over samples: one value per sample, found per segment in the packed batch
    packed = mean_over_samples(packed_logits, batch)
    assert abs(packed - mean_over_samples(padded_logits, padded)) / packed < 1e-5
    assert summed_sample_means(packed_logits, batch)[1] == len(rows)
    # taking each pack's row as one sample (without its segments) weighs samples unequally
    rows_as_samples = {k: v for k, v in batch.items() if not k.startswith("cu_seq_lens")}
    assert abs(mean_over_samples(packed_logits, rows_as_samples) - packed) / packed > 1e-3


def test_packed_and_padded_batches_of_the_same_samples_give_the_same_gradient(samples, tokenizer):
    """What one training step learns does not depend on the layout: same samples, same gradient."""
    loader = PackedDataLoader(
        PackedDataset(samples, config=PackingConfig(packs_per_batch=2)), num_workers=0
    )
    batch = next(iter(loader))
    padded = NaivePadCollator(tokenizer.pad_token_id)(
        [samples[r] for r in batch["sample_index"].tolist()]
    )
    gradients = []
    for layout in (batch, padded):
        torch.manual_seed(0)
        model = TinyVLM(TinyVLMConfig(len(tokenizer), tokenizer.image_token_id)).train()
        mean_over_tokens(model(**vlm_inputs(layout)).logits, layout["labels"]).backward()
        gradients.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    packed, naive = gradients
    assert (packed - naive).norm() / naive.norm() < 1e-5


def tiny_pack_and_padding() -> tuple[dict, dict, torch.Tensor, torch.Tensor]:
    """Samples A (3 tokens) and B (4 tokens) of a vocabulary of 4, packed in a row of 8 and padded
    in two rows of 4; logits that predict A's labels perfectly and know nothing about B's.

        pack     A A A B B B B .      labels  - 1 2 - 3 0 1 -      (- = ignored)
        trained: positions 0, 1 (A's labels 1, 2) and 3, 4, 5 (B's labels 3, 0, 1)
    """
    ignored = config.IGNORE_INDEX
    a = {"row": 0, "input_ids": torch.tensor([0, 1, 2]), "labels": torch.tensor([ignored, 1, 2])}
    b = {
        "row": 1,
        "input_ids": torch.tensor([3, 3, 0, 1]),
        "labels": torch.tensor([ignored, 3, 0, 1]),
    }
    for s in (a, b):
        s.update(pixel_values=torch.zeros(0, 3, 8, 8), image_count=0, patches=0, converted={})
    pack = collate_packs([{**layout_pack([a, b], 8, 0), "batch_index": 0, "dropped": {}}])
    padded = NaivePadCollator(0)([{**a, "drop_reason": None}, {**b, "drop_reason": None}])
    packed_logits = torch.zeros(1, 8, 4)  # uniform: each of B's tokens costs log 4
    packed_logits[0, 0], packed_logits[0, 1] = certain(1, 4), certain(2, 4)  # A's: 0
    padded_logits = torch.zeros(2, 4, 4)
    padded_logits[0, :2] = packed_logits[0, :2]
    return pack, padded, packed_logits, padded_logits


def certain(label: int, vocab_size: int) -> torch.Tensor:
    """Logits that put all the probability on `label`: its loss is 0."""
    return torch.full((vocab_size,), -1e4).index_fill(0, torch.tensor([label]), 0.0)


def test_sample_ids_and_both_means_by_hand():
    pack, padded, packed_logits, padded_logits = tiny_pack_and_padding()
    assert sample_ids(pack).tolist() == [[0, 0, 0, 1, 1, 1, 1, -1]]
    assert sample_ids(padded).tolist() == [[0, 0, 0, -1], [1, 1, 1, 1]]
    log4 = math.log(4)
    for batch, logits in ((pack, packed_logits), (padded, padded_logits)):
        # tokens: A's 2 cost 0, B's 3 cost log 4; samples: A's mean 0, B's mean log 4
        assert mean_over_tokens(logits, batch["labels"]).item() == pytest.approx(3 * log4 / 5)
        assert mean_over_samples(logits, batch).item() == pytest.approx(log4 / 2)


def loader_report(samples, collate):
    loader = DataLoader(
        samples,
        batch_size=8,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        collate_fn=collate,
    )
    report = EpochReport()
    for batch in loader:
        report.add_batch(batch)
    return report


def test_strategy_comparison_matches_the_stages_own_loaders(samples, tokenizer):
    weights = weigh_rows(samples.dataset, tokenizer).weights
    results = compare_strategies(
        weights, max_length=512, max_images=18, batch_size=8, packs_per_batch=8, seed=0
    )
    assert list(results) == ["naive", "constrained", *STRATEGIES]
    naive = loader_report(samples, NaivePadCollator(tokenizer.pad_token_id))
    constrained = loader_report(samples, ConstrainedPadCollator(tokenizer.pad_token_id, 512))
    for name, report in (("naive", naive), ("constrained", constrained)):
        assert results[name]["real_tokens"] == report.real_tokens
        assert results[name]["computed_tokens"] == report.computed_tokens
        assert results[name]["batches"] == report.batches
    packed = PackedDataset(samples, config=PackingConfig(max_length=512, packs_per_batch=8))
    batches = list(PackedDataLoader(packed, num_workers=0))
    assert results["images_first_bfd"]["batches"] == len(batches)
    assert results["images_first_bfd"]["real_tokens"] == sum(
        int(real_token_mask(b).sum()) for b in batches
    )
    assert results["greedy"]["utilization"] < results["binpack"]["utilization"]


def fake_log(seconds: dict, real_tokens: list[int], computed_tokens: list[int]) -> dict:
    """A training log (mmdp.training.loop.train_in_turns) with only what speed needs; unnamed parts 0 s."""
    steps = len(real_tokens)
    return {
        "loss": [0.0] * steps,
        "real_tokens": real_tokens,
        "computed_tokens": computed_tokens,
        "seconds": {part: seconds.get(part, [0.0] * steps) for part in PARTS},
    }


def test_speed_of_a_run_leaves_out_its_first_step_unless_it_is_the_only_one():
    # steps take 5 + 1 = 6 s, 1 + 1 = 2 s and 3 + 1 = 4 s; the first is not timed
    three_steps = fake_log(
        {"logits + loss": [5.0, 1.0, 3.0], "optimizer": [1.0, 1.0, 1.0]},
        real_tokens=[100, 30, 60],
        computed_tokens=[128, 64, 64],
    )
    assert speed_of_run(three_steps) == {
        "real_tokens": 30 + 60,
        "computed_tokens": 64 + 64,
        "seconds": 2.0 + 4.0,
        "steps": 3,
        "real_tokens_per_s": 90 / 6,
        "seconds_per_step": 3.0,  # the median of 2 and 4
    }
    one_step = fake_log({"optimizer": [2.0]}, real_tokens=[50], computed_tokens=[64])
    assert speed_of_run(one_step) == {
        "real_tokens": 50,
        "computed_tokens": 64,
        "seconds": 2.0,
        "steps": 1,
        "real_tokens_per_s": 25.0,
        "seconds_per_step": 2.0,
    }
    # per part: the timed steps of each run summed, then the median over the two runs
    per_part = median_time_per_part([three_steps, one_step])
    assert per_part["logits + loss"] == (1.0 + 3.0 + 0.0) / 2
    assert per_part["optimizer"] == 2.0  # 1 + 1 and 2
    assert per_part["language model"] == 0.0


# the faces: names that keep working when files move (mmdp/_lazy.py); and stage 6's own modules,
# off the face: its experiments, and the DDP step it launches
FACES = {"mmdp", "mmdp.flags", "mmdp.report", "mmdp.errors"}
STAGE6 = {"mmdp.training.experiments", "mmdp.training.ddp"}


def test_stage6_takes_mmdps_names_from_the_faces_and_its_own_modules():
    tree = ast.parse((REPO / "06_packing_pays_off.py").read_text())
    imported = {
        node.module: [alias.name for alias in node.names]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == "mmdp"
    }
    assert set(imported) <= FACES | STAGE6, sorted(imported)
    for module, names in imported.items():
        face = importlib.import_module(module)
        for name in names:  # each name is in its module (or a module of it: mmdp.config)
            assert hasattr(face, name) or importlib.util.find_spec(f"{module}.{name}"), name


@pytest.mark.slow  # 2.5 min of CPU (training 3 strategies x 2 seeds over a 49k-token vocabulary)
def test_stage6_runs_and_reports(run_main, tmp_path):
    import datasets

    metrics = tmp_path / "m.json"
    status, out, err = run_main(
        "06_packing_pays_off.py",
        "--num-rows",
        "120",
        "--check-samples",
        "8",  # the loss check on 8 samples, not 16: an eighth of the run less
        "--seeds",
        "2",
        "--train-samples",
        "16",
        "--eval-every",
        "8",
        "--eval-samples",
        "8",
        "--max-length",
        "256",  # packs and constrained rows of 256 tokens, not 512: two thirds of the time
        "--skip-ddp",
        "--attn-implementation",
        "flash_attention_2",
        "--out-dir",
        str(tmp_path),
        "--metrics-json",
        str(metrics),
    )  # in this process: 2.5 min of CPU; 6 min on 2 cores shared at a load average of 6
    datasets.enable_progress_bars()  # the script turns them off for the rest of the process
    assert status == 0, err[-3000:]
    # only the lines it means to print: no empty line, no progress bar; and the rows it weighs
    # again (held out, trained on) are weighed without datasets' bars on stderr either
    assert all(line.strip() for line in out.splitlines())
    assert "%|" not in out and "\r" not in out
    assert "Flattening the indices" not in err
    # no GPU: FlashAttention's routing in transformers, with mmdp's reference kernels
    assert "reference kernels, correctness only, not speed" in out
    report = json.loads(metrics.read_text())
    assert report["loss"]["attn_implementation"] == "flash_attention_2"
    names = ("naive", "constrained", "images_first_bfd")  # the packed run is named by its packer
    loss = report["loss"]
    assert {*names, "max_rel_diff"} <= set(loss)
    for reduction in (loss, loss["mean_over_tokens"], loss["mean_over_samples"]):
        assert reduction["max_rel_diff"] < 1e-4
    assert loss["wrong_image_mapping_rel_diff"] > 1e-4  # the wrong mapping fails the check
    learning = report["learning"]
    assert learning["seeds"] == [0, 1] and learning["samples_seen"] == [0, 8, 16]
    assert set(learning["eval_loss"]) == set(names)
    for seed in range(2):
        # every strategy starts from the seed's initial weights, evaluated on the same samples
        assert len({learning["eval_loss"][name][seed][0] for name in names}) == 1
        for name in names:
            losses = learning["eval_loss"][name][seed]
            assert len(losses) == 3 and losses[-1] < losses[0]
    for name in names:
        speed = report["speed"][name]
        assert {
            "real_tokens",
            "computed_tokens",
            "seconds",
            "real_tokens_per_s",
            "steps",
        } <= set(speed)
        assert speed["real_tokens"] <= speed["computed_tokens"]
        assert len(speed["per_seed"]["real_tokens_per_s"]) == 2
    assert set(report["time_per_part"]["naive"]) == set(PARTS)
    assert report["ddp"] == {
        "grad_rel_diff_global_tokens": None,
        "grad_rel_diff_per_rank_mean": None,
        "reason": "skipped (--skip-ddp)",
    }
    assert report["device"] == "cpu"
    for name in ("06.png", "strategies.png"):
        assert (tmp_path / name).stat().st_size > 10_000
