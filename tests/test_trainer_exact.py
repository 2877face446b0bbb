"""MMDPTrainer, exactly: every epoch of a planned loader whose epochs differ in length, the
checkpoint's loader state before Trainer rotates checkpoints, the refusals (DataParallel, eval),
a mixture's loss weights, Trainer's logs in samples and real tokens, the collectives' device and
bf16, and TRL's SFTTrainer (slow: `uv run pytest -m slow tests/test_trainer_exact.py`).

The epochs are simulated (6, 5 and 7 batches, gradient accumulation 2: the issue's case) by a
loader that behaves as PackedDataLoader (position, set_epoch, state_dict) around a tiny model,
called as Trainer calls it: `model(**inputs)`.
"""

import itertools
import math
import os
from types import SimpleNamespace

import pytest
import torch
import transformers.trainer as hf_trainer
from torch import nn
from transformers import TrainingArguments

from mmdp.training.loss import label_tokens, summed_loss, token_losses
from mmdp.training.recipes import (
    LOADER_STATE,
    load_loader_state,
    micro_batch_loss,
    mixed_precision,
    optimizer_steps,
    save_loader_state,
    step_label_tokens,
)
from mmdp.training.trainer import LoaderForTrainer, MMDPTrainer, check_arguments, token_loss

VOCAB, LENGTH = 11, 6


class TinyLM(nn.Module):
    """Embedding -> linear: enough for a gradient that depends on every token."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 8)
        self.out = nn.Linear(8, VOCAB)

    def forward(self, input_ids, **kwargs):
        return {"logits": self.out(self.embed(input_ids))}

    def get_output_embeddings(self):  # the loss over trained positions takes its input
        return self.out


def tiny_inputs(batch, model=None):
    return {"input_ids": batch["input_ids"], "labels": batch["labels"]}


class Plan:
    def __init__(self, batches, rows):
        self.batches, self.rows = batches, rows

    def num_steps(self):
        return self.batches


class EpochsDataset:
    """PackedDataset's bookkeeping for epochs of `counts` batches (one sample per batch: the
    row is epoch * 100 + batch)."""

    def __init__(self, counts, weights=None):
        self.counts, self.weights = counts, weights
        self.epoch, self.batches_done, self.world_size = 0, 0, 1

    def num_batches(self):
        return self.counts[self.epoch % len(self.counts)]

    def plan(self, epoch):
        count = self.counts[epoch % len(self.counts)]
        return Plan(count, list(range(epoch * 100, epoch * 100 + count)))

    def batch(self, epoch, index):
        g = torch.Generator().manual_seed(epoch * 100 + index)
        ids = torch.randint(VOCAB, (1, LENGTH), generator=g)
        labels = ids.clone()
        labels[0, 0] = -100
        batch = {
            "input_ids": ids,
            "labels": labels,
            "sample_index": torch.tensor([epoch * 100 + index]),
            "samples_per_pack": torch.tensor([1]),
            "real_token_mask": torch.ones(1, LENGTH, dtype=torch.bool),
            "batch_index": index,
        }
        if self.weights is not None:
            batch["loss_weights"] = torch.full((1, LENGTH), self.weights[index % 2])
        return batch


class EpochsLoader:
    """PackedDataLoader's behaviour: len() is the current epoch's, set_epoch keeps the position
    in the same epoch, state_dict / load_state_dict resume it."""

    def __init__(self, counts, weights=None):
        self.dataset = EpochsDataset(counts, weights)

    def __len__(self):
        return self.dataset.num_batches()

    def __iter__(self):
        d = self.dataset
        for index in range(d.batches_done, d.num_batches()):
            d.batches_done = index + 1
            yield d.batch(d.epoch, index)
        d.batches_done = 0

    def set_epoch(self, epoch):
        if epoch != self.dataset.epoch:
            self.dataset.epoch, self.dataset.batches_done = epoch, 0

    def state_dict(self):
        return {"epoch": self.dataset.epoch, "batches_done": self.dataset.batches_done}

    def load_state_dict(self, state):
        self.dataset.epoch, self.dataset.batches_done = state["epoch"], state["batches_done"]


class Recorded(MMDPTrainer):
    """MMDPTrainer that records each micro-batch's rows under the optimizer step it trains in."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.seen.append((self.state.global_step + 1, inputs["sample_index"].tolist()))
        return super().training_step(model, inputs, num_items_in_batch)


def training_args(out, **kwargs) -> TrainingArguments:
    settings = dict(
        output_dir=str(out), gradient_accumulation_steps=2, learning_rate=0.1,
        lr_scheduler_type="constant", save_strategy="no", use_cpu=True, report_to="none",
        disable_tqdm=True, seed=0,
    )  # fmt: skip
    return TrainingArguments(**{**settings, **kwargs})


def train(out, counts=(6, 5, 7), trainer_class=Recorded, resume=None, stop_at=None, **kwargs):
    trainer = trainer_class(
        model=TinyLM(),
        args=training_args(out, **kwargs),
        train_loader=EpochsLoader(list(counts)),
        model_inputs=tiny_inputs,
    )
    trainer.seen = []
    if stop_at is not None:
        trainer.add_callback(StopAt(stop_at))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


class StopAt(hf_trainer.TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def epoch_of(row: int) -> int:
    return row // 100


# 4. Every epoch, exactly ------------------------------------------------------------------------


THREE_EPOCHS = dict(
    num_train_epochs=3, optim="sgd", max_grad_norm=0.0, per_device_train_batch_size=4,
    include_num_input_tokens_seen="non_padding",
)  # fmt: skip


@pytest.fixture(scope="module")
def three_epochs(tmp_path_factory):
    """One uninterrupted run of 3 epochs (6, 5, 7 batches, grad-accum 2, SGD), shared."""
    return train(tmp_path_factory.mktemp("three_epochs"), **THREE_EPOCHS)


def test_every_epoch_of_different_lengths_is_trained_once_in_whole_steps(three_epochs):
    trainer = three_epochs
    # epochs of 6, 5 and 7 batches with grad-accum 2: 3 + 3 + 4 optimizer steps
    assert trainer.args.max_steps == 10
    assert trainer.state.global_step == 10
    assert trainer.state.epoch == 3.0  # the loader's epochs, not the fraction of one pass
    steps = {}
    for step, rows in trainer.seen:
        steps.setdefault(step, []).append(rows)
    assert sorted(steps) == list(range(1, 11))
    for step, micro_batches in steps.items():
        assert len(micro_batches) == 2  # Trainer's step: grad-accum micro-batches, every one
        epochs = {epoch_of(r) for rows in micro_batches for r in rows}
        assert len(epochs) == 1, f"step {step} mixes epochs {epochs}"
    trained = [r for _, rows in trainer.seen for r in rows]
    for epoch, count in enumerate((6, 5, 7)):
        rows = [r for r in trained if epoch_of(r) == epoch]
        assert rows == list(range(epoch * 100, epoch * 100 + count)), epoch
    # epoch 1's 5 batches end with one filler, which trains nothing
    assert steps[6] == [[104], []]


def test_the_fillers_train_nothing_the_weights_are_those_of_the_recipes_short_steps(three_epochs):
    """3 epochs through MMDPTrainer (SGD) end on the weights of the recipe's loop, whose epochs
    end with a short step of real batches only (optimizer_steps): the fillers add exactly 0."""
    trainer = three_epochs
    model, loader = TinyLM(), EpochsLoader([6, 5, 7])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _, micro_batches in zip(range(10), optimizer_steps(loader, 2)):
        tokens = step_label_tokens(micro_batches)
        for batch in micro_batches:
            micro_batch_loss(model, tiny_inputs(batch), batch, tokens, 1).backward()
        optimizer.step()
        optimizer.zero_grad()
    for a, b in zip(model.parameters(), trainer.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_fillers_before_a_steps_last_micro_batch_run_no_forward_and_train_nothing(tmp_path):
    """grad-accum 4 on epochs of 6, 5, 7 batches: the short steps end with 2, 3 and 1 fillers;
    all but the last of them skip the model (no forward: filler_loss), and the weights are still
    those of the recipe's short steps."""
    trainer = train(tmp_path, gradient_accumulation_steps=4, **THREE_EPOCHS)
    model, loader = TinyLM(), EpochsLoader([6, 5, 7])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _, micro_batches in zip(range(trainer.args.max_steps), optimizer_steps(loader, 4)):
        tokens = step_label_tokens(micro_batches)
        for batch in micro_batches:
            micro_batch_loss(model, tiny_inputs(batch), batch, tokens, 1).backward()
        optimizer.step()
        optimizer.zero_grad()
    for a, b in zip(model.parameters(), trainer.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # the three epochs as Trainer iterates them: 6 + 2, 5 + 3 and 7 + 1 micro-batches
    view = list(itertools.islice(LoaderForTrainer(EpochsLoader([6, 5, 7]), 4), 24))
    fillers = [batch for batch in view if batch.get("filler")]
    assert [b["forward"] for b in fillers] == [False, True, False, False, True, True]
    ran = []
    trainer.model.register_forward_hook(lambda *_: ran.append(1))
    for batch in fillers:
        loss = trainer.compute_loss(trainer.model, batch)
        assert loss.item() == 0.0
    assert len(ran) == 3  # only the fillers that end a step ran the model


class FixedLengthView(LoaderForTrainer):
    """The trap: Trainer's own epochs, with len() read once (transformers/trainer.py:2504)."""

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        return iter(self.loader)

    def set_epoch(self, epoch):
        self.loader.set_epoch(epoch)


class TrainerWithItsOwnEpochs(Recorded):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.args.max_steps = -1
        self.loader_for_trainer = FixedLengthView(self.train_loader)


def test_without_whole_steps_trainers_own_epochs_carry_and_lose_batches(tmp_path):
    trainer = train(tmp_path, num_train_epochs=3, trainer_class=TrainerWithItsOwnEpochs)
    trained = [r for _, rows in trainer.seen for r in rows]
    print(f"\nTrainer's own epochs: global_step {trainer.state.global_step}, trained {trained}")
    assert trainer.state.global_step != 10
    assert 206 not in trained  # epoch 2's 7th batch is never trained
    mixed = {}
    for step, rows in trainer.seen:
        mixed.setdefault(step, set()).update(epoch_of(r) for r in rows)
    assert any(len(epochs) > 1 for epochs in mixed.values())  # epoch 1's last batch carried


def test_a_resume_in_epoch_2_continues_exactly(tmp_path, three_epochs):
    whole = three_epochs
    train(tmp_path, save_strategy="steps", save_steps=5, stop_at=5, **THREE_EPOCHS)
    resumed = train(tmp_path, resume=str(tmp_path / "checkpoint-5"), **THREE_EPOCHS)
    assert resumed.state.global_step == 10
    assert resumed.seen == [x for x in whole.seen if x[0] > 5]
    for a, b in zip(whole.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_save_strategy_epoch_saves_at_the_end_of_each_loader_epoch(tmp_path):
    train(tmp_path, save_strategy="epoch", num_train_epochs=3)
    # epochs of 3, 3 and 4 steps; Trainer alone would save once, at the end of its one pass
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-10", "checkpoint-3", "checkpoint-6"]


def test_whole_epochs_are_refused_when_they_are_not_whole(tmp_path):
    with pytest.raises(ValueError, match="set max_steps instead"):
        train(tmp_path, num_train_epochs=1.5)


# 7. The loader state, before Trainer rotates checkpoints ------------------------------------------


def test_the_loader_state_is_in_the_checkpoint_before_older_ones_are_rotated(tmp_path, monkeypatch):
    rotate = hf_trainer.rotate_checkpoints
    present = []

    def checking_rotate(output_dir, **kwargs):
        newest = max(os.listdir(output_dir), key=lambda name: int(name.split("-")[-1]))
        present.append(
            os.path.exists(os.path.join(output_dir, newest, LOADER_STATE.format(rank=0)))
        )
        return rotate(output_dir, **kwargs)

    monkeypatch.setattr(hf_trainer, "rotate_checkpoints", checking_rotate)
    train(tmp_path, max_steps=3, save_strategy="steps", save_steps=1, save_total_limit=1)
    assert present == [True, True, True]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-3"]
    assert not [n for n in os.listdir(tmp_path / "checkpoint-3") if n.endswith(".tmp")]


class KilledWhileSaving(Exception):
    pass


def test_a_kill_during_a_save_leaves_the_previous_checkpoint_resumable(
    tmp_path, monkeypatch, three_epochs
):
    whole, out = three_epochs, tmp_path
    save_model = MMDPTrainer.save_model

    def dying_save_model(self, output_dir=None, _internal_call=False):
        if output_dir.endswith("checkpoint-3"):
            raise KilledWhileSaving(output_dir)  # after the loader state, before the rest
        return save_model(self, output_dir, _internal_call)

    monkeypatch.setattr(MMDPTrainer, "save_model", dying_save_model)
    saving = dict(save_strategy="steps", save_steps=1, save_total_limit=1)
    with pytest.raises(KilledWhileSaving):
        train(out, **saving, **THREE_EPOCHS)
    monkeypatch.setattr(MMDPTrainer, "save_model", save_model)
    assert "checkpoint-2" in os.listdir(out)  # not rotated away: the save never finished
    resumed = train(out, resume=str(out / "checkpoint-2"), **THREE_EPOCHS)
    assert resumed.seen == [x for x in whole.seen if x[0] > 2]
    for a, b in zip(whole.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class StateInOnSave(Recorded):
    """The trap: the loader state written in on_save, after Trainer rotated checkpoints."""

    def _save_checkpoint(self, model, trial):
        hf_trainer.Trainer._save_checkpoint(self, model, trial)
        folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
        save_loader_state(self.train_loader, folder, 0)


def test_with_the_state_written_after_rotation_a_kill_leaves_nothing_to_resume(
    tmp_path, monkeypatch
):
    rotate = hf_trainer.rotate_checkpoints

    def rotate_then_die(output_dir, **kwargs):
        rotate(output_dir, **kwargs)
        if os.path.exists(os.path.join(output_dir, "checkpoint-3")):
            raise KilledWhileSaving(output_dir)

    monkeypatch.setattr(hf_trainer, "rotate_checkpoints", rotate_then_die)
    out = tmp_path / "cut"
    with pytest.raises(KilledWhileSaving):
        train(out, max_steps=5, save_strategy="steps", save_steps=1, save_total_limit=1,
              trainer_class=StateInOnSave)  # fmt: skip
    assert os.listdir(out) == ["checkpoint-3"]  # checkpoint-2 rotated away
    with pytest.raises(FileNotFoundError, match="no mmdp loader state") as error:
        load_loader_state(EpochsLoader([6]), str(out / "checkpoint-3"), 0)
    print(f"\nstate written after rotation: {error.value}")


# 5. Refused in one sentence -----------------------------------------------------------------------


def arguments(**changes):
    good = dict(
        ignore_data_skip=False, average_tokens_across_devices=True, world_size=1, n_gpu=0,
        eval_strategy="no", max_steps=4, num_train_epochs=3.0,
    )  # fmt: skip
    return SimpleNamespace(**{**good, **changes})


def test_one_process_on_several_gpus_is_refused():
    loader = EpochsLoader([4])
    check_arguments(arguments(n_gpu=1), loader, replicas=1)
    with pytest.raises(ValueError, match="nn.DataParallel") as error:
        check_arguments(arguments(n_gpu=2), loader, replicas=1)
    assert str(error.value).count(". ") == 0  # one sentence


# 6. A mixture's loss weights ----------------------------------------------------------------------


def weighted_batches():
    loader = EpochsLoader([2], weights=(1.0, 3.0))
    return [loader.dataset.batch(0, 0), loader.dataset.batch(0, 1)]


def hand_weighted_loss(model, batches) -> torch.Tensor:
    """sum over the step's label tokens of w_t * loss_t / label tokens, one token at a time."""
    total, tokens = torch.tensor(0.0), 0
    for batch in batches:
        logits = model(batch["input_ids"])["logits"][0]
        for t in range(LENGTH - 1):
            target = batch["labels"][0, t + 1]
            if target != -100:
                loss = -torch.log_softmax(logits[t], -1)[target]
                total = total + batch["loss_weights"][0, t + 1] * loss
                tokens += 1
    return total / tokens


@pytest.mark.parametrize("weighted", [True, False], ids=["weighted", "unweighted_control"])
def test_the_recipe_loss_is_the_hand_computed_weighted_mean(weighted):
    model, batches = TinyLM(), weighted_batches()
    expected = hand_weighted_loss(model, batches)
    tokens = step_label_tokens(batches)
    got = sum(
        micro_batch_loss(
            model, tiny_inputs(b), b if weighted else {"labels": b["labels"]}, tokens, 1
        )
        for b in batches
    )
    if weighted:
        torch.testing.assert_close(got, expected)
    else:
        print(f"\nunweighted {got.item():.5f} vs weighted by hand {expected.item():.5f}")
        assert not torch.allclose(got, expected, rtol=1e-3)


def test_token_loss_weighs_each_token_as_the_hand_computed_mean():
    model, batches = TinyLM(), weighted_batches()
    expected = hand_weighted_loss(model, batches)
    n = sum(label_tokens(b["labels"]) for b in batches)
    outputs = [model(b["input_ids"]) for b in batches]
    got = sum(token_loss(o, b["labels"], n, b["loss_weights"]) for o, b in zip(outputs, batches))
    torch.testing.assert_close(got, expected)
    unweighted = sum(token_loss(o, b["labels"], n) for o, b in zip(outputs, batches))
    assert not torch.allclose(unweighted, expected, rtol=1e-3)


def test_mmdptrainer_trains_on_the_weighted_mean(tmp_path):
    """One step of SGD through MMDPTrainer moves the weights by lr x the hand-computed weighted
    loss's gradient (sgd, no clipping): Trainer's loss path carries the weights."""
    batches = weighted_batches()
    reference = TinyLM()
    hand_weighted_loss(reference, batches).backward()
    trainer = MMDPTrainer(
        model=TinyLM(),
        args=training_args(tmp_path, max_steps=1, optim="sgd", max_grad_norm=0.0),
        train_loader=EpochsLoader([2], weights=(1.0, 3.0)),
        model_inputs=tiny_inputs,
    )
    trainer.train()
    for before, after in zip(reference.parameters(), trainer.model.parameters()):
        torch.testing.assert_close(after, before.detach() - 0.1 * before.grad)


# 10. Trainer's logs in samples and real tokens -------------------------------------------------


def test_trainer_counts_samples_and_real_tokens(three_epochs):
    trainer = three_epochs
    # one sample per batch: epoch 0's 6 samples in 3 steps, not 10 steps x 2 x 4 "examples"
    assert trainer.planned_samples(10) == (6, 20)
    view = trainer.get_train_dataloader()
    values = trainer.set_initial_training_values(trainer.args, view)
    assert values[2:4] == (6, 20)  # "Num examples", and the samples behind samples/s
    packs = hf_trainer.Trainer.set_initial_training_values(trainer, trainer.args, view)
    assert packs[2:4] == (80, 80)  # Trainer's own: packs per device x grad-accum x steps
    # every real token of the 18 batches, none of the filler's
    assert trainer.state.num_input_tokens_seen == 18 * LENGTH


# 8. The collectives' device ----------------------------------------------------------------------


def test_step_label_tokens_are_counted_on_the_collectives_device():
    batches = weighted_batches()
    tokens = step_label_tokens(batches)
    assert tokens.device.type == "cpu" and tokens.item() == 2 * (LENGTH - 1)
    model, labels = TinyLM(), batches[0]["labels"]
    logits = model(batches[0]["input_ids"])["logits"]
    expected = summed_loss(logits, labels) / tokens
    got = micro_batch_loss(model, tiny_inputs(batches[0]), {"labels": labels}, tokens, 1)
    torch.testing.assert_close(got, expected)
    assert math.isclose(
        token_losses(logits, batches[0]["labels"]).sum().item(),
        (expected * tokens).item(),
        rel_tol=1e-6,
    )


def test_bf16_autocasts_the_forward_and_keeps_the_loss_in_float32():
    model, batch = TinyLM(), weighted_batches()[0]
    tokens = step_label_tokens([batch])
    with mixed_precision("cpu", bf16=True):
        logits = model(batch["input_ids"])["logits"]
        loss = micro_batch_loss(model, tiny_inputs(batch), batch, tokens, 1)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert model.out.weight.grad.dtype == torch.float32  # the weights stay float32
    with mixed_precision("cpu", bf16=False):
        assert model(batch["input_ids"])["logits"].dtype == torch.float32


# 11. TRL's SFTTrainer ----------------------------------------------------------------------------


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def llama_inputs(batch, model=None):
    positions = torch.arange(batch["input_ids"].shape[1])[None]  # TRL's metrics want them
    return {**tiny_inputs(batch), "position_ids": positions, "use_cache": False}


@pytest.mark.slow
def test_mmdp_sft_trainer_trains_every_epoch_as_mmdptrainer(tmp_path, tokenizer):
    pytest.importorskip("trl")
    from mmdp.training.trainer import MMDPSFTTrainer

    runs, forwards = {}, {}
    for name, trainer_class in {"sft": MMDPSFTTrainer, "trainer": MMDPTrainer}.items():
        extra = {"processing_class": tokenizer} if name == "sft" else {}
        model = tiny_llama()
        forwards[name] = []
        model.register_forward_hook(lambda *_, seen=forwards[name]: seen.append(1))
        trainer = trainer_class(
            model=model, args=training_args(tmp_path / name, num_train_epochs=3),
            train_loader=EpochsLoader([6, 5, 7]), model_inputs=llama_inputs, **extra,
        )  # fmt: skip
        trainer.train()
        runs[name] = trainer
    assert runs["sft"].state.global_step == runs["trainer"].state.global_step == 10
    # one forward per micro-batch (18 batches and 2 fillers): TRL's own compute_loss ran two
    assert len(forwards["sft"]) == len(forwards["trainer"]) == 20
    for a, b in zip(runs["sft"].model.parameters(), runs["trainer"].model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# A real family's weights on resume ----------------------------------------------------------


def test_a_resumed_real_family_gets_its_saved_weights_back(tmp_path):
    """Trainer's resume loads model.safetensors with load_state_dict(strict=False)
    (transformers/trainer.py:3686-3692), but save_pretrained wrote Qwen2.5-VL's keys under its
    checkpoints' names: the trap loads nothing (only a warning) and training goes on from the
    initial weights. MMDPTrainer loads them through the class (load_model_weights)."""
    import safetensors.torch

    from mmdp.data.families import tiny_processor
    from mmdp.models.tiny import tiny_model
    from mmdp.training.trainer import load_model_weights

    processor = tiny_processor("qwen2_5_vl")
    trained = tiny_model(processor, seed=0)
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(0.01)  # weights no fresh model has
    trained.save_pretrained(tmp_path)
    saved = trained.state_dict()

    trap = tiny_model(processor, seed=1)
    state = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    assert trap.load_state_dict(state, strict=False).missing_keys  # what Trainer does: nothing
    vision = "model.visual.patch_embed.proj.weight"  # lm_head.weight keeps its name, loads
    assert not torch.equal(trap.state_dict()[vision], saved[vision])

    resumed = tiny_model(processor, seed=1)
    assert load_model_weights(resumed, str(tmp_path))
    assert resumed.state_dict().keys() == saved.keys()
    assert all(torch.equal(resumed.state_dict()[name], saved[name]) for name in saved)
