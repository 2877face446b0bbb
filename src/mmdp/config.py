"""Shared defaults: one place for the numbers every stage uses; and `setting`, a settings
dataclass's field with what it holds."""

import dataclasses
from pathlib import Path

# Where the repository's committed figures go (stages save here unless --out-dir says otherwise).
ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets"

# The tokenizer shipped in the repo: SmolLM2's (same for the 135M and 360M models the blog uses).
DEFAULT_TOKENIZER = Path(__file__).resolve().parent / "data" / "smollm2_tokenizer"

# The special token that stands for one image embedding, and how many stand for each image
# (nanoVLM's projector turns every image into 64 embeddings).
IMAGE_TOKEN = "<|image|>"
IMAGE_TOKEN_LENGTH = 64

# Images are resized to a square of this side for the vision encoder (nanoVLM's vit_img_size).
IMAGE_SIZE = 256
# An image with more pixels than this is skipped before decoding (a decompression bomb would
# take gigabytes of memory inside a DataLoader worker).
MAX_IMAGE_PIXELS = 40_000_000

# The plain ChatML template the blog uses: no default system prompt is injected.
# The {% generation %} markers change nothing in the rendered text; they let
# `apply_chat_template(..., return_assistant_tokens_mask=True)` tell us which tokens are replies.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Hugging Face's label for "no loss here" (torch.nn.CrossEntropyLoss's default ignore_index).
IGNORE_INDEX = -100

# The embedded synthetic dataset: how many rows the stages generate and cache by default.
DEFAULT_NUM_ROWS = 2_000
# synthetic video clips stage 5 adds to the embedded rows for a family that takes video
# (Qwen2.5-VL, Qwen3-VL, LLaVA-OneVision); the default TinyVLM rows never have any
DEFAULT_VIDEO_ROWS = 100
# Where generated datasets are cached (outside git). MMDP_CACHE overrides it.
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "mmdp"

# Stage defaults.
BATCH_SIZE = 8  # samples per padded batch: the blog's batch for the padding figures
PACKS_PER_BATCH = 8  # packs per packed batch (stage 5): one pack is one row of the batch
MAX_LENGTH = 512  # stage 3's fixed length and stage 5's token budget per pack (max_length)
MAX_IMAGES = 18  # stage 5's image budget per pack (the blog's max_images_per_knapsack)


def setting(default=dataclasses.MISSING, help: str = "", **flag) -> dataclasses.Field:
    """A field of a settings dataclass (DataSettings, PackingConfig...): its default and what it
    holds, which its flag's --help shows; `flag` says what the flag takes (mmdp.flags: min,
    choices, parse, metavar, flags). No default: a required flag."""
    return dataclasses.field(default=default, metadata={"help": help, **flag})
