"""What the three training examples share (examples/trainer.py, examples/accelerate_loop.py,
examples/torchrun.py): their settings (TrainingSettings: their flags), the data (the embedded
rows, or your own: --dataset) in a planned loader (and its eval split), the model (and its LoRA
adapters), and the --log-samples file that shows a resumed run trains exactly what an
uninterrupted one does.

Everything runs offline on a CPU by default: the embedded synthetic rows, and TinyVLM (32-pixel
images) or, with `--model FAMILY`, a tiny random model of that family's real transformers class
with its processor built in code (the seed user's run: examples/trainer.py's docstring).
"""

import dataclasses
import hashlib
import json
import os

import numpy as np
import pyarrow.compute
import torch
import torch.distributed as dist

from mmdp.config import setting
from mmdp.data.families import OFFLINE as FAMILY_MODELS
from mmdp.data.families import load_processor, tiny_processor, why
from mmdp.data.hub import require_hub
from mmdp.data.reading.settings import DataSettings
from mmdp.data.reading.sources import load_synthetic_videos, with_videos
from mmdp.data.tokenizer import get_tokenizer
from mmdp.data.vqa_dataset import VQADataset
from mmdp.errors import UserError
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.models.inputs import model_inputs
from mmdp.models.tiny import tiny_model
from mmdp.models.tiny_vlm import TinyVLM, TinyVLMConfig, vlm_inputs
from mmdp.packing.packing_config import PackingConfig, default_config
from mmdp.training.recipes import epoch_steps

IMAGE_SIZE = 32  # small images keep a CPU step short; 32 / 4-pixel patches = 64 image tokens
PATCH_SIZE = 4
TINY_VLM_MAX_LENGTH = 256  # tokens per pack for TinyVLM (a real family's own default otherwise)


# --model: mmdp's TinyVLM, or a tiny random model of a family's real transformers class
# (qwen3_vl_moe, qwen3_5_moe: the mixture-of-experts class, with the dense one's processor).
MODELS = ("tiny_vlm", *FAMILY_MODELS, "qwen3_vl_moe", "qwen3_5_moe")


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """What the examples read of their flags, as one frozen value: each example's main parses
    them once (mmdp.flags.parse_flags; --help tells each) and hands this on."""

    output_dir: str = setting(help="checkpoints go to DIR/checkpoint-STEP", metavar="DIR")
    # how long, and the checkpoints
    max_steps: int | None = setting(
        None, "optimizer steps in all", shown="--num-train-epochs whole epochs", min=1
    )
    num_train_epochs: int = setting(1, "whole epochs to train when --max-steps is not given", min=1)
    save_steps: int = setting(4, "a checkpoint every N steps", min=1)
    resume_from_checkpoint: str | None = setting(None, "a checkpoint-STEP folder", metavar="DIR")
    grad_accum: int = setting(2, "micro-batches per step", min=1)
    log_samples: str | None = setting(None, "JSON lines: every micro-batch's rows", metavar="PATH")
    # the rows (your own with --dataset), and how they are packed
    data: DataSettings = DataSettings(num_rows=64)
    videos: int = setting(
        0,
        "N synthetic video clips mixed into the rows (a --model that takes video)",
        metavar="N",
        min=0,
    )
    eval_ratio: float = setting(
        0.0,
        "hold out R of the rows (e.g. 0.1) and report their exact eval_loss",
        shown="0: none",
        metavar="R",
        min=0,
        below=1,
    )
    # a pack's tokens: TinyVLM's TINY_VLM_MAX_LENGTH, a real family's own (default_config)
    packing: PackingConfig = setting(
        PackingConfig(max_length=None, packs_per_batch=2),
        flags=("max_length", "packs_per_batch"),
        shown={"max_length": "256 for tiny_vlm, the family's own default for the others"},
    )
    num_workers: int = setting(2, "DataLoader workers per rank", min=0)
    # the model and its optimizer
    lr: float = setting(1e-3, "constant learning rate", above=0)
    seed: int = setting(0, "data order and initial weights", min=0)
    model: str = setting(
        "tiny_vlm",
        "mmdp's TinyVLM, or a tiny random model of the family's real transformers class, offline",
        choices=MODELS,
    )
    model_path: str | None = setting(
        None,
        "a real checkpoint of a family mmdp packs for, from the Hub or a folder (instead of "
        "--model; needs the network or the local Hugging Face cache)",
        metavar="NAME_OR_DIR",
    )
    lora: bool = setting(
        False,
        "train LoRA adapters (peft) on the language model's and the vision tower's linear "
        "layers, and a mixture of experts' experts, instead of every weight (not tiny_vlm)",
    )


def make_processor(settings: TrainingSettings):
    """The model's processor: TinyVLM's tokenizer, a family's built in code, or a checkpoint's
    (one sentence, mmdp.errors.UserError, when it cannot be had)."""
    if settings.model_path:
        return load_processor(settings.model_path, hint=MODEL_PATH_HINT)
    if settings.model == "tiny_vlm":
        return get_tokenizer()
    return tiny_processor(settings.model.removesuffix("_moe"))  # a MoE: its dense family's


def make_loader(
    settings: TrainingSettings, *, rank: int | None = None, world_size: int | None = None
):
    """The embedded rows (and --videos clips), packed and planned: a PackedDataLoader that shards
    by rank itself (rank and world size from torch.distributed unless given), over the rows
    --eval-ratio does not hold out. Returns (loader, processor): the processor is TinyVLM's
    tokenizer unless --model or --model-path names another model."""
    processor = make_processor(settings)
    rows = settings.data.load()  # --dataset, --num-rows...
    samples = VQADataset(rows, processor, image_size=IMAGE_SIZE)
    videos = settings.videos
    if videos and not samples.family.video_token:
        raise UserError(
            f"--videos: the {samples.family.name} family takes no video; use a --model that "
            "does (qwen2_5_vl, qwen3_vl, qwen3_vl_moe, qwen3_5, qwen3_5_moe, llava_onevision)"
        )
    if videos:  # the clips after the rows
        samples = VQADataset(
            with_videos(rows, load_synthetic_videos(videos)), processor, image_size=IMAGE_SIZE
        )
    packing = dataclasses.replace(settings.packing, seed=settings.seed)
    if packing.max_length is None and samples.family.name == "tiny":
        packing = dataclasses.replace(packing, max_length=TINY_VLM_MAX_LENGTH)
    # the family's budgets (a real family's tokens and patches a pack), unless given
    config = default_config(samples.family, **packing.settings())
    dataset = PackedDataset(
        samples, config=config, rank=rank, world_size=world_size, eval_ratio=settings.eval_ratio
    )
    return PackedDataLoader(dataset, num_workers=settings.num_workers), processor


def make_eval_loader(loader, settings: TrainingSettings) -> PackedDataLoader | None:
    """The rows --eval-ratio held out of `loader`'s dataset, packed: every one once, on every
    rank (mmdp.training.evaluation); None without --eval-ratio."""
    if not settings.eval_ratio:
        return None
    return PackedDataLoader(loader.dataset.eval_dataset(), num_workers=settings.num_workers)


def video_rows(loader) -> set[int]:
    """The dataset rows that hold a video (for the sample log), read from the Arrow column's
    list lengths: no clip is read."""
    rows = loader.dataset.dataset.dataset
    if "videos" not in rows.column_names:
        return set()
    column = rows.select_columns(["videos"]).with_format("arrow")[:]["videos"]  # a selection too
    lengths = pyarrow.compute.list_value_length(column)
    return set(np.flatnonzero(lengths.to_numpy(zero_copy_only=False) > 0).tolist())


def training_steps(settings: TrainingSettings, loader) -> int:
    """--max-steps, or the optimizer steps of --num-train-epochs whole epochs on this loader
    (each epoch is planned anew, so their counts differ)."""
    if settings.max_steps is not None:
        return settings.max_steps
    epochs = range(settings.num_train_epochs)
    return sum(epoch_steps(loader.dataset, e, settings.grad_accum) for e in epochs)


def tiny_vlm(tokenizer, seed: int):
    """TinyVLM in float32, the same initial weights on every rank; and its batch keys."""
    torch.manual_seed(seed)
    vlm_config = TinyVLMConfig(
        len(tokenizer), tokenizer.image_token_id, image_size=IMAGE_SIZE, vit_patch_size=PATCH_SIZE
    )
    return TinyVLM(vlm_config).train(), vlm_inputs


def make_model(settings: TrainingSettings, processor):
    """(model, model_inputs) for --model or --model-path, in train mode, the same initial
    weights on every rank (adapters included, with --lora); model_inputs(batch, model) picks
    the keys the model takes."""
    if settings.model_path:
        model = checkpoint_model(settings.model_path)
    elif settings.model == "tiny_vlm":
        if settings.lora:
            raise UserError("--lora needs a transformers model: add --model FAMILY")
        return tiny_vlm(processor, settings.seed)
    else:
        moe = {"moe": True} if settings.model.endswith("_moe") else {}
        model = tiny_model(processor, seed=settings.seed, **moe).train()
    if settings.lora:
        torch.manual_seed(settings.seed)  # the adapters' initial weights, the same on every rank
        model = with_lora(model)
    return model, model_inputs


# peft's "all-linear": every nn.Linear but the output layer, so the language model's attention
# and MLPs and the vision tower's blocks and merger. A mixture of experts keeps each layer's
# experts in two 3-D parameters (transformers 5.23's Qwen3VLMoeTextExperts, no nn.Linear):
# peft's target_parameters puts an adapter on each.
EXPERT_PARAMETERS = ["experts.gate_up_proj", "experts.down_proj"]


def with_lora(model):
    """The model with LoRA adapters (peft, rank 8) on the language model and the vision tower,
    and on a mixture of experts' experts; only the adapters train."""
    from peft import LoraConfig, get_peft_model

    moe = any(name.endswith("experts.gate_up_proj") for name, _ in model.named_parameters())
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules="all-linear",
        target_parameters=EXPERT_PARAMETERS if moe else None,
    )
    return get_peft_model(model, config)


# What to run instead when --model-path cannot be had (the examples have no --processor).
MODEL_PATH_HINT = "run without --model-path to train a tiny model (--model FAMILY)"


def checkpoint_model(name_or_path: str):
    """A real checkpoint's model, in float32 (one sentence when it cannot be had)."""
    from transformers import AutoModelForImageTextToText

    if not os.path.exists(name_or_path):
        require_hub(f"model {name_or_path!r}", MODEL_PATH_HINT)
    try:
        model = AutoModelForImageTextToText.from_pretrained(name_or_path, dtype=torch.float32)
    except OSError as error:  # not in the local cache under HF_HUB_OFFLINE, or no such model
        raise UserError(
            f"could not load model {name_or_path!r} ({why(error)}); {MODEL_PATH_HINT}"
        ) from error
    return model.train()


def checkpoint_folder(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, f"checkpoint-{step}")


def checkpoint_step(folder: str) -> int:
    """The step a checkpoint-STEP folder was saved at."""
    return int(os.path.basename(os.path.normpath(folder)).rsplit("-", 1)[1])


class SampleLog:
    """--log-samples: one JSON line per micro-batch trained, every rank into one file:
    {"rank", "step", "micro_step", "epoch", "sample_index", "videos"}, `step` counting optimizer
    steps from 1, `micro_step` the micro-batch within it, `epoch` the batch's own (its `epoch`
    key: a trainer that fetches ahead has moved the loader on) and `videos` how many of its
    samples hold a video (`video_rows`: the rows that do).

    A fresh run empties the file; a resumed run keeps the lines up to its checkpoint's step and
    drops the later ones (trained before the run stopped, but not saved), so the file ends as the
    uninterrupted run's does, up to the order in which ranks' lines interleave. Every rank must
    create it (it waits for rank 0 to prepare the file).
    """

    def __init__(
        self,
        path: str | None,
        rank: int,
        resumed_step: int | None = None,
        video_rows: set[int] = frozenset(),
    ):
        self.path, self.rank, self.video_rows = path, rank, video_rows
        if path and rank == 0:
            lines = []
            if resumed_step is not None and os.path.exists(path):
                with open(path) as f:
                    lines = [line for line in f if json.loads(line)["step"] <= resumed_step]
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                f.writelines(lines)
        if path and dist.is_available() and dist.is_initialized():
            dist.barrier()

    def write(self, step: int, micro_step: int, batch: dict) -> None:
        if not self.path:
            return
        rows = batch["sample_index"].tolist()
        line = {
            "rank": self.rank,
            "step": step,
            "micro_step": micro_step,
            "epoch": batch.get("epoch"),
            "sample_index": rows,
            "videos": sum(row in self.video_rows for row in rows),
        }
        # one write() of one line, opened for appending: ranks' lines never interleave mid-line
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)


def model_weights_digest(state_dict: dict) -> str:
    """A short sha256 of a model's weights: two runs that end the same print the same."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        digest.update(name.encode())
        digest.update(
            state_dict[name].detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
        )
    return digest.hexdigest()[:16]


def print_result(loss: float, step: int, digest: str, evaluation: dict | None = None) -> dict:
    """What every example prints at the end, on rank 0 (and returns, for tests); with
    --eval-ratio, the last evaluation (mmdp.training.evaluation's metrics) too."""
    print(f"final loss {loss:.4f} after {step} steps (weights sha256 {digest})", flush=True)
    result = {"loss": loss, "step": step, "digest": digest}
    if evaluation:
        print(
            f"eval_loss {evaluation['eval_loss']:.4f} over {evaluation['eval_label_tokens']:,} "
            f"label tokens of {evaluation['eval_samples']:,} held-out samples",
            flush=True,
        )
        result["evaluation"] = evaluation
    return result
