"""LLaVA-OneVision: AnyRes crops, one token count per image, and images per sample.

What the processor does with an image of width x height (transformers 5.23,
methods cited below of IP = LlavaOnevisionImageProcessor, P = LlavaOnevisionProcessor,
M = LlavaOnevisionModel):

- An image alone in its sample goes through AnyRes: the grid pinpoint that keeps the most of the
  image is chosen (select_best_resolution in transformers.image_processing_utils), the image is
  resized and padded to it and cut into tile x tile crops, and the whole image, resized to one tile,
  comes first (IP._get_image_patches): crops = rows x cols + 1. The language model gets one feature
  per patch of the base crop, the grid's features unpadded back to the image's aspect ratio and
  shrunk to at most ~9 crops' worth ("anyres_max_9"), and one newline feature per row
  (P._get_number_of_features and _get_unpadded_features, M.pack_image_features).
- An image that shares its sample with others is padded to a square and gives ONE crop, and
  (tile / patch)^2 + 1 features: a crop and its newline (IP._preprocess; P.replace_image_token).

Which images share a sample comes from `batch_num_images`, images per sample: the image processor
reads it from the nesting of its input ([[a, b]] is one sample of two images; a flat [a, b] is two
samples of one, IP.preprocess), and the model reads it back to know how many crops each image has
(M.get_image_features). Every image is one run of <image> tokens, newlines included.

What a packed batch must carry (M.get_image_features, M.forward):

    pixel_values      [total crops, 3, tile, tile]: every image's crops, in the order of their
                      tokens (4-D: no padding crops; the model takes it as it is,
                      M.get_image_features)
    image_sizes       [images, 2]: each image's original (height, width), the same order
    batch_num_images  [samples]: images per SAMPLE, every sample of the batch in order, 0 for a
                      text-only one (the model reads it as a flat list over images,
                      M.get_image_features)
    position_ids      restarting at 0 per sample, as for every packed batch

The model checks only the TOTAL number of image features against the <image> tokens
(M.get_placeholder_mask), so images out of order are silent when the totals agree
(tests/test_families.py).

Videos (transformers 5.23, LlavaOnevisionVideoProcessor, P.replace_video_token, M.get_video_features
and M.apply_pooling): each sampled frame is resized to one tile and goes through the vision tower as
a crop; its features are pooled 2 x 2 (ceil: 27 x 27 -> 14 x 14 = 196 a frame at 384 px), and one
newline feature closes the video: frames x pooled^2 + 1 <video> tokens, one run. The model takes
every video of a batch as ONE tensor, `pixel_values_videos` [videos, frames, 3, tile, tile], so the
videos of a batch must have as many frames: mmdp needs a video processor that samples a fixed number
of them (`do_sample_frames=True, num_frames=N`, as offline_processor and tiny_processor set it) and
refuses another in one sentence. A clip with fewer frames than N is refused by the processor's own
sampling rule (counted as `video_refused`).

`offline_processor(family)` builds the real processor with no network; `tiny_processor(family)`
the same with 32 px tiles, for mmdp.models.tiny.llava_onevision's random model of the real class
with a processor's geometry. The tests' packed batch of six small samples (tests/test_families.py,
packed_batch) is 2 rows of 2,860 tokens and eight 384 px crops with the real tiles, 2 rows of
262 tokens and 21 crops of 32 px with the tiny ones: the tiny model's tests run in seconds.
"""

import math

import torch
import transformers
from transformers import AutoTokenizer
from transformers.image_processing_utils import select_best_resolution

from mmdp import config
from mmdp.data.families.base import ImageLayout, ModelFamily, effective_settings
from mmdp.errors import UserError

# llava-hf/llava-onevision-qwen2-*-hf's chat_template.json, verbatim as transformers pins it
# (tests/models/llava_onevision/test_processing_llava_onevision.py, prepare_processor_dict): no
# system prompt, images first in their message, each text after a newline. Its {% generation %}
# markers leave the reply's <|im_end|> out, so mmdp finds the replies a turn at a time instead.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', "
    "'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', "
    "'equalto', 'video') %}{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ '\\n' + content['text'] }}{% endfor %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\\n' + content['text'] }}{% endgeneration %}{% endfor %}{% endif %}"
    "{{'<|im_end|>'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)
# The processor looks these up on the tokenizer (P.__init__).
SPECIAL_TOKENS = {"image_token": "<image>", "video_token": "<video>"}
# As the llava-hf checkpoints set them (the processor their conversion script builds, transformers'
# models/llava_onevision/convert_llava_onevision_weights_to_hf.py): SigLIP so400m at 384 px, patch
# 14 -> 27 x 27 = 729 features per crop, and "full" (SigLIP has no CLS token to drop; "default"
# makes the model raise, M.pack_image_features, M.get_image_features). The processor's defaults for
# both are None (P.__init__), and with num_image_tokens=None it fails.
NUM_IMAGE_TOKENS = (384 // 14) ** 2
FEATURE_SELECT_STRATEGY = "full"
# The frames the offline processors' video processor samples from every clip (uniformly, by
# transformers' default_sample_indices_fn): the synthetic clips have 4 to 24, so every one fits.
VIDEO_FRAMES = 4


class LlavaOnevision(ModelFamily):
    """LLaVA-OneVision (see the module docstring)."""

    name = "llava_onevision"
    image_token = feature_token = "<image>"
    video_token = video_feature_token = "<video>"
    end_of_turn = "<|im_end|>"
    vision_keys = ("pixel_values", "image_sizes", "batch_num_images")  # the last made per batch
    video_keys = ("pixel_values_videos",)
    # A pack of a few images. An image alone in its sample costs at most 8,765 tokens (947 x 1154:
    # anyres_max_9 shrinks a grid's features only past 1.1^2 x 9 crops' worth; a 3 px scan of
    # 200-2400 px sides) and a 512 x 512 one 3,699, so 10,240 tokens hold any one image with ~1,400 tokens of
    # text, or two of 512 px. The patch budget is the crops of the largest grid, 6 x 6 + 1 = 37
    # (26,973 patches): it drops no row the token budget keeps (14 images sharing a sample are
    # 10,206 patches), and lets at most one image of the largest grid into a pack.
    default_max_length = 10240
    default_max_patches = 37 * NUM_IMAGE_TOKENS

    def __init__(self, processor):
        # The processor's defaults for both are None (P.__init__): it then fails on an image, and
        # with "default" the model drops a feature of every crop and raises (M.pack_image_features,
        # M.get_image_features).
        strategy = processor.vision_feature_select_strategy
        if not processor.num_image_tokens or strategy != FEATURE_SELECT_STRATEGY:
            raise UserError(
                f"this LlavaOnevisionProcessor has num_image_tokens={processor.num_image_tokens} "
                f"and vision_feature_select_strategy={strategy!r}; set them as the checkpoints "
                f"do ({NUM_IMAGE_TOKENS} for 384 px SigLIP, {FEATURE_SELECT_STRATEGY!r})"
            )
        super().__init__(processor)

    def read_settings(self) -> dict:
        """The image processor's effective crop size and grid pinpoints (as its preprocess
        resolves them), and the processor's features a crop."""
        settings = effective_settings(self.processor.image_processor)
        self.tile = settings["size"]["height"]  # crops are square (IP._preprocess)
        self.pinpoints = settings["image_grid_pinpoints"]
        return {
            "tile": self.tile,
            "image_grid_pinpoints": self.pinpoints,
            "num_image_tokens": self.processor.num_image_tokens,
            "vision_aspect_ratio": self.processor.vision_aspect_ratio,
        }

    def model_settings(self) -> dict:
        """...and what decides each image's features: the model unpads an image's grid of
        crops by its own pinpoints and feature strategy (M.pack_image_features)."""
        return {
            **super().model_settings(),
            "vision_feature_select_strategy": self.processor.vision_feature_select_strategy,
            "image_grid_pinpoints": self.processor.image_processor.image_grid_pinpoints,
        }

    def image_layout(self, width: int, height: int, images_in_sample: int) -> ImageLayout:
        crops = self.crops(height, width, images_in_sample)
        features = self.features(height, width, images_in_sample)
        return ImageLayout(self.feature_token, (features,), crops * self.processor.num_image_tokens)

    def crops(self, height: int, width: int, images_in_sample: int) -> int:
        """The crops the image processor cuts: 1 in a multi-image sample (IP._preprocess), else the
        chosen pinpoint's grid plus the base crop (IP._get_image_patches; the model's count,
        image_size_to_num_patches in modeling_llava_onevision)."""
        if images_in_sample > 1:
            return 1
        best_height, best_width = select_best_resolution((height, width), self.pinpoints)
        return math.ceil(best_height / self.tile) * math.ceil(best_width / self.tile) + 1

    def features(self, height: int, width: int, images_in_sample: int) -> int:
        """The <image> tokens the processor writes for the image, by its own rule
        (P.replace_image_token): newlines included, one run."""
        processor = self.processor
        if images_in_sample > 1:
            return processor.num_image_tokens + 1  # one crop and its newline
        return processor._get_number_of_features(height, width, self.tile, self.tile)

    def vision_inputs(self, images: list) -> dict:
        """The image processor on one sample's images, nested as ONE sample (so that several
        images get one crop each, IP.preprocess), unpadded: each image only its own crops."""
        out = self.processor.image_processor(images=[images], do_pad=False)
        return {
            "pixel_values": torch.cat(out["pixel_values"]),
            "image_sizes": torch.tensor(out["image_sizes"], dtype=torch.long),
        }

    def check_vision(self, vision: dict, layouts: list[ImageLayout]) -> None:
        made = len(vision["pixel_values"]) if "pixel_values" in vision else 0
        images = [layout for layout in layouts if not layout.video]
        weighed = sum(layout.patches for layout in images) // self.processor.num_image_tokens
        if made != weighed:
            raise RuntimeError(f"weighed {weighed} crops, the image processor made {made}")
        videos = vision.get("pixel_values_videos")
        made = [] if videos is None else [videos.shape[1]] * len(videos)
        weighed = [
            layout.patches // self.processor.num_image_tokens for layout in layouts if layout.video
        ]
        if made != weighed:
            raise RuntimeError(f"weighed {weighed} frames, the video processor made {made}")

    def collate_vision(self, samples: list[dict]) -> dict:
        """The batch's crops and sizes in sample order, and `batch_num_images` from EVERY
        sample's image_count (0 for a text-only sample, which carries no vision inputs): the
        model reads it as images per sample to know which images are alone in theirs. Then every
        video of the batch, in sample order, as one tensor."""
        videos = [s["pixel_values_videos"] for s in samples if "pixel_values_videos" in s]
        out = {"pixel_values_videos": torch.cat(videos)} if videos else {}
        if not any(s["image_count"] for s in samples):
            return out  # the model refuses empty pixel tensors
        with_images = [s for s in samples if s["image_count"]]
        return {
            "pixel_values": torch.cat([s["pixel_values"] for s in with_images]),
            "image_sizes": torch.cat([s["image_sizes"] for s in with_images]),
            "batch_num_images": torch.tensor([s["image_count"] for s in samples]),
            **out,
        }

    # Videos ------------------------------------------------------------------------------------

    def video_frames(self, metadata) -> list[int]:
        """The frames the video processor samples: its fixed `num_frames`, by its own rule
        (default_sample_indices_fn); a clip with fewer frames is refused."""
        videos = self.processor.video_processor
        if not (videos.do_sample_frames and videos.num_frames):
            raise UserError(
                "LLaVA-OneVision takes a batch's videos as one tensor of as many frames each: set "
                "the processor's video_processor.do_sample_frames=True and num_frames (e.g. 8)"
            )
        return super().video_frames(metadata)

    def video_layout(self, metadata, frames: list[int]) -> ImageLayout:
        """One run of <video> tokens, as many as the processor's replace_video_token writes for
        `frames` frames (frames x pooled^2 + 1 newline); each frame is one crop of the vision tower
        (num_image_tokens patches)."""
        text = self.processor.replace_video_token({"pixel_values_videos": [frames]}, video_idx=0)
        features = len(text) // len(self.video_token)
        patches = len(frames) * self.processor.num_image_tokens
        return ImageLayout(self.video_token, (features,), patches, video=True)


def offline_processor(family: type[LlavaOnevision] = LlavaOnevision):
    """The processor of llava-hf/llava-onevision-qwen2-*-ov-hf built with no network: the real
    image processor with its class defaults (384 px tiles, the 36 pinpoints up to 2304 px, CLIP's
    mean and std: the checkpoints' preprocessor_config.json), the real video processor sampling
    VIDEO_FRAMES frames, mmdp's SmolLM2 tokenizer plus <image> and <video>, and the checkpoints'
    chat template."""
    videos = transformers.LlavaOnevisionVideoProcessor(
        do_sample_frames=True, num_frames=VIDEO_FRAMES
    )
    return build_processor(transformers.LlavaOnevisionImageProcessor(), NUM_IMAGE_TOKENS, videos)


def tiny_processor(family: type[LlavaOnevision] = LlavaOnevision, tile: int = 32, patch: int = 8):
    """offline_processor with small tiles, for a tiny model on CPU: 32 px tiles of 8 px patches
    (16 features per crop) and the real 6 x 6 pinpoint grid scaled to them, so the same rules
    apply (AnyRes picks 1-36 grid crops, anyres_max_9 still shrinks large grids) with ~45x fewer
    tokens per image than the real 729 per crop."""
    image_processor = transformers.LlavaOnevisionImageProcessor(
        size={"height": tile, "width": tile},
        image_grid_pinpoints=[[tile * i, tile * j] for i in range(1, 7) for j in range(1, 7)],
    )
    videos = transformers.LlavaOnevisionVideoProcessor(
        size={"height": tile, "width": tile}, do_sample_frames=True, num_frames=VIDEO_FRAMES
    )
    return build_processor(image_processor, (tile // patch) ** 2, videos)


def build_processor(image_processor, num_image_tokens: int, video_processor):
    tokenizer = AutoTokenizer.from_pretrained(
        config.DEFAULT_TOKENIZER, extra_special_tokens=dict(SPECIAL_TOKENS)
    )
    return transformers.LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        num_image_tokens=num_image_tokens,
        vision_feature_select_strategy=FEATURE_SELECT_STRATEGY,
        chat_template=CHAT_TEMPLATE,
    )
