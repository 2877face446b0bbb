"""InternVL (InternVL3, InternVL3.5: InternVLProcessor): GotOcr2 tiles of 448 px, 256 tokens each.

What the processor does with an image of width x height (transformers 5.23, InternVLProcessor and
GotOcr2ImageProcessor):

    1. Pick the grid of cols x rows tiles, min_patches to max_patches (1 to 12) in all, whose
       aspect ratio is nearest the image's; a tie goes to more tiles while they cover less than
       twice the image (get_optimal_tiled_canvas). Resize the image to the grid and cut it into
       448 px tiles; with more than one, the whole image resized to one tile comes last (the
       thumbnail): 1 to 13 tiles, a 640x480 photo 4 x 3 + 1 = 13. InternVLProcessor asks for this
       at every call (crop_to_patches=True, its images_kwargs), whatever its image processor says.
    2. Each tile is image_seq_length (256) <IMG_CONTEXT> tokens: InternViT's (448 / 14)^2 = 1,024
       patches, pixel-shuffled 2 x 2 (downsample_ratio 0.5). The text is "<img>", the image's
       tiles x 256 <IMG_CONTEXT>, "</img>" (replace_image_token). The image processor's own
       get_number_of_image_patches counts the tiles.

A video: each sampled frame one tile, "FrameN: <img>" + 256 <IMG_CONTEXT> + "</img>", a line each
(replace_video_token). The model takes the images' tiles and the videos' frames in ONE
pixel_values, in the order of their tokens (InternVLProcessor.__call__): mmdp lays out a sample's
images, then its videos, and drops a sample whose text puts a video before an image
(`video_refused`).

What a packed batch carries: pixel_values [tiles and frames, 3, 448, 448] in the order of their
tokens, and nothing else of its own. The language model (Qwen2, Qwen3) is a plain causal LM: packed
samples are kept apart by their restarting position_ids, or cu_seq_lens under FlashAttention, as
for every family. The model checks only the total of <IMG_CONTEXT> tokens against the features
(InternVLModel.get_placeholder_mask): tiles out of order are silent (tests/test_families.py's trap).

`offline_processor(InternVL)` builds the InternVL3 processor with no network; `tiny_processor` the
same with 56 px tiles of 4 tokens, for mmdp.models.tiny.internvl's random model.
"""

import torch
from transformers import (
    AutoTokenizer,
    GotOcr2ImageProcessor,
    InternVLProcessor,
    InternVLVideoProcessor,
)

from mmdp import config
from mmdp.data.families.base import (
    ImageLayout,
    ModelFamily,
    concatenate,
    effective_settings,
    plain_settings,
)
from mmdp.data.videos import BadVideo
from mmdp.drop_reasons import VIDEO_REFUSED

# OpenGVLab/InternVL3-*-hf's chat template, as transformers' convert_internvl_weights_to_hf.py
# writes it: ChatML (Qwen2.5's, SmolLM2's too), each image <IMG_CONTEXT> and each video <video>
# on a line of its own, no {% generation %} markers.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "{{ '<IMG_CONTEXT>\\n' }}{% elif content['type'] == 'video' %}{{ '<video>\\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{'<|im_start|>assistant\\n' }}{% endif %}"
)
# The tokens InternVLProcessor reads from the tokenizer (InternVLProcessor.__init__), as the
# conversion script names them.
SPECIAL_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
# The conversion script's image processor for InternVL3 (448 px tiles, ImageNet's mean and std;
# min_patches 1 and max_patches 12 are the class defaults), 256 tokens a tile.
IMAGE_SETTINGS = {
    "size": {"height": 448, "width": 448},
    "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225],
}
IMAGE_SEQ_LENGTH = 256
# InternViT's patches a token: every InternVL pixel-shuffles its features 2 x 2
# (downsample_ratio 0.5)
PATCHES_PER_TOKEN = 4
# The frames the offline processors sample from every clip: the synthetic clips have 4 to 24.
VIDEO_FRAMES = 4
# tiny_processor: 56 px tiles of 14 px patches, (56 / 14)^2 / 4 = 4 tokens a tile
TINY_IMAGE_SETTINGS = {**IMAGE_SETTINGS, "size": {"height": 56, "width": 56}}
TINY_IMAGE_SEQ_LENGTH = 4
# The image processor's settings that decide an image's tiles, as it resolves them.
TILING_SETTINGS = ("size", "min_patches", "max_patches")


class InternVL(ModelFamily):
    """InternVL (InternVLForConditionalGeneration): see the module docstring."""

    name = "internvl"
    image_token = feature_token = video_feature_token = "<IMG_CONTEXT>"
    video_token = "<video>"
    media_closing_tokens = ("</img>",)  # closes each image's (and frame's) run
    end_of_turn = "<|im_end|>"
    vision_keys = ("pixel_values",)  # the videos' frames too: no video key of its own
    # InternVL3's own context (8,192 tokens): two 13-tile images (3,330 tokens each) and text;
    # the patches of the 32 tiles 8,192 tokens can hold (4 a token), so that tokens bind first
    # (27 tiles' patches left 14% of the tokens as padding: 05 --model internvl --num-rows 200)
    default_max_length = 8192
    default_max_patches = 8192 * PATCHES_PER_TOKEN

    def read_settings(self) -> dict:
        """The image processor's effective tile size and tile counts (as its preprocess resolves
        them; crop_to_patches is always the processor's), and the processor's tokens a tile."""
        self.tiling = plain_settings(
            effective_settings(self.processor.image_processor), TILING_SETTINGS
        )
        self.per_tile = self.processor.image_seq_length
        return {**self.tiling, "image_seq_length": self.per_tile}

    def image_layout(self, width: int, height: int, images_in_sample: int) -> ImageLayout:
        """Any size; the processor's own tiles (get_number_of_image_patches) and text."""
        tiling = {**self.tiling, "patch_size": self.tiling["size"], "crop_to_patches": True}
        tiles = self.processor.image_processor.get_number_of_image_patches(height, width, tiling)
        text = self.processor.replace_image_token({"num_patches": [1]}, 0)
        text = text.replace(self.feature_token * self.per_tile, self.feature_token)
        return ImageLayout(
            text, (tiles * self.per_tile,), tiles * self.per_tile * PATCHES_PER_TOKEN
        )

    def video_layout(self, metadata, frames: list[int]) -> ImageLayout:
        text = self.processor.replace_video_token(
            {"pixel_values_videos": [torch.empty(len(frames))]}, 0
        )
        text = text.replace(self.feature_token * self.per_tile, self.feature_token)
        patches = len(frames) * self.per_tile * PATCHES_PER_TOKEN
        return ImageLayout(text, (self.per_tile,) * len(frames), patches, video=True)

    def expanded_text(self, turns, layouts, labels=True, system=None):
        """...and the row refused when its text puts a video before an image (see the module
        docstring): its frames would take the image's features."""
        text, spans, ordered = super().expanded_text(turns, layouts, labels, system)
        if any(a.video and not b.video for a, b in zip(ordered, ordered[1:])):
            raise BadVideo(VIDEO_REFUSED, "InternVL: a video before an image in one sample")
        return text, spans, ordered

    def vision_inputs(self, images: list) -> dict:
        out = self.processor.image_processor(images, crop_to_patches=True, return_tensors="pt")
        return {"pixel_values": out["pixel_values"]}

    def video_inputs(self, videos: list, metadata: list) -> dict:
        """Each video's frames as tiles."""
        frames = self.processed_videos(videos, metadata)["pixel_values_videos"]
        return {"pixel_values_videos": frames.flatten(0, 1)}

    def check_vision(self, vision: dict, layouts: list[ImageLayout]) -> None:
        made = sum(len(vision.get(key, ())) for key in ("pixel_values", "pixel_values_videos"))
        weighed = sum(layout.patches for layout in layouts) // (self.per_tile * PATCHES_PER_TOKEN)
        if made != weighed:
            raise RuntimeError(f"weighed {weighed} tiles and frames, the processors made {made}")

    def collate_vision(self, samples: list[dict]) -> dict:
        """Every sample's tiles, then its frames, in sample order: one pixel_values, as the model
        takes them; none when no sample has an image or a video."""
        keys = ("pixel_values", "pixel_values_videos")
        tiles = [s[key] for s in samples for key in keys if key in s]
        return {"pixel_values": concatenate(tiles)} if tiles else {}


def offline_processor(
    family: type[InternVL] = InternVL,
    settings: dict = IMAGE_SETTINGS,
    image_seq_length: int = IMAGE_SEQ_LENGTH,
):
    """An InternVLProcessor with no network: the real GotOcr2ImageProcessor and video processor
    with InternVL3's settings (4 frames a video: VIDEO_FRAMES), mmdp's SmolLM2 tokenizer plus
    InternVL's image tokens, and the real chat template."""
    tokenizer = AutoTokenizer.from_pretrained(
        config.DEFAULT_TOKENIZER, extra_special_tokens=dict(SPECIAL_TOKENS)
    )
    videos = InternVLVideoProcessor(**settings, do_sample_frames=True, num_frames=VIDEO_FRAMES)
    return InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(**settings),
        tokenizer=tokenizer,
        video_processor=videos,
        image_seq_length=image_seq_length,
        chat_template=CHAT_TEMPLATE,
    )


def tiny_processor(family: type[InternVL] = InternVL):
    """offline_processor with 56 px tiles of 4 tokens, for tiny_model: at 448 px a photo is 13
    tiles of 256 tokens, too slow for a CPU test. The same rules apply."""
    return offline_processor(family, TINY_IMAGE_SETTINGS, TINY_IMAGE_SEQ_LENGTH)
