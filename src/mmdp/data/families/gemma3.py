"""Gemma 3: 256 soft tokens per image (and per pan-and-scan crop), bidirectional within each image.

What the processor does with an image of width x height (transformers 5.23, Gemma3Processor and
Gemma3ImageProcessor):

    1. Pan-and-scan (off by default: Gemma3Processor's images_kwargs): an image whose aspect ratio
       is at least 1.2 is also cut into 2 to 4 crops of at least 256 px, side by side along its long
       edge (Gemma3ImageProcessor.pan_and_scan_batched). The full image and each crop are resized to
       896 x 896 and encoded by SigLIP as separate images, one row of pixel_values each: the vision
       encoder's work is (1 + crops) x (896 / 14)^2 patches.
    2. Each image run becomes "\\n\\n<start_of_image>" + 256 x <image_soft_token> +
       "<end_of_image>\\n\\n" in the text (Gemma3Processor.__init__); with crops, the original
       image's run and the crops' runs are joined by a sentence
       (Gemma3Processor.replace_image_token).
    3. The whole expanded text is tokenized again, so the "\\n\\n" around each image merges with
       its neighbours (SmolLM2's BPE: "user\\n" + "\\n\\n" is ONE token): an image's cost is not a
       constant. mmdp's generic encode handles it, since it tokenizes the expanded text too (one
       soft token per run, repeated afterwards: a special token never merges).

Pan-and-scan is a setting of the family, `Gemma3(processor, do_pan_and_scan=True)`, passed to the
image processor at every call: Gemma3Processor sends its own `do_pan_and_scan=False` whatever the
image processor was built with (ProcessorMixin._merge_kwargs), so an image processor's own
setting is silently ignored. The setting is part of `fingerprint()`: weights are cached per setting.

What a packed batch must carry (modeling_gemma3.py):

    token_type_ids   [B, L]: 1 on <image_soft_token>, 0 elsewhere and on padding. The model makes
                     each image's tokens attend to each other both ways (Gemma 3 was trained so);
                     without it, images are silently causal.
    attention_mask   a dict {"full_attention", "sliding_attention"} built by
                     mmdp.models.gemma3_masks: transformers 5.23 builds the sliding-window mask
                     wrong for every sample that does not start its row (see there), and
                     mmdp.models.inputs.model_inputs(batch, model) always passes these instead.
    pixel_values     every image and crop, in the order of their tokens
    position_ids, cu_seq_lens_q/k, max_length_q/k   as for every packed batch

Under FlashAttention, Gemma 3 ignores token_type_ids (its layers are causal,
Gemma3Attention.__init__, and the FlashAttention mask is None, masking_utils.flash_attention_mask):
images attend causally, packed or not (tests/test_gemma3.py measures it).

`offline_processor(Gemma3)` builds the real checkpoint's processor with no network;
`tiny_processor` the same at 28 px with 4 soft tokens per image, for mmdp.models.tiny.gemma3's
random Gemma3ForConditionalGeneration that CPU tests run in a second.
"""

import math

import torch
from transformers import (
    AutoTokenizer,
    Gemma3ImageProcessor,
    Gemma3Processor,
)
from transformers.image_utils import PILImageResampling

from mmdp import config
from mmdp.data.families.base import ImageLayout, ModelFamily, effective_settings
from mmdp.errors import UserError

# google/gemma-3-*-it's chat template, verbatim: `_CHAT_TEMPLATE` of transformers'
# models/gemma3/convert_gemma3_weights.py (huggingface/transformers@0d7e95d9), saved with the
# instruction-tuned checkpoints. The assistant is "model", a system message prefixes the first
# user turn, texts are trimmed, each image is <start_of_image>; no {% generation %} markers.
CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""
# The image tokens, named as Gemma3Processor reads them from the tokenizer
# (processing_gemma3.py:45-49, 107-108, 144; the real tokenizer's ids 262144, 255999, 256000).
IMAGE_TOKENS = {
    "image_token": "<image_soft_token>",
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
}
# Gemma's own names for these (real ids 2, 1, 0), and its turn tokens (105, 106).
NAMED_TOKENS = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
TURN_TOKENS = ["<start_of_turn>", "<end_of_turn>"]

# The real checkpoint's image settings (convert_gemma3_weights.py, main(): the processor saved
# with google/gemma-3-4b/12b/27b): 896 px squares, mean = std = 0.5, bilinear, 256 soft tokens.
# The class defaults differ (224 px, ImageNet mean and std: image_processing_gemma3.py:59-62).
IMAGE_SIZE = 896
IMAGE_SEQ_LENGTH = 256
# SigLIP's patch side in every Gemma 3 with images (convert_gemma3_weights.py, _VISION_CONFIG).
PATCH_SIZE = 14
# The tests' size (tiny_processor): 28 px = 2 x 2 patches, pooled to 4 soft tokens.
TINY_IMAGE_SIZE = 28
TINY_IMAGE_SEQ_LENGTH = 4


def pan_and_scan_crops(
    width: int,
    height: int,
    *,
    pan_and_scan_min_crop_size: int,
    pan_and_scan_max_num_crops: int,
    pan_and_scan_min_ratio_to_activate: float,
) -> int:
    """How many crops pan-and-scan cuts from an image of width x height, from its size alone:
    Gemma3ImageProcessor.pan_and_scan_batched's rule (transformers 5.23).

    Crops follow the long edge, as many as the aspect ratio rounded half up, at least 2 and at
    most the maximum; none if the ratio is under the threshold or the crops would be smaller than
    the minimum size. With the defaults (256, 4, 1.2): 896x896 -> 0, 640x480 -> 2, 1000x300 -> 3,
    4000x300 -> 4, 767x256 -> 2 (crops of 384 x 256), 257x128 -> 0 (crops of 129 px).
    """
    long, short = max(width, height), min(width, height)
    if long / short < pan_and_scan_min_ratio_to_activate:
        return 0
    crops = int(math.floor(long / short + 0.5))
    crops = min(int(math.floor(long / pan_and_scan_min_crop_size)), crops)
    crops = min(pan_and_scan_max_num_crops, max(2, crops))
    if min(math.ceil(long / crops), short) < pan_and_scan_min_crop_size:
        return 0
    return crops


class Gemma3(ModelFamily):
    """Gemma 3 (Gemma3ForConditionalGeneration): see the module docstring."""

    name = "gemma3"
    image_token = "<start_of_image>"  # what the chat template renders for each image
    media_closing_tokens = ("<end_of_image>",)  # closes each image's (and video's) run
    feature_token = "<image_soft_token>"
    end_of_turn = "<end_of_turn>"
    vision_keys = ("pixel_values",)  # a sample's num_crops only checks its image processor
    token_keys = ("token_type_ids",)
    packed_mask = "gemma3"  # its sliding-window layers' mask (mmdp.models.gemma3_masks)
    # each 896 px image (or crop) is 256 soft tokens (about 260 with <start_of_image>,
    # <end_of_image> and the newlines around them) and 64 x 64 = 4,096 SigLIP patches: 2,048
    # tokens hold at most 7 images, so 8 images' patches bind only with pan-and-scan crops
    # (measured: 4 images' patches left the packs 65% full of tokens, 05 --num-rows 300)
    default_max_length = 2048
    default_max_patches = 8 * 4096

    def __init__(
        self,
        processor,
        *,
        do_pan_and_scan: bool = False,
        pan_and_scan_min_crop_size: int = 256,
        pan_and_scan_max_num_crops: int = 4,
        pan_and_scan_min_ratio_to_activate: float = 1.2,
    ):
        """Pan-and-scan settings under transformers' names, defaults as Gemma3Processor's
        (processing_gemma3.py:26-33; the checkpoint's preprocessor_config.json leaves them null)."""
        self.pan_and_scan = {
            "do_pan_and_scan": do_pan_and_scan,
            "pan_and_scan_min_crop_size": pan_and_scan_min_crop_size,
            "pan_and_scan_max_num_crops": pan_and_scan_max_num_crops,
            "pan_and_scan_min_ratio_to_activate": pan_and_scan_min_ratio_to_activate,
        }
        self.image_texts = {}  # crops -> the image's text, with one soft token per run
        super().__init__(processor)

    def read_settings(self) -> dict:
        """The image processor's effective size (patches per image or crop), and pan-and-scan:
        the family's setting, which it passes at every call. One the image processor was given
        (as an attribute, or when built) and the family says otherwise is refused: the
        processor would never apply it (Gemma3Processor sends its own, and so does mmdp)."""
        settings = effective_settings(self.processor.image_processor)
        self.patches_per_run = (settings["size"]["height"] // PATCH_SIZE) ** 2
        for name, ours in self.pan_and_scan.items():
            theirs = settings.get(name)
            if theirs is not None and theirs != ours:
                raise UserError(
                    f"the image processor has {name}={theirs!r}, which Gemma3Processor (and mmdp) "
                    f"never applies: pass it to the family, Gemma3(processor, {name}={theirs!r})"
                )
        return {"patches_per_run": self.patches_per_run, "pan_and_scan": self.pan_and_scan}

    def crops(self, width: int, height: int) -> int:
        if not self.pan_and_scan["do_pan_and_scan"]:
            return 0
        settings = {k: v for k, v in self.pan_and_scan.items() if k != "do_pan_and_scan"}
        return pan_and_scan_crops(width, height, **settings)

    def image_text(self, crops: int) -> str:
        """The processor's own text for an image with `crops` crops
        (Gemma3Processor.replace_image_token), each run of soft tokens written as one."""
        if crops not in self.image_texts:
            expanded = self.processor.replace_image_token({"num_crops": [crops]}, 0)
            run = self.feature_token * self.processor.image_seq_length
            self.image_texts[crops] = expanded.replace(run, self.feature_token)
        return self.image_texts[crops]

    def image_layout(self, width: int, height: int, images_in_sample: int) -> ImageLayout:
        """Any size is accepted (1x1 too: it is resized); 1 + crops runs of soft tokens."""
        runs = 1 + self.crops(width, height)
        return ImageLayout(
            self.image_text(runs - 1),
            (self.processor.image_seq_length,) * runs,
            runs * self.patches_per_run,
        )

    def vision_inputs(self, images: list) -> dict:
        """pixel_values [images + crops, 3, 896, 896], each image followed by its crops (the order
        of their runs in the text), and num_crops per image (which Gemma3Processor drops)."""
        out = self.processor.image_processor(
            images=images, return_tensors="pt", **self.pan_and_scan
        )
        return {
            "pixel_values": out["pixel_values"],
            "num_crops": torch.as_tensor(out["num_crops"], dtype=torch.long).flatten(),
        }

    def check_vision(self, vision: dict, layouts: list[ImageLayout]) -> None:
        made = vision["num_crops"].tolist() if vision else []
        weighed = [len(layout.runs) - 1 for layout in layouts]
        rows = len(vision["pixel_values"]) if vision else 0
        if made != weighed or rows != sum(weighed) + len(layouts):
            raise RuntimeError(
                f"weighed {weighed} pan-and-scan crops, the image processor made {made} "
                f"({rows} pixel rows)"
            )

    def model_settings(self) -> dict:
        """...and the soft tokens an image's run holds, which the model's vision tower makes."""
        return {**super().model_settings(), "mm_tokens_per_image": self.processor.image_seq_length}

    def fingerprint(self) -> dict:
        """The processor's, plus pan-and-scan: a setting of the family, not of the processor."""
        return {**super().fingerprint(), "pan_and_scan": self.pan_and_scan}


# Building a processor and a model offline ------------------------------------------------------


def offline_processor(
    family: type[Gemma3] = Gemma3,
    image_size: int = IMAGE_SIZE,
    image_seq_length: int = IMAGE_SEQ_LENGTH,
):
    """A Gemma3Processor with no network: the real Gemma3ImageProcessor with the checkpoint's
    settings (see IMAGE_SIZE), mmdp's SmolLM2 tokenizer plus Gemma 3's image and turn tokens under
    Gemma's names, and the real chat template."""
    tokenizer = gemma_tokenizer(IMAGE_TOKENS, TURN_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    image_processor = Gemma3ImageProcessor(
        size={"height": image_size, "width": image_size},
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
        resample=PILImageResampling.BILINEAR,
    )
    return Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        image_seq_length=image_seq_length,
    )


def gemma_tokenizer(media_tokens: dict, turn_tokens: list):
    """mmdp's SmolLM2 tokenizer plus a Gemma's media tokens (under the names its processor reads
    them by), Gemma's own names for bos, eos and pad, and its turn tokens (Gemma 3's and 4's)."""
    tokenizer = AutoTokenizer.from_pretrained(
        config.DEFAULT_TOKENIZER, extra_special_tokens=dict(media_tokens)
    )
    tokenizer.add_special_tokens(dict(NAMED_TOKENS))
    tokenizer.add_tokens(turn_tokens, special_tokens=True)
    return tokenizer


def tiny_processor(family: type[Gemma3] = Gemma3):
    """offline_processor at 28 px and 4 soft tokens per image, for tiny_model: at 896 px, SigLIP
    would attend over 4,096 patches per image and every image would add 256 tokens, too slow for
    a CPU test. Everything else is the real processor's."""
    return offline_processor(family, TINY_IMAGE_SIZE, TINY_IMAGE_SEQ_LENGTH)
