"""Gemma 4: each image its own number of soft tokens, padded patches, bidirectional images.

What the processor does with an image of width x height (transformers 5.23, Gemma4Processor and
Gemma4ImageProcessor; k = pooling_kernel_size, 3 in every checkpoint):

    1. Resize it, aspect ratio kept, to the largest size whose sides are multiples of k x 16 px
       and which holds at most max_soft_tokens x k^2 patches of 16 px
       (get_aspect_ratio_preserving_size in image_processing_gemma4; 1x1 and 4000x300 images too).
    2. Its soft tokens are its patches / k^2: at the checkpoints' 280, a 640x480 photo has 266,
       a 4000x300 strip 244. The text is "<|image>" + that many "<|image|>" + "<image|>"
       (Gemma4Processor.replace_image_token).
    3. pixel_values holds every image's patches padded to max_soft_tokens x k^2 rows (2,520 at
       280), image_position_ids their (x, y), -1 on padding: the vision encoder attends over the
       padded rows too, so each image costs the encoder 2,520 patches whatever its size.

A video (Gemma4VideoProcessor): the frames the video processor samples (the checkpoints' 32; a
clip with fewer is refused by its own rule, counted as `video_refused`), each resized as an image
at the video's max_soft_tokens (70); the text is one "mm:ss <|image>" + soft tokens + "<image|>"
a frame, joined by spaces (Gemma4Processor.replace_video_token), with <|video|> as soft token.

What a packed batch must carry (modeling_gemma4.py):

    mm_token_type_ids   [B, L]: 1 on image soft tokens, 2 on video ones. With the 26B and 31B
                        models' use_bidirectional_attention="vision", each image (each frame) is
                        bidirectional in the sliding-window layers, causal in the global ones.
    attention_mask      a dict {"full_attention", "sliding_attention"} built by
                        mmdp.models.gemma3_masks, as for Gemma 3: transformers 5.23 builds the
                        sliding mask wrong in packed rows.
    pixel_values, image_position_ids             every image, in the order of its tokens
    pixel_values_videos, video_position_ids, num_frames_per_video   every video's frames
    position_ids, cu_seq_lens_q/k, max_length_q/k   as for every packed batch

Audio, which Gemma 4 also takes, is not packed yet: a row with audio is dropped and counted
(`audio_refused`, mmdp.data.conversation), as for every family.

`offline_processor(Gemma4)` builds the checkpoints' processor with no network; `tiny_processor`
the same with 8 px patches, for mmdp.models.tiny.gemma4's random Gemma4ForConditionalGeneration.
"""

import copy

import torch
from transformers import Gemma4ImageProcessor, Gemma4Processor, Gemma4VideoProcessor
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4.image_processing_gemma4 import get_aspect_ratio_preserving_size

from mmdp.data.families.base import ImageLayout, ModelFamily, effective_settings, plain_settings
from mmdp.data.families.gemma3 import gemma_tokenizer
from mmdp.errors import UserError

# The instruction-tuned checkpoints' chat template (chat_template.jinja of google/gemma-4-*-it,
# which transformers' models/gemma4/convert_gemma4_weights.py saves with them), without its tool
# and thinking branches: a model reply's text is trimmed (its thought channel, if any, would be
# stripped), each image is <|image|>, the generation prompt opens an empty thought channel.
CHAT_TEMPLATE = (
    "{{- bos_token -}}{%- set loop_messages = messages -%}"
    "{%- if messages[0]['role'] in ['system', 'developer'] -%}{{- '<|turn>system\\n' -}}"
    "{%- if messages[0]['content'] is string -%}{{- messages[0]['content'] | trim -}}{%- else -%}"
    "{%- for item in messages[0]['content'] -%}{{- item['text'] | trim + ' ' -}}{%- endfor -%}"
    "{%- endif -%}{{- '<turn|>\\n' -}}{%- set loop_messages = messages[1:] -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<|turn>' + role + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{- item['text'] | trim -}}"
    "{%- elif item['type'] == 'image' -%}{{- '<|image|>' -}}"
    "{%- elif item['type'] == 'audio' -%}{{- '<|audio|>' -}}"
    "{%- elif item['type'] == 'video' -%}{{- '<|video|>' -}}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}{{- '<turn|>\\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}"
    "{{- '<|turn>model\\n<|channel>thought\\n<channel|>' -}}{%- endif -%}"
)
# The tokens Gemma4Processor reads from the tokenizer (processing_gemma4.py, __init__: it
# refuses every call without the audio ones), under the real tokenizer's names; <|video|> it adds
# itself. Then the turn and channel tokens of the template (Gemma's own names for bos, eos and
# pad are Gemma 3's: gemma_tokenizer).
IMAGE_TOKENS = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>"}
AUDIO_TOKENS = {"audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}
TURN_TOKENS = ["<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|video|>"]
# The image processor's settings that decide an image's soft tokens, as it resolves them.
GRID_SETTINGS = ("do_resize", "patch_size", "max_soft_tokens", "pooling_kernel_size")
# The checkpoints' (convert_gemma4_weights.py: the classes' defaults but for the image's soft
# tokens): 280 soft tokens an image; 70 a frame and 32 frames a video.
IMAGE_SETTINGS = {"max_soft_tokens": 280}
VIDEO_SETTINGS = {"max_soft_tokens": 70, "num_frames": 32}
# The tests' (tiny_processor): 8 px patches pooled 2 x 2, the fewest soft tokens the processors
# accept (70), and 2 frames a video.
TINY_SETTINGS = {"patch_size": 8, "pooling_kernel_size": 2, "max_soft_tokens": 70}


class Gemma4(ModelFamily):
    """Gemma 4 (Gemma4ForConditionalGeneration): see the module docstring."""

    name = "gemma4"
    image_token = feature_token = "<|image|>"
    video_token = video_feature_token = "<|video|>"
    media_closing_tokens = ("<image|>",)  # closes each image's (and each frame's) run
    end_of_turn = "<turn|>"
    vision_keys = ("pixel_values", "image_position_ids")
    video_keys = ("pixel_values_videos", "video_position_ids", "num_frames_per_video")
    token_keys = ("mm_token_type_ids",)
    packed_mask = "gemma4"  # its sliding-window layers' mask (mmdp.models.gemma3_masks)
    # an image is at most 282 tokens and 2,520 patches (padded): 4,096 tokens hold 14 images, or a
    # 32-frame video (about 2,500 tokens, 20,160 patches) with a few images
    default_max_length = 4096
    default_max_patches = 16 * 2520

    def read_settings(self) -> dict:
        """The image and video processors' effective grids (as their preprocess resolves them),
        and how the video processor samples frames. One that does not resize is refused: its
        padded patches would not hold a large image."""
        image = effective_settings(self.processor.image_processor)
        video = effective_settings(self.processor.video_processor)
        if not (image["do_resize"] and video["do_resize"]):
            raise UserError(
                "a Gemma 4 image or video processor with do_resize=False cannot pad a large image "
                "to its patch budget; mmdp packs for it with do_resize=True"
            )
        self.image = plain_settings(image, GRID_SETTINGS)
        self.video = plain_settings(
            video, (*GRID_SETTINGS, "do_sample_frames", "num_frames", "fps")
        )
        return {"image": self.image, "video": self.video}

    def model_settings(self) -> dict:
        return {**super().model_settings(), "video_token_id": self.feature_token_ids[1]}

    def image_layout(self, width: int, height: int, images_in_sample: int) -> ImageLayout:
        """Any size (the processor resizes it); the processor's own text, with one soft token."""
        text = self.processor.replace_image_token({"num_soft_tokens_per_image": [1]}, 0)
        return ImageLayout(text, (soft_tokens(width, height, self.image),), padded(self.image))

    def video_layout(self, metadata, frames: list[int]) -> ImageLayout:
        """One run of soft tokens a frame, its text the processor's own (timestamps included)."""
        sampled = copy.copy(metadata)
        sampled.frames_indices = frames
        video = {"num_soft_tokens_per_video": [1], "video_metadata": [sampled]}
        text = self.processor.replace_video_token(video, 0)
        runs = (soft_tokens(metadata.width, metadata.height, self.video),) * len(frames)
        return ImageLayout(text, runs, len(frames) * padded(self.video), video=True)

    def vision_inputs(self, images: list) -> dict:
        out = self.processor.image_processor(images=images, return_tensors="pt")
        return {key: out[key] for key in (*self.vision_keys, "num_soft_tokens_per_image")}

    def video_inputs(self, videos: list, metadata: list) -> dict:
        """...and each video's soft tokens a frame (check_vision)."""
        out = self.processed_videos(videos, metadata)
        vision = {key: out[key] for key in self.video_keys}
        return {**vision, "num_soft_tokens_per_frame": out["num_soft_tokens_per_video"]}

    def check_vision(self, vision: dict, layouts: list[ImageLayout]) -> None:
        """The soft tokens made, image by image and frame by frame, must be the ones weighed."""
        made = vision.get("num_soft_tokens_per_image", torch.zeros(0)).tolist()
        frames = vision.get("num_frames_per_video", torch.zeros(0)).tolist()
        per_frame = vision.get("num_soft_tokens_per_frame", torch.zeros(0)).tolist()
        made += [tokens for tokens, n in zip(per_frame, frames) for _ in range(n)]
        weighed = [run for layout in layouts for run in layout.runs]
        if made != weighed:
            raise RuntimeError(f"weighed {weighed} soft tokens, the processor made {made}")


def soft_tokens(width: int, height: int, grid: dict) -> int:
    """The soft tokens of an image (or frame) of width x height, by the processor's own resize.

    >>> grid = {"patch_size": 16, "max_soft_tokens": 280, "pooling_kernel_size": 3}
    >>> soft_tokens(640, 480, grid), soft_tokens(1, 1, grid), soft_tokens(4000, 300, grid)
    (266, 256, 244)
    """
    patch, k = grid["patch_size"], grid["pooling_kernel_size"]
    height, width = get_aspect_ratio_preserving_size(
        height, width, patch, grid["max_soft_tokens"] * k * k, k
    )
    return (height // patch) * (width // patch) // (k * k)


def padded(grid: dict) -> int:
    """The patches each image (or frame) takes in pixel_values: max_soft_tokens x k^2."""
    return grid["max_soft_tokens"] * grid["pooling_kernel_size"] ** 2


# Building a processor offline ---------------------------------------------------------------


def offline_processor(
    family: type[Gemma4] = Gemma4, image: dict = IMAGE_SETTINGS, video: dict = VIDEO_SETTINGS
):
    """A Gemma4Processor with no network: the image, video and audio processors with the
    checkpoints' settings, mmdp's SmolLM2 tokenizer plus Gemma 4's media, turn and channel tokens
    under Gemma's names, and the chat template."""
    return Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessor(**image),
        tokenizer=gemma_tokenizer({**IMAGE_TOKENS, **AUDIO_TOKENS}, TURN_TOKENS),
        video_processor=Gemma4VideoProcessor(**video),
        chat_template=CHAT_TEMPLATE,
        image_seq_length=image["max_soft_tokens"],
    )


def tiny_processor(family: type[Gemma4] = Gemma4):
    """offline_processor with 8 px patches pooled 2 x 2 and 70 soft tokens an image (2 frames a
    video), for tiny_model: the real 2,520 padded patches of 768 values an image make a CPU test
    slow. The same rules (resize, soft tokens, text, padding) apply."""
    return offline_processor(family, TINY_SETTINGS, {**TINY_SETTINGS, "num_frames": 2})
