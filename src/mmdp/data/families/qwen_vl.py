"""Qwen2.5-VL, Qwen3-VL and Qwen3.5: each image its own number of tokens, and 4-row positions.

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
    mm_token_type_ids  1 on image tokens, 2 on video tokens (the model reads it only to compute
                    positions itself)
    pixel_values_videos, video_grid_thw  every video's patch rows and grid, in token order;
                    second_per_grid_ts (Qwen2.5-VL) the seconds each temporal patch spans, which
                    spaces its temporal positions
    cu_seq_lens_q/k, max_length_q/k  for FlashAttention, as for every packed batch

`offline_processor(name)` builds a processor with no network: the real Qwen2VLImageProcessor with
the family's settings, mmdp's SmolLM2 tokenizer plus Qwen's vision tokens, and a chat template of
the family's shape. Its tiny random model (tests) is mmdp.models.tiny.qwen_vl.

Qwen3.5 (and Qwen3.5-MoE: the same processor) loads a Qwen3VLProcessor with Qwen3-VL's image
and video processors (Qwen/Qwen3.5-*'s preprocessor configs), weighed by Qwen3-VL's rules; its
tokenizer (a Qwen3_5Tokenizer), ids and chat template differ, and its model's linear-attention
layers need more than positions to keep samples apart (mmdp.models.inputs).

Videos (Qwen2VLVideoProcessor for Qwen2.5-VL, Qwen3VLVideoProcessor for Qwen3-VL): the processor
samples frames by its own rule (`sample_frames`: fps, min/max frames, rounded to the temporal
patch of 2), resizes every frame alike within the video's min/max pixels, and cuts the clip into
patches of 2 frames: `get_num_of_video_patches(frames, height, width)` gives the patches from the
container's header alone, and the processor's `replace_video_token` the text (Qwen3-VL: one
"<t seconds>" block per temporal patch). mmdp decodes only the sampled frames (mmdp.data.videos).
"""

import copy
import math
import re

import torch
import transformers
from transformers import AutoTokenizer, Qwen2VLImageProcessor

from mmdp import config
from mmdp.data.families.base import (
    TEXT_TYPE,
    VIDEO_TYPE,
    ImageLayout,
    ModelFamily,
    effective_settings,
    plain_settings,
)
from mmdp.data.images import BadImage
from mmdp.data.videos import BadVideo
from mmdp.drop_reasons import IMAGE_SIZE_REFUSED, VIDEO_REFUSED
from mmdp.errors import UserError

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
# Qwen3.5's (Qwen/Qwen3.5-27B's chat_template.jinja, without its tools and reasoning): each
# message's text trimmed, and each reply after the last user message opened by a thinking block,
# empty in the data mmdp packs (what the template renders with enable_thinking=False). An earlier
# reply has none, so the block moves when a turn is added (mmdp.data.conversation.reply_spans);
# it is not trained: the non-thinking generation prompt holds it.
QWEN3_5_CHAT_TEMPLATE = (
    "{% set last = namespace(user=0) %}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{% set last.user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for message in messages %}{% set content %}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in item %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}{% endset %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['role'] == 'assistant' and "
    "loop.index0 > last.user %}<think>\n\n</think>\n\n{% endif %}{{ content | trim }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "<think>\n\n</think>\n\n{% endif %}"
)
# Qwen's vision tokens, named as its processors look them up on the tokenizer.
SPECIAL_TOKENS = {
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
}


# The video processor's resolved settings that change a video's count (what the fingerprint
# names), and those of its frame sampling where it has them.
VIDEO_COUNT_SETTINGS = (
    "size",
    "patch_size",
    "merge_size",
    "temporal_patch_size",
    "cap_pixels_per_frame",
    "max_video_tokens",
)
VIDEO_SAMPLING = ("do_sample_frames", "fps", "num_frames", "min_frames", "max_frames")


class QwenVL(ModelFamily):
    """What Qwen2.5-VL and Qwen3-VL share (see the module docstring)."""

    image_token = feature_token = "<|image_pad|>"
    media_closing_tokens = ("<|vision_end|>",)  # closes each image's (and video's) run
    video_token = video_feature_token = "<|video_pad|>"
    end_of_turn = "<|im_end|>"
    vision_keys = ("pixel_values", "image_grid_thw")
    video_keys = ("pixel_values_videos", "video_grid_thw")
    token_keys = ("mm_token_type_ids",)
    position_rows = (4,)  # text positions, then the 3-D rope index (see `positions`)
    model_class = None  # the transformers model whose get_rope_index computes positions
    config_class = None
    tokens_per_second = None  # the vision config's, where the rope index reads one (videos)
    # a pack of a few images: Qwen2.5-VL gives a 448 px image 256 tokens and 1,024 patches
    default_max_length = 2048
    default_max_patches = 8192

    def __init__(self, processor, *, tokens_per_second: int | None = None):
        """`tokens_per_second` (Qwen2.5-VL): the model's vision_config.tokens_per_second, if it
        is not the released checkpoints' 2 (model_inputs refuses a batch built otherwise)."""
        if tokens_per_second is not None:
            self.tokens_per_second = tokens_per_second
        self.merge_size = None
        super().__init__(processor)

    def read_settings(self) -> dict:
        """The image processor's size after its own resolution (a min_pixels or max_pixels set as
        an attribute overrides `size`, Qwen2VLImageProcessor._standardize_kwargs), patch and merge
        sizes; the video processor's likewise, and how it samples frames (sample_frames reads
        its attributes itself). An image processor that does not resize is refused: its patches
        would not tile most images."""
        image = effective_settings(self.processor.image_processor)
        if not image["do_resize"]:
            raise UserError(
                f"{type(self.processor.image_processor).__name__} has do_resize=False, which "
                "breaks images whose sides are not multiples of its patch; mmdp packs for it "
                "with do_resize=True (its min_pixels and max_pixels bound the size)"
            )
        self.image_kwargs = {
            "min_pixels": image["size"]["shortest_edge"],
            "max_pixels": image["size"]["longest_edge"],
            "patch_size": image["patch_size"],
            "merge_size": image["merge_size"],
        }
        if image["merge_size"] != self.merge_size:  # the positions are computed with it
            self.merge_size = image["merge_size"]
            self.rope = RopeIndex(
                self.model_class, self.config_class, self.merge_size, self.tokens_per_second
            )
        settings = {"image": dict(self.image_kwargs)}
        videos = getattr(self.processor, "video_processor", None)
        if videos is not None:
            self.video = effective_settings(videos)
            names = (*VIDEO_COUNT_SETTINGS, *(k for k in VIDEO_SAMPLING if k in self.video))
            settings["video"] = plain_settings(self.video, names)
        return settings

    def model_settings(self) -> dict:
        """The feature tokens' ids, and what the positions were computed with: the merge size."""
        return {
            **super().model_settings(),
            "video_token_id": self.feature_token_ids[1],
            "vision_config.spatial_merge_size": self.merge_size,
        }

    def image_layout(self, width: int, height: int, images_in_sample: int) -> ImageLayout:
        """The processor's own count, given its effective settings (read_settings)."""
        image_processor = self.processor.image_processor
        try:
            patches = image_processor.get_number_of_image_patches(height, width, self.image_kwargs)
        except (
            ValueError
        ) as error:  # smart_resize: "absolute aspect ratio must be smaller than 200"
            raise BadImage(IMAGE_SIZE_REFUSED, f"{width}x{height}: {error}") from error
        return ImageLayout(self.feature_token, (patches // self.merge_size**2,), patches)

    def video_layout(self, metadata, frames: list[int]) -> ImageLayout:
        """The video's patches by the processor's own rule, and its text by the processor's own
        replace_video_token, given a grid of the same size (no pixel needed)."""
        videos = self.processor.video_processor
        try:
            patches = videos.get_num_of_video_patches(
                len(frames), metadata.height, metadata.width, self.video_settings(len(frames))
            )
        except ValueError as error:  # smart_resize: aspect ratio, or fewer frames than 2
            raise BadVideo(VIDEO_REFUSED, f"{metadata.width}x{metadata.height}: {error}") from error
        grid_t = math.ceil(len(frames) / self.video["temporal_patch_size"])
        sampled = copy.copy(metadata)
        sampled.frames_indices = frames
        grid = {
            "video_grid_thw": torch.tensor([[grid_t, patches // grid_t, 1]]),
            "video_metadata": [sampled],
        }
        text = self.processor.replace_video_token(grid, video_idx=0)
        runs = [
            len(m) // len(self.video_token)
            for m in re.findall(f"(?:{re.escape(self.video_token)})+", text)
        ]
        text = re.sub(f"(?:{re.escape(self.video_token)})+", self.video_token, text)
        return ImageLayout(text, tuple(runs), patches, video=True)

    def video_settings(self, frames: int) -> dict:
        """The video processor's effective settings (read_settings) for get_num_of_video_patches,
        which reads only its `size`, not a min_pixels or max_pixels attribute. Qwen2VLVideoProcessor's
        also leaves out its own cap_pixels_per_frame (get_num_of_video_patches against resize,
        video_processing_qwen2_vl.py): with the cap on, the size is capped here as resize caps it."""
        videos, video = self.processor.video_processor, self.video
        shortest, longest = video["size"]["shortest_edge"], video["size"]["longest_edge"]
        factor = video["patch_size"] * video["merge_size"]
        if isinstance(videos, transformers.Qwen2VLVideoProcessor) and video["cap_pixels_per_frame"]:
            total = int(video["max_video_tokens"] * factor * factor * 0.9)
            temporal = video["temporal_patch_size"]
            longest = max(min(longest, total * temporal // frames), int(shortest * 1.05))
        names = ("patch_size", "merge_size", "temporal_patch_size", "cap_pixels_per_frame")
        return {
            "size": {"shortest_edge": shortest, "longest_edge": longest},
            **{name: video[name] for name in names},
        }

    def check_vision(self, vision: dict, layouts: list[ImageLayout]) -> None:
        for key, video in (("image_grid_thw", False), ("video_grid_thw", True)):
            grid = vision.get(key)
            made = [] if grid is None else grid.prod(-1).tolist()
            weighed = [layout.patches for layout in layouts if layout.video == video]
            if made != weighed:
                raise RuntimeError(f"weighed {weighed} patches, the processor made {made} ({key})")

    def positions(self, input_ids: torch.Tensor, token_types: dict, vision: dict) -> torch.Tensor:
        """[4, n]: 0..n-1, then the model's own 3-D rope index of this sample alone."""
        rope = self.rope(input_ids, token_types["mm_token_type_ids"], vision)
        return torch.cat([torch.arange(len(input_ids))[None], rope])


class RopeIndex:
    """A Qwen-VL model class's own get_rope_index, with only what it reads: the merge size.

    The method needs none of the model's weights, only `self.config` and the class's
    get_vision_position_ids; this calls the class's functions on a stand-in holding just those,
    so that a DataLoader worker computes positions exactly as the model would, without a model.

    A sample without videos takes a shorter way to the same positions: get_rope_index groups the
    tokens into runs of one type one token at a time in Python (about 1.6 ms of a sample's
    2,000 tokens, the worker's second cost after the image processor); `image_positions` finds
    the runs at once and gives each image the class's own get_vision_position_ids
    (tests/test_families.py holds the two equal).
    """

    def __init__(self, model_class, config_class, merge_size: int, tokens_per_second=None):
        self.model_class = model_class
        self.merge_size = merge_size
        vision = {"spatial_merge_size": merge_size}
        if tokens_per_second is not None:
            vision["tokens_per_second"] = tokens_per_second
        self.config = config_class(vision_config=vision)

    def get_vision_position_ids(self, *args, **kwargs):
        return self.model_class.get_vision_position_ids(self, *args, **kwargs)

    def __call__(self, input_ids: torch.Tensor, types: torch.Tensor, vision: dict) -> torch.Tensor:
        """The [3, n] rope index of one sample whose tokens have mm_token_type_ids `types`."""
        if not (types == VIDEO_TYPE).any():
            return self.image_positions(types, vision.get("image_grid_thw"))
        index, _ = self.model_class.get_rope_index(
            self,
            input_ids[None],
            mm_token_type_ids=types[None],
            image_grid_thw=vision.get("image_grid_thw"),
            video_grid_thw=vision.get("video_grid_thw"),
            second_per_grid_ts=vision.get("second_per_grid_ts"),
        )
        return index[:, 0]

    def image_positions(self, types: torch.Tensor, image_grid_thw) -> torch.Tensor:
        """get_rope_index's [3, n] positions of a sample of text and images only: a run of text
        tokens counts on from the position after the last run on all three rows; a run of image
        tokens gets its image's (t, h, w) grid positions from there, and the next run starts
        max(h, w) / merge_size after it. Two text tokens, an image of grid (1, 4, 4) (4 tokens at
        merge size 2), one text token:

        >>> rope = RopeIndex(transformers.Qwen2_5_VLModel, transformers.Qwen2_5_VLConfig, 2)
        >>> rope.image_positions(torch.tensor([0, 0, 1, 1, 1, 1, 0]), torch.tensor([[1, 4, 4]]))
        tensor([[0, 1, 2, 2, 2, 2, 4],
                [0, 1, 2, 2, 3, 3, 4],
                [0, 1, 2, 3, 2, 3, 4]])
        """
        starts = torch.cat(
            [torch.zeros(1, dtype=torch.long), (types[1:] != types[:-1]).nonzero()[:, 0] + 1]
        )
        ends = [*starts[1:].tolist(), len(types)]
        grids = iter([] if image_grid_thw is None else image_grid_thw)
        runs, position = [], 0
        for kind, start, end in zip(types[starts].tolist(), starts.tolist(), ends):
            if kind == TEXT_TYPE:
                runs.append(torch.arange(position, position + end - start).expand(3, -1))
                position += end - start
            else:
                grid = next(grids)
                runs.append(self.get_vision_position_ids(position, grid, 1, self.merge_size))
                position += int(max(grid[1], grid[2])) // self.merge_size
        return torch.cat(runs, dim=1)


class Qwen2_5_VL(QwenVL):
    name = "qwen2_5_vl"
    model_class = transformers.Qwen2_5_VLModel
    config_class = transformers.Qwen2_5_VLConfig
    # A video's temporal positions step by tokens_per_second x second_per_grid_ts
    # (Qwen2_5_VLModel.get_rope_index, transformers 5.23). The released checkpoints' vision_config
    # says 2; transformers' Qwen2_5_VLVisionConfig defaults to 4: a model configured otherwise than
    # its batches gets other positions for its videos (tests/test_video.py shows it).
    tokens_per_second = 2
    video_keys = (*QwenVL.video_keys, "second_per_grid_ts")

    def model_settings(self) -> dict:
        """...and the tokens_per_second the videos' temporal positions were spaced by (the rope
        index's: transformers' default 4 when the family sets none)."""
        spaced_by = self.rope.config.vision_config.tokens_per_second
        return {**super().model_settings(), "vision_config.tokens_per_second": spaced_by}

    def video_inputs(self, videos: list, metadata: list) -> dict:
        """...and second_per_grid_ts, as Qwen2_5_VLProcessor computes it from the sampled fps
        (Qwen2_5_VLProcessor._process_videos)."""
        temporal = self.processor.video_processor.temporal_patch_size
        seconds = [temporal / m.sampled_fps for m in metadata]
        return {
            **super().video_inputs(videos, metadata),
            "second_per_grid_ts": torch.tensor(seconds),
        }


class Qwen3VL(QwenVL):
    name = "qwen3_vl"
    model_class = transformers.Qwen3VLModel
    config_class = transformers.Qwen3VLConfig


class Qwen3_5(Qwen3VL):
    """Qwen3.5 and Qwen3.5-MoE: Qwen3-VL's rules (their get_rope_index is Qwen3-VL's, line for
    line, in transformers 5.23), their own tokenizer and template (the module docstring)."""

    name = "qwen3_5"
    model_class = transformers.Qwen3_5Model
    config_class = transformers.Qwen3_5Config
    linear_attention = True


# How the offline processors sample and cap videos: qwen-vl-utils' rule, which the Qwen-VL
# models were trained with and ms-swift applies: 2 frames a second (at least 4), and each
# frame's pixels capped by the video's share of the token budget (cap_pixels_per_frame).
VIDEO_SETTINGS = {"do_sample_frames": True, "fps": 2, "cap_pixels_per_frame": True}


def offline_processor(family: type[QwenVL]):
    """A processor of `family` built with no network (see the module docstring)."""
    # Qwen3.5's tokenizer class is what tells it from Qwen3-VL (mmdp.data.families.BY_TOKENIZER)
    tokenizer_class = transformers.Qwen3_5Tokenizer if family is Qwen3_5 else AutoTokenizer
    tokenizer = tokenizer_class.from_pretrained(
        config.DEFAULT_TOKENIZER, extra_special_tokens=dict(SPECIAL_TOKENS)
    )
    if family is Qwen3_5:
        tokenizer.add_tokens(["<think>", "</think>"])  # added tokens in Qwen3.5's, not special
    if family is Qwen2_5_VL:
        return transformers.Qwen2_5_VLProcessor(
            image_processor=Qwen2VLImageProcessor(),  # the class defaults are Qwen2.5-VL's settings
            tokenizer=tokenizer,
            video_processor=transformers.Qwen2VLVideoProcessor(**VIDEO_SETTINGS),
            chat_template=QWEN2_5_VL_CHAT_TEMPLATE,
        )
    image_processor = Qwen2VLImageProcessor(  # Qwen3-VL's and Qwen3.5's preprocessor_config.json
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        size={"shortest_edge": 65536, "longest_edge": 16777216},
    )
    videos = dict(VIDEO_SETTINGS)
    if family is Qwen3_5:  # Qwen/Qwen3.5-*'s video_preprocessor_config.json
        videos["size"] = {"shortest_edge": 4096, "longest_edge": 25165824}
    return transformers.Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=transformers.Qwen3VLVideoProcessor(**videos),
        chat_template=QWEN3_5_CHAT_TEMPLATE if family is Qwen3_5 else QWEN3_VL_CHAT_TEMPLATE,
    )
