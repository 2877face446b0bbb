"""model_inputs asks the family that collated a batch what its model takes: its vision inputs
(`vision_keys`), its per-token inputs (`token_keys`) and, for Gemma 3, the attention masks mmdp
builds (`packed_mask`). The batch carries the family's name (`model_family`), which model_inputs
looks up (mmdp.data.families.family_named): plain data, so a saved batch loads with
torch.load(weights_only=True). Every registered family must answer, and its answers must match the batches it
collates."""

import functools
import importlib
import pickle
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import concatenate, send_to_device
from PIL import Image
from transformers import Trainer

from mmdp.batch import TOKEN_INPUTS, build_pack, collate_packs
from mmdp.data.families import (
    FAMILIES,
    NAMED,
    OFFLINE,
    family_class,
    family_for,
    family_named,
    tiny_processor,
)
from mmdp.data.families.base import VISION_INPUTS
from mmdp.data.families.tiny import TinyFamily
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.synthetic.rows import encode_png
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataset
from mmdp.loading.streaming import StreamingPackedDataset
from mmdp.models.inputs import PACKED_MASKS, model_inputs
from mmdp.packing.packing_config import PackingConfig, default_config

REGISTERED = sorted(
    {family_class(where) for where in (*FAMILIES.values(), *OFFLINE.values())} | {TinyFamily},
    key=lambda family: family.name,
)


def packed_batch(family) -> dict:
    """One pack of an image sample and a text-only one, collated by `family`."""
    image = {"bytes": encode_png(Image.new("RGB", (64, 48), (200, 30, 30))), "path": None}
    rows = [
        {"images": [image], "texts": [{"user": "What is this?", "assistant": "A red box."}]},
        {"images": [], "texts": [{"user": "2 + 2?", "assistant": "4."}]},
    ]
    samples = [family.make_sample(row, i) for i, row in enumerate(rows)]
    lengths = [len(s["input_ids"]) for s in samples]
    pack = build_pack(
        samples, lengths, max_length=sum(lengths), pad_token_id=family.pad_token_id, batch_index=0
    )
    return collate_packs([pack], family)


@pytest.mark.parametrize("family", REGISTERED, ids=lambda family: family.name)
def test_every_registered_familys_mask_is_built(family):
    assert family.packed_mask is None or family.packed_mask in PACKED_MASKS


@pytest.mark.parametrize(
    "family", [f for f in REGISTERED if f is not TinyFamily], ids=lambda f: f.name
)
def test_every_real_family_has_a_tiny_model_builder(family):
    """TinyVLM is built by mmdp.models.tiny_vlm; every other family by the module of
    mmdp.models.tiny named as its own (mmdp.models.tiny.tiny_model finds it so)."""
    module = family.__module__.replace("mmdp.data.families.", "mmdp.models.tiny.")
    assert hasattr(importlib.import_module(module), "tiny_model")


def test_the_inputs_a_batch_may_carry_are_the_families_keys():
    assert set(VISION_INPUTS) == {key for family in REGISTERED for key in family.vision_keys}
    assert set(TOKEN_INPUTS) == {key for family in REGISTERED for key in family.token_keys}


def test_the_family_a_batch_carries_reaches_model_inputs_through_loaders_and_trainers():
    """The batch carries its family's name, and it arrives as it left: through a DataLoader
    worker, accelerate's send_to_device (accelerate 1.15: a value
    without `.to` is returned as it is), accelerate's concatenate of one batch (returned as it is;
    of several it refuses any non-tensor, a name as well: mmdp's loaders refuse
    accelerator.prepare, mmdp.loading.guards) and transformers' Trainer._prepare_input
    (transformers 5.23: a value neither a mapping, a sequence nor a tensor is returned as it is)."""
    family = family_for(tiny_processor("qwen2_5_vl"))
    batch = packed_batch(family)
    assert batch["model_family"] == family.name
    worker = torch.utils.data.DataLoader([batch], batch_size=None, num_workers=1)
    (from_worker,) = list(worker)
    trainer = SimpleNamespace(args=SimpleNamespace(device="cpu"), is_deepspeed_enabled=False)
    trainer._prepare_input = functools.partial(Trainer._prepare_input, trainer)
    for arrived in (
        from_worker,
        send_to_device(batch, "cpu"),
        concatenate([batch]),
        trainer._prepare_input(batch),
    ):
        assert arrived["model_family"] == family.name
        assert model_inputs(arrived).keys() == model_inputs(batch).keys()


@pytest.mark.parametrize("name", OFFLINE)
def test_a_familys_batch_carries_its_vision_keys_and_the_model_gets_them(name, monkeypatch):
    """The keys collate_vision makes are the ones the family declares, and model_inputs passes
    exactly those; only a family that declares a packed_mask gets mmdp's attention_mask."""
    built = []
    for name in PACKED_MASKS:
        monkeypatch.setitem(PACKED_MASKS, name, lambda batch, model: built.append(1) or {})
    monkeypatch.setattr(family_named("qwen3_5"), "linear_attention", False)  # keys, no model
    family = family_for(tiny_processor(name))
    batch = packed_batch(family)
    assert batch["model_family"] == family.name
    carried = {key for key in batch if key in VISION_INPUTS}
    assert carried == set(family.vision_keys)
    passed = model_inputs(batch)
    assert {key for key in passed if key in VISION_INPUTS} == carried
    assert {key for key in passed if key in TOKEN_INPUTS} == set(family.token_keys)
    assert ("attention_mask" in passed) == (family.packed_mask is not None) == bool(built)


def test_the_dispatch_follows_the_declaration_not_the_name(monkeypatch):
    """Negative control: a Qwen2.5-VL family class that declared Gemma 3's mask would get it; so
    model_inputs reads the family's declaration, and a family without one gets no mask."""
    family = family_for(tiny_processor("qwen2_5_vl"))
    batch = packed_batch(family)
    assert "attention_mask" not in model_inputs(batch)
    monkeypatch.setattr(type(family), "packed_mask", "gemma3")
    monkeypatch.setitem(PACKED_MASKS, "gemma3", lambda batch, model: "built")
    assert model_inputs(batch)["attention_mask"] == "built"


def test_without_a_config_a_loader_packs_under_its_familys_budgets(tokenizer):
    """docs/real-vlms.md's `PackedDataset(VQADataset(rows, processor))  # the family's budgets`:
    default_config(family) is the one place a family's budgets are resolved, and both loaders
    take it when no config is given (before, a real family got PackingConfig()'s 512 tokens and
    no patch budget, and most real Qwen rows were dropped as too long)."""
    rows = load_vqa_dataset(None, num_rows=4)
    processor = tiny_processor("qwen2_5_vl")
    qwen = PackedDataset(VQADataset(rows, processor), rank=0, world_size=1)
    assert (qwen.max_length, qwen.max_patches) == (2048, 8192)  # Qwen-VL's, not 512 and none
    assert qwen.config == default_config(family_for(processor))
    stream = StreamingPackedDataset(rows.to_iterable_dataset(), processor, rank=0, world_size=1)
    assert stream.config == qwen.config
    # TinyVLM's family keeps PackingConfig()'s; settings given (not None) override the family's
    tiny = PackedDataset(VQADataset(rows, tokenizer), rank=0, world_size=1)
    assert tiny.config == PackingConfig() == default_config(tiny.dataset.family)
    given = default_config(qwen.dataset.family, max_length=4096, max_patches=None, seed=5)
    assert (given.max_length, given.max_patches, given.seed) == (4096, 8192, 5)


@pytest.mark.parametrize("name", NAMED)
def test_a_saved_batch_of_every_family_loads_with_weights_only(name, tmp_path, monkeypatch):
    """--save-batch writes torch.save(batch); torch.load's default (weights_only=True) reads
    tensors and plain values only. The family travels by name, so the batch loads and
    model_inputs finds its family again. The trap, shown: the same batch carrying the family's
    class (what mmdp saved before) is refused."""
    for mask in PACKED_MASKS:  # needs no model here
        monkeypatch.setitem(PACKED_MASKS, mask, lambda batch, model: {})
    monkeypatch.setattr(family_named("qwen3_5"), "linear_attention", False)  # nor here
    family = family_named(name)
    module = importlib.import_module(family.__module__)
    batch = packed_batch(
        family_for(getattr(module, "tiny_processor", module.offline_processor)(family))
    )
    torch.save(batch, tmp_path / "batch.pt")
    loaded = torch.load(tmp_path / "batch.pt", weights_only=True)
    assert loaded["model_family"] == name
    assert model_inputs(loaded).keys() == model_inputs(batch).keys()
    torch.save({**batch, "model_family": family}, tmp_path / "with_class.pt")
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        torch.load(tmp_path / "with_class.pt", weights_only=True)
