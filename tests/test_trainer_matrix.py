"""Every model family through every way of training, exact: the trainer matrix (issue 25).

Families: mmdp's TinyVLM, a tiny random model of each real transformers class (Qwen2.5-VL,
Qwen3-VL, SmolVLM, LLaVA-OneVision, Gemma 3) and of Qwen3VLMoeForConditionalGeneration (the
class of Qwen3-VL-30B-A3B). Paths: MMDPTrainer, the accelerate recipe, torchrun DDP and FSDP2
(examples/*.py's own functions), and the loop of your own in docs/use-in-your-trainer.md.

Fast:
- each family's model, called exactly as transformers' Trainer calls it (top-level
  `config.use_cache = False`, transformers/trainer.py:646, then `model(**inputs)`), gives every
  sample of a packed batch the loss it gets alone; without model_inputs' `use_cache=False` the
  Qwen families build a cache and mix the samples (their text model reads
  `text_config.use_cache`);
- one family per path, in this process (1 process x 2 micro-batches): the step's gradient is the
  unpacked reference's, every parameter within 1e-5, and each micro-batch's own mean is not.

Slow (`uv run pytest -m slow tests/test_trainer_matrix.py -s`): every family on every path under
torchrun, 2 ranks x 2 micro-batches (the negative control on 7 of the 35 pairs: every family once, every
path at least once, torchrun_matrix.CONTROLS), one launch for all five paths (tests/torchrun_matrix.py,
launched with test_trainers.py's checks by tests/torchrun_trainers.py), one test per path reading
its numbers from that launch; it prints the table of docs/use-in-your-trainer.md ("Proven: every family on every path").
"""

import copy
import json

import pytest
import torch
from torchrun_matrix import (
    CONTROLS,
    FAMILIES,
    PATHS,
    TOLERANCE,
    alone_inputs,
    family_case,
    make_loader,
    measure,
)

from mmdp.batch import sample_ids
from mmdp.training.loss import summed_loss, token_losses

# A family per path in the fast suite, each path another family (the slow matrix runs them all).
FAST = {
    "trainer": "qwen2_5_vl",
    "accelerate": "smolvlm",
    "ddp": "llava_onevision",
    "fsdp2": "gemma3",
    "own_loop": "qwen3_vl_moe",
}
CONTROL_OFF_BY = 1e-4  # a negative control must miss the reference by more than this


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# 1. Called as Trainer calls it ------------------------------------------------------------------


def packed_sample_losses(model, batch: dict, inputs: dict) -> list[float]:
    """Each sample's summed loss inside the packed batch."""
    with torch.no_grad():
        losses = token_losses(model(**inputs).logits, batch["labels"])
    # a position's loss belongs to the sample of the label it predicts (the next position)
    owner = torch.nn.functional.pad(sample_ids(batch)[:, 1:], (0, 1), value=-1)
    return [float(losses[owner == i].sum()) for i in owner.unique().tolist() if i >= 0]


def alone_sample_losses(case, model, batch: dict) -> list[float]:
    with torch.no_grad():
        return [
            float(summed_loss(model(**alone_inputs(case, s)).logits, s["labels"][None]))
            for s in (case.samples[row] for row in batch["sample_index"].tolist())
        ]


def worst_relative_error(packed: list[float], alone: list[float]) -> float:
    assert len(packed) == len(alone)
    return max(abs(p - a) / a for p, a in zip(packed, alone))


QWEN = ("qwen2_5_vl", "qwen3_vl")


@pytest.mark.parametrize("family", ["tiny", *QWEN, "smolvlm", "llava_onevision", "gemma3"])
def test_called_as_trainer_calls_it_each_sample_sees_only_itself(family):
    case = family_case(family)  # sdpa: the tiny models' default
    model = copy.deepcopy(case.model)
    if hasattr(model, "config"):
        model.config.use_cache = False  # all Trainer does about the cache (trainer.py:646)
    batch = next(iter(make_loader(case, rank=0, world_size=1)))
    assert batch["samples_per_pack"].min() >= 2  # packed: every row holds several samples
    alone = alone_sample_losses(case, model, batch)

    inputs = case.inputs(batch, model)
    assert inputs["use_cache"] is False
    assert worst_relative_error(packed_sample_losses(model, batch, inputs), alone) < 1e-5

    # negative control: the same call with the cache on (model_inputs without use_cache)
    cache_on = {key: value for key, value in inputs.items() if key != "use_cache"}
    worst = worst_relative_error(packed_sample_losses(model, batch, cache_on), alone)
    print(f"{family}: the cache on, Trainer's top-level use_cache=False: worst {worst:.1e}")
    if family in QWEN:
        assert worst > CONTROL_OFF_BY  # text_config.use_cache is still True: samples mix
    else:
        assert worst < 1e-5  # these read the top-level flag Trainer sets (TinyVLM has no cache)


# 2. The matrix: one family per path here, every family on every path under torchrun -------------


@pytest.fixture
def process_group(tmp_path):
    """A gloo process group of this one process, for DDP and FSDP2."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def check(path: str, family: str, result: dict) -> None:
    control = "not run" if result["control"] is None else f"{result['control']:.1e}"
    print(
        f"{path} x {family}: gradient vs unpacked {result['exact']:.1e} (vision tower "
        f"{result['exact_vision']:.1e}), per-micro-batch mean {control}"
    )
    assert result["exact"] <= TOLERANCE, (path, family)
    assert result["exact_vision"] <= TOLERANCE and result["vision_params"] > 0, (path, family)
    if result["control"] is not None:
        assert result["control"] > CONTROL_OFF_BY, (path, family)


@pytest.mark.parametrize("path", ["trainer", "accelerate", "own_loop"])
def test_one_process_step_is_the_unpacked_gradient(path, tmp_path):
    check(path, FAST[path], measure(path, FAST[path], grad_accum=2, out=str(tmp_path)))


@pytest.mark.parametrize("path", ["ddp", "fsdp2"])
def test_one_process_step_under_ddp_and_fsdp2_is_the_unpacked_gradient(
    path, tmp_path, process_group
):
    check(path, FAST[path], measure(path, FAST[path], grad_accum=2, out=str(tmp_path)))


@pytest.fixture(scope="module")
def every_path_measured(trainers_under_torchrun) -> dict:
    """{path: {family: result}} from tests/torchrun_trainers.py's launch (conftest.py), which
    runs tests/torchrun_matrix.py's every path on every family."""
    with open(trainers_under_torchrun / "matrix" / "results.json") as f:
        return json.load(f)


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_every_family_on_every_path_under_torchrun(path, every_path_measured):
    results = every_path_measured[path]
    assert list(results) == list(FAMILIES)
    for family, result in results.items():
        assert "error" not in result, (path, family, result.get("error"))
        assert result["micro_batches"] == 4  # 2 ranks x 2
        assert (result["control"] is not None) == ((path, family) in CONTROLS), (path, family)
        check(path, family, result)


def test_the_torchrun_controls_cover_every_path_and_every_family():
    """The slow matrix's negative controls (torchrun_matrix.CONTROLS): every path shows on some
    family, and every family on some path, that a per-micro-batch mean misses the reference."""
    assert {path for path, _ in CONTROLS} == set(PATHS)
    assert [family for _, family in CONTROLS] == list(FAMILIES)
