"""SmolVLM and Idefics3: every image cut into square tiles, every tile the same number of tokens.

What the image processor does with an image of width x height (SmolVLMImageProcessor; Idefics3's
runs the same code, image_processing_idefics3.py): resize it so that its longest edge is
`size["longest_edge"]` (up or down: a 1x1 image becomes 2048x2048), round both sides up to
multiples of the tile side M = `max_image_size["longest_edge"]`, and cut it into rows x cols
tiles of M x M, plus the whole image squashed to M x M as a last, "global" tile. An image no
larger than one tile is that single tile (rows = cols = 0). So a 640x480 photo is 3 x 4 + 1 = 13
tiles; any image is 2 to 17 tiles at the real settings. The vision encoder reads each tile as its
own M x M image: its work is (M / patch)^2 patches per tile.

What the processor puts in the text for an image (transformers 5.23: get_image_prompt_string and its
helpers in processing_smolvlm, the same in Idefics3Processor.replace_image_token), S = image_seq_len
<image> tokens per tile:

    <fake_token_around_image><row_1_col_1><image>*S<fake_token_around_image><row_1_col_2>...\n
    ...one line per row of tiles...\n
    \n<fake_token_around_image><global-img><image>*S<fake_token_around_image>

What a packed batch must carry (transformers 5.23, modeling_smolvlm.py; Idefics3 the same):

    position_ids    [B, L], restarting at 0 for each sample, as for every mmdp batch
    pixel_values    [1, T, 3, M, M]: all T tiles of the batch, in the order of their tokens.
                    The model reads 5 dimensions (SmolVLMModel.get_image_features) but flattens the
                    first two, drops all-zero tiles as padding and scatters the features into the
                    <image> positions in row-major order of input_ids (masked_scatter, in
                    SmolVLMModel.forward): only the order of the tiles matters, not how they are
                    grouped. One row of tiles needs no padding tiles and no pixel_attention_mask
                    (every tile is a full M x M square: the default all-ones mask,
                    get_image_features).
    (nothing else)  no attention_mask, and call the model with use_cache=False: SmolVLMConfig
                    defaults to use_cache=True (SmolVLMConfig), and the cache the model then builds
                    (in forward) turns off the per-sample mask.

`offline_processor(family)` builds a processor with no network: the real image-processor class
with SmolVLM-256M/500M's settings, mmdp's SmolLM2 tokenizer (SmolVLM's own text tokenizer) plus
the family's tokens at the real ids, and the real chat template. Its tiny random model (tests)
is mmdp.models.tiny.smolvlm.
"""

import math

import torch
import transformers
from transformers import AutoTokenizer

from mmdp import config
from mmdp.data.families.base import (
    ImageLayout,
    ModelFamily,
    effective_settings,
    plain_settings,
)
from mmdp.errors import UserError

# The chat template saved with HuggingFaceTB/SmolVLM-*-Instruct and SmolVLM2 (verbatim, as in
# transformers' tests/models/smolvlm/test_processor_smolvlm.py; processing_smolvlm's
# DEFAULT_CHAT_TEMPLATE is the same plus videos). Images render as <image>; no
# {% generation %} markers. Idefics3-8B's has <|begin_of_text|> (its Llama 3 BOS) for
# <|im_start|>; with SmolLM2's tokenizer this one serves both.
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
# The tokens SmolVLM's tokenizer adds to SmolLM2's 49,152, in its order, so that they get its
# ids: <global-img> 49152, <row_1_col_1>..<row_6_col_6> 49153-49188, <fake_token_around_image>
# 49189, <image> 49190 and <end_of_utterance> 49279, 49,280 tokens in all (the real
# text_config.vocab_size). The 88 tokens between stand in for the real tokenizer's other added
# tokens, whose names mmdp does not rely on. The processors find the family's tokens by these
# strings (SmolVLMProcessor.__init__, Idefics3Processor.__init__; transformers 5.23).
FAMILY_TOKENS = [
    "<global-img>",
    *[f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)],
    "<fake_token_around_image>",
    "<image>",
    *[f"<|reserved_special_token_{i}|>" for i in range(88)],
    "<end_of_utterance>",
]
# HuggingFaceTB/SmolVLM-256M/500M-Instruct and SmolVLM2-256M/500M's preprocessor_config.json:
# longest edge 2048 (4 tiles), tiles of 512 px; the class defaults (LANCZOS, mean = std = 0.5)
# are theirs. Their processor_config.json: 64 <image> per tile = (512 / 16)^2 / 4^2 (SigLIP
# base-patch16-512, pixel shuffle 4). The class defaults are Idefics3-8B's (1456 / 364 / 169).
CHECKPOINT_SETTINGS = {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}}
CHECKPOINT_IMAGE_SEQ_LEN = 64
# The vision encoder's patch side for each tile side of the real checkpoints (config.json's
# vision_config): SmolVLM-256M/500M 512/16, SmolVLM-Instruct (2B) and SmolVLM2-2.2B 384/14,
# Idefics3-8B 364/14. The processor does not know it, and weighing needs it for the patches.
# The 32 px tiles of 8 px patches are tiny_processor's (tests).
PATCH_SIZES = {512: 16, 384: 14, 364: 14, 32: 8}
# tiny_processor: tiles of 32 px, images upscaled to 64 px (up to 2 x 2 tiles + the global one,
# 2 to 5 tiles as the real settings give 2 to 17), (32 / 8)^2 / 2^2 = 4 <image> a tile
TINY_SETTINGS = {"size": {"longest_edge": 64}, "max_image_size": {"longest_edge": 32}}
TINY_IMAGE_SEQ_LEN = 4
MAX_IMAGE_SIZE = 4096  # as in image_processing_smolvlm: no side is resized above this


class SmolVLM(ModelFamily):
    """SmolVLM (SmolVLMProcessor): see the module docstring."""

    name = "smolvlm"
    image_token = feature_token = "<image>"
    media_closing_tokens = ("<fake_token_around_image>",)  # closes each image's (and video's) run
    end_of_turn = "<end_of_utterance>"
    vision_keys = ("pixel_values",)
    model_class = transformers.SmolVLMForConditionalGeneration
    config_class = transformers.SmolVLMConfig
    # a pack of about 3 images: at SmolVLM-256M's settings a 512 x 512 image is upscaled to
    # 2048 x 2048, 17 tiles: 1,127 tokens and 17 x 1,024 = 17,408 patches (any image costs 5 to
    # 17 tiles); 64 tiles of patches is about what 4,096 tokens of image features hold
    default_max_length = 4096
    default_max_patches = 65536

    def read_settings(self) -> dict:
        """The image processor's effective resize and tiling (`size`, `max_image_size`,
        `do_image_splitting`, `do_resize`, as its preprocess resolves them) and the processor's
        tokens a tile (`image_seq_len`)."""
        settings = effective_settings(self.processor.image_processor)
        self.tiling = plain_settings(settings, TILING_SETTINGS)
        self.tile = self.tiling["max_image_size"]["longest_edge"]
        if self.tile not in PATCH_SIZES:
            raise UserError(
                f"mmdp does not know the vision encoder's patch size for {self.tile}-pixel tiles "
                f"(it knows the real checkpoints' {sorted(PATCH_SIZES)})"
            )
        self.patches_per_tile = (self.tile // PATCH_SIZES[self.tile]) ** 2
        return {**self.tiling, "image_seq_len": self.processor.image_seq_len}

    def image_layout(self, width: int, height: int, images_in_sample: int) -> ImageLayout:
        rows, cols = tile_grid(width, height, self.tiling)
        tiles = rows * cols + 1 if rows else 1
        runs = (self.processor.image_seq_len,) * tiles
        return ImageLayout(image_text(rows, cols), runs, tiles * self.patches_per_tile)

    def vision_inputs(self, images: list) -> dict:
        """The sample's tiles, [T, 3, M, M], in the order of their tokens (one sample: no
        padding tiles, so its pixel_attention_mask is all ones and is left out)."""
        out = self.processor.image_processor(images=[images], return_tensors="pt")
        return {"pixel_values": out["pixel_values"][0]}

    def check_vision(self, vision: dict, layouts: list[ImageLayout]) -> None:
        """The tiles made must be the tiles weighed, and none all zeros: the model would take
        it for padding and drop it (SmolVLMModel.get_image_features, transformers 5.23)."""
        tiles = vision.get("pixel_values", torch.zeros(0, 3, 1, 1))
        weighed = sum(len(layout.runs) for layout in layouts)
        if len(tiles) != weighed:
            raise RuntimeError(f"weighed {weighed} tiles, the image processor made {len(tiles)}")
        if (tiles.flatten(1) == 0).all(1).any():
            raise RuntimeError("the image processor made an all-zero tile: the model would drop it")

    def collate_vision(self, samples: list[dict]) -> dict:
        """All tiles of the batch as one row, [1, T, 3, M, M] (see the module docstring); none
        when no sample has an image (the model refuses an empty or all-zero pixel_values)."""
        tiles = [s["pixel_values"] for s in samples if "pixel_values" in s]
        return {"pixel_values": torch.cat(tiles)[None]} if tiles else {}


class Idefics3(SmolVLM):
    """Idefics3 (Idefics3Processor, also SmolVLM-256M/500M-Instruct's v1 processor): SmolVLM's
    rules, another model class."""

    name = "idefics3"
    model_class = transformers.Idefics3ForConditionalGeneration
    config_class = transformers.Idefics3Config


# The image processor's settings that decide its tiles (SmolVLMImageProcessor's and
# Idefics3ImageProcessor's preprocess), as it resolves them.
TILING_SETTINGS = ("do_resize", "size", "do_image_splitting", "max_image_size")


def tile_grid(width: int, height: int, tiling: dict) -> tuple[int, int]:
    """The (rows, cols) of tiles the image processor cuts an image into, (0, 0) for one tile;
    `tiling`: its effective TILING_SETTINGS (SmolVLM.read_settings).

    A line-by-line port of SmolVLMImageProcessor._preprocess (transformers 5.23) for one image size,
    no pixel decoded. The processor's own get_number_of_image_patches derives the short side
    differently and ignores do_resize, so it can disagree.

    >>> tiling = {"do_resize": True, "do_image_splitting": True, **CHECKPOINT_SETTINGS}
    >>> tile_grid(640, 480, tiling), tile_grid(1, 1, tiling), tile_grid(4000, 300, tiling)
    ((3, 4), (4, 4), (1, 4))
    """
    tile = tiling["max_image_size"]["longest_edge"]
    if not tiling["do_image_splitting"]:
        return 0, 0  # squashed to one tile (in _preprocess)
    if tiling["do_resize"]:
        height, width = longest_edge_resized(height, width, tiling["size"]["longest_edge"])
    # resize_for_vision_encoder: the long side up to a multiple of the tile, the short side from the
    # ROUNDED long side, then up to a multiple of the tile
    aspect_ratio = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect_ratio) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect_ratio) / tile) * tile
    if height > tile or width > tile:  # split_images
        return height // tile, width // tile
    return 0, 0


def longest_edge_resized(height: int, width: int, longest_edge: int) -> tuple[int, int]:
    """(height, width) after the first resize: the long side to `longest_edge`, the short side
    in proportion and even, then both within 4096 (get_resize_output_image_size and its helpers in
    image_processing_smolvlm, transformers 5.23)."""
    aspect_ratio = width / height
    if width >= height:
        width, height = longest_edge, int(longest_edge / aspect_ratio)
        height += height % 2
    else:
        height, width = longest_edge, int(longest_edge * aspect_ratio)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect_ratio = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect_ratio)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect_ratio)
    return max(height, 1), max(width, 1)


def image_text(rows: int, cols: int) -> str:
    """What the processor writes for an image of rows x cols tiles (get_image_prompt_string),
    with ONE <image> per tile (mmdp repeats each into its run of image_seq_len).

    >>> image_text(0, 0)
    '<fake_token_around_image><global-img><image><fake_token_around_image>'
    >>> image_text(1, 2).replace("<fake_token_around_image>", "|")
    '|<row_1_col_1><image>|<row_1_col_2><image>\\n\\n|<global-img><image>|'
    """
    fake, image = "<fake_token_around_image>", "<image>"
    global_tile = f"{fake}<global-img>{image}{fake}"
    if rows == 0:
        return global_tile
    lines = [
        "".join(f"{fake}<row_{row}_col_{col}>{image}" for col in range(1, cols + 1)) + "\n"
        for row in range(1, rows + 1)
    ]
    return "".join(lines) + "\n" + global_tile


def offline_processor(
    family: type[SmolVLM],
    settings: dict = CHECKPOINT_SETTINGS,
    image_seq_len: int = CHECKPOINT_IMAGE_SEQ_LEN,
):
    """A processor of `family` built with no network (see the module docstring)."""
    tokenizer = AutoTokenizer.from_pretrained(config.DEFAULT_TOKENIZER)
    tokenizer.add_tokens(FAMILY_TOKENS, special_tokens=True)  # at their real ids
    if family is Idefics3:
        return transformers.Idefics3Processor(
            image_processor=transformers.Idefics3ImageProcessor(**settings),
            tokenizer=tokenizer,
            image_seq_len=image_seq_len,
            chat_template=CHAT_TEMPLATE,
        )
    return transformers.SmolVLMProcessor(  # needs num2words, and a video processor (not None)
        image_processor=transformers.SmolVLMImageProcessor(**settings),
        tokenizer=tokenizer,
        video_processor=transformers.SmolVLMVideoProcessor(),
        image_seq_len=image_seq_len,
        chat_template=CHAT_TEMPLATE,
    )


def tiny_processor(family: type[SmolVLM] = SmolVLM):
    """offline_processor with 32 px tiles and 4 <image> a tile, for tiny_model on CPU: at the
    real settings every image is upscaled to 5-17 tiles of 64 tokens, a test batch of 5 images
    holds 4,300 tokens and 57 tiles, and each test took 10 s of CPU. The same rules (resize,
    split, the global tile, the text around each tile) apply."""
    return offline_processor(family, TINY_SETTINGS, TINY_IMAGE_SEQ_LEN)
