"""Qwen2.5-VL and Qwen3-VL: each image its own number of tokens, and 4-row positions.

What the processor does with an image of width x height (Qwen2VLImageProcessor, shared by both):
resize it to a multiple of patch_size * merge_size within [min_pixels, max_pixels] (smart_resize;
an aspect ratio over 200 is refused), cut it into patch_size^2 patches (one row of pixel_values
each: the vision encoder's work), and give the language model one <|image_pad|> token per
merge_size^2 patches. `image_processor.get_number_of_image_patches` applies that rule to a width
and height alone: mmdp weighs with it, no pixel decoded.

What a packed batch must carry (transformers 5.23, modeling_qwen2_5_vl.py / modeling_qwen3_vl.py):

    position_ids    [4, B, L]: row 0 the text positions, restarting at 0 for each sample (the
                    per-sample mask and FlashAttention read it); rows 1-3 each sample's own 3-D
                    rope index (temporal, height, width), computed with the model class's own
                    get_rope_index on that sample alone. With [3, B, L] (what several trainers
                    pass) the model finds no text row, builds one causal mask over the whole row,
                    and samples attend to each other (tests/test_families.py shows it).
    pixel_values    every image's patch rows, in the order of their tokens; image_grid_thw
                    [images, 3] likewise (the vision encoder attends within each image only)
    mm_token_type_ids  1 on image tokens (the model reads it only to compute positions itself)
    cu_seq_lens_q/k, max_length_q/k  for FlashAttention, as for every packed batch

`offline_processor(name)` builds a processor with no network: the real Qwen2VLImageProcessor with
the family's settings, mmdp's SmolLM2 tokenizer plus Qwen's vision tokens, and a chat template of
the family's shape. Its tiny random model (tests) is mmdp.models.tiny.qwen_vl.
"""

import torch
import transformers
from transformers import AutoTokenizer, Qwen2VLImageProcessor

from mmdp import config
from mmdp.data.families.base import ImageLayout, ModelFamily
from mmdp.data.images import BadImage
from mmdp.drop_reasons import IMAGE_SIZE_REFUSED

# Qwen2.5-VL-*-Instruct's chat template (as transformers pins it in
# tests/models/qwen2_5_vl/test_processor_qwen2_5_vl.py): a default system prompt, each image
# rendered as <|vision_start|><|image_pad|><|vision_end|>, no {% generation %} markers.
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen3-VL's template has the same shape without the default system prompt.
QWEN3_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' %}"
    "<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen's vision tokens, named as its processors look them up on the tokenizer.
SPECIAL_TOKENS = {
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
}


class QwenVL(ModelFamily):
    """What Qwen2.5-VL and Qwen3-VL share (see the module docstring)."""

    image_token = feature_token = "<|image_pad|>"
    end_of_turn = "<|im_end|>"
    vision_keys = ("pixel_values", "image_grid_thw")
    token_keys = ("mm_token_type_ids",)
    model_class = None  # the transformers model whose get_rope_index computes positions
    config_class = None
    # a pack of a few images: Qwen2.5-VL gives a 448 px image 256 tokens and 1,024 patches
    default_max_length = 2048
    default_max_patches = 8192

    def __init__(self, processor):
        super().__init__(processor)
        self.merge_size = processor.image_processor.merge_size
        self.rope = RopeIndex(
            self.model_class, self.config_class, self.merge_size, self.feature_token_id
        )

    def image_layout(self, width: int, height: int, images_in_sample: int) -> ImageLayout:
        try:
            patches = self.processor.image_processor.get_number_of_image_patches(height, width, {})
        except (
            ValueError
        ) as error:  # smart_resize: "absolute aspect ratio must be smaller than 200"
            raise BadImage(IMAGE_SIZE_REFUSED, f"{width}x{height}: {error}") from error
        return ImageLayout(self.feature_token, (patches // self.merge_size**2,), patches)

    def check_vision(self, vision: dict, layouts: list[ImageLayout]) -> None:
        grid = vision.get("image_grid_thw")
        made = [] if grid is None else grid.prod(-1).tolist()
        weighed = [layout.patches for layout in layouts]
        if made != weighed:
            raise RuntimeError(f"weighed {weighed} patches, the image processor made {made}")

    def positions(self, input_ids: torch.Tensor, vision: dict) -> torch.Tensor:
        """[4, n]: 0..n-1, then the model's own 3-D rope index of this sample alone."""
        return torch.cat([torch.arange(len(input_ids))[None], self.rope(input_ids, vision)])


class RopeIndex:
    """A Qwen-VL model class's own get_rope_index, with only what it reads: the merge size.

    The method needs none of the model's weights, only `self.config` and the class's
    get_vision_position_ids; this calls the class's functions on a stand-in holding just those,
    so that a DataLoader worker computes positions exactly as the model would, without a model.
    """

    def __init__(self, model_class, config_class, merge_size: int, image_token_id: int):
        self.model_class = model_class
        self.config = config_class(vision_config={"spatial_merge_size": merge_size})
        self.image_token_id = image_token_id

    def get_vision_position_ids(self, *args, **kwargs):
        return self.model_class.get_vision_position_ids(self, *args, **kwargs)

    def __call__(self, input_ids: torch.Tensor, vision: dict) -> torch.Tensor:
        """The [3, n] rope index of one sample."""
        is_image = (input_ids == self.image_token_id).long()
        grid = vision.get("image_grid_thw")
        index, _ = self.model_class.get_rope_index(
            self, input_ids[None], mm_token_type_ids=is_image[None], image_grid_thw=grid
        )
        return index[:, 0]


class Qwen2_5_VL(QwenVL):
    name = "qwen2_5_vl"
    model_class = transformers.Qwen2_5_VLModel
    config_class = transformers.Qwen2_5_VLConfig


class Qwen3VL(QwenVL):
    name = "qwen3_vl"
    model_class = transformers.Qwen3VLModel
    config_class = transformers.Qwen3VLConfig


def offline_processor(family: type[QwenVL]):
    """A processor of `family` built with no network (see the module docstring)."""
    tokenizer = AutoTokenizer.from_pretrained(
        config.DEFAULT_TOKENIZER, extra_special_tokens=dict(SPECIAL_TOKENS)
    )
    if family is Qwen3VL:  # Qwen3-VL's preprocessor_config.json
        image_processor = Qwen2VLImageProcessor(
            patch_size=16,
            merge_size=2,
            temporal_patch_size=2,
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
            size={"shortest_edge": 65536, "longest_edge": 16777216},
        )
        return transformers.Qwen3VLProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=transformers.Qwen3VLVideoProcessor(),
            chat_template=QWEN3_VL_CHAT_TEMPLATE,
        )
    return transformers.Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(),  # the class defaults are Qwen2.5-VL's settings
        tokenizer=tokenizer,
        video_processor=transformers.Qwen2VLVideoProcessor(),
        chat_template=QWEN2_5_VL_CHAT_TEMPLATE,
    )
