"""What a model family needs from the data: its image tokens, its labels, its vision inputs.

A vision-language model family (each of mmdp.data.families.FAMILIES, or mmdp's TinyVLM) is one
`ModelFamily`, wrapping the model's own processor. Every family answers the same questions,
and the loaders ask only these:

    weigh(texts, images)   each row's tokens, images and vision-encoder patches, from the image
                           headers alone (no pixel is decoded): what the planner packs
    make_sample(row)       one training sample, built by the model's own processor: input_ids,
                           labels, position_ids and the processor's outputs for its images
    collate_vision(...)    the vision inputs of a batch, in the order their tokens appear

How a real family turns a row into tokens (`encode`), the way its processor does:

1. Render the conversation with the model's own chat template: each image becomes the
   family's `image_token` (e.g. Qwen's <|image_pad|>), and the replies are found by rendering a
   turn at a time (mmdp.data.conversation.reply_spans).
2. Replace each image token by the text the processor puts there (`image_layout`), written with
   ONE feature token per run of image features: tokenizing 1,000 feature tokens costs 30x more
   than tokenizing one, and gives the same ids (a special token never merges with its
   neighbours).
3. Tokenize, label the tokens inside a reply, and repeat each feature token as many times as its
   run holds. The result equals the processor's own input_ids (tests/test_families.py).

A family's weight for a row is the length `encode` returns, computed without decoding an image:
the planned weight of every row is the length of the sample the processor builds.
"""

import copy
import hashlib
import json
import re
import warnings
from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils.data import get_worker_info

from mmdp import config
from mmdp.data.conversation import (
    chat_messages,
    chat_turns,
    reply_spans,
    system_prompt,
)
from mmdp.data.files import in_flight
from mmdp.data.images import decode_image, image_size
from mmdp.drop_reasons import VIDEO_REFUSED, BadRow

# mmdp.data.videos (PyAV's readers) is imported by the methods that read a video, so that a
# family packing images and text never loads it (stages 1-3 do not).

# What a packed batch may carry for the images, under transformers' names: every family's
# `vision_keys` (tests/test_families.py checks it is their union), for the code that has no family
# at hand (a pack's samples, a batch collated without one).
VISION_INPUTS = (
    "pixel_values",
    "image_grid_thw",
    "image_sizes",
    "batch_num_images",
    "image_position_ids",
)
# ...and for the videos: every family's `video_keys` (tests/test_video.py checks it)
VIDEO_INPUTS = (
    "pixel_values_videos",
    "video_grid_thw",
    "second_per_grid_ts",
    "video_position_ids",
    "num_frames_per_video",
)
# mm_token_type_ids' values (ProcessorMixin.create_mm_token_type_ids, transformers 5.23)
TEXT_TYPE, IMAGE_TYPE, VIDEO_TYPE = 0, 1, 2


def concatenate_vision(samples: list[dict]) -> dict:
    """Each vision input of the samples that have it (images' and videos'), concatenated along
    its first dimension."""
    keys = [key for key in VISION_INPUTS + VIDEO_INPUTS if any(key in s for s in samples)]
    return {key: concatenate([s[key] for s in samples if key in s]) for key in keys}


def concatenate(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(tensors) of a batch's vision inputs, written straight into shared memory when
    this runs in a DataLoader worker, as torch's default_collate does
    (torch/utils/data/_utils/collate.py): the worker then hands the batch to the main process
    without copying it again into shared memory (a Qwen2.5-VL batch holds 169 MiB of patches)."""
    if get_worker_info() is None:
        return torch.cat(tensors)
    first = tensors[0]
    storage = first._typed_storage()._new_shared(sum(t.numel() for t in tensors), device="cpu")
    out = first.new(storage).resize_(sum(len(t) for t in tensors), *first.shape[1:])
    return torch.cat(tensors, out=out)


def effective_settings(processor) -> dict:
    """The settings a transformers image or video processor preprocesses with: each of its valid
    kwargs read from its attribute, then resolved by its own `_standardize_kwargs`, exactly as its
    `preprocess` does (BaseImageProcessor.preprocess, BaseVideoProcessor.preprocess, transformers
    5.23). So a setting made the way users make them counts: `image_processor.max_pixels = N` on
    a loaded Qwen-VL processor overrides its `size` in preprocessing, and here, where its `size`
    alone (what get_number_of_image_patches reads) would not."""
    names = processor.valid_kwargs.__annotations__
    kwargs = {name: getattr(processor, name, None) for name in names}
    with warnings.catch_warnings():  # the processor warns about min/max_pixels when it preprocesses
        warnings.simplefilter("ignore", FutureWarning)
        return processor._standardize_kwargs(**kwargs)


def plain_settings(settings: dict, names) -> dict:
    """`names` of resolved settings as JSON-able values (a SizeDict as a dict, None left out): what
    a family's fingerprint and its refusals name."""
    out = {}
    for name in names:
        value = settings.get(name)
        if value is not None and hasattr(value, "items"):
            value = {k: v for k, v in dict(value).items() if v is not None}
        out[name] = value
    return out


@dataclass(frozen=True)
class ImageLayout:
    """What one image costs a model, from its width and height alone.

    text     what the processor puts in the text for the image, with one feature token per run
    runs     how many feature tokens each run of `text` stands for, in order
    patches  the vision encoder's patches for the image (what max_patches budgets)
    video    a video's layout (its text replaces the family's video token, not the image token)
    """

    text: str
    runs: tuple[int, ...]
    patches: int
    video: bool = False


class ModelFamily:
    """A family of vision-language models: the rules its processor follows (see the module
    docstring). Subclasses set the class attributes and the methods marked "the family's".
    """

    name = ""
    image_token = ""  # what the chat template renders for each image
    feature_token = ""  # the token that stands for one image feature
    end_of_turn = ""  # the token that closes a reply (trained: the model learns to stop)
    video_token = ""  # what the chat template renders for each video ("": takes no video)
    video_feature_token = ""  # the token that stands for one video feature
    # what closes an image's or video's run in the text (Qwen-VL's <|vision_end|>): with the
    # feature tokens, where a row's media end (mmdp.weighing.overflow.media_end)
    media_closing_tokens: tuple[str, ...] = ()
    # the vision inputs of the family's batches, which its model takes (mmdp.models.inputs)
    vision_keys: tuple[str, ...] = ("pixel_values",)
    video_keys: tuple[str, ...] = ()  # ...and of its batches with videos
    token_keys: tuple[str, ...] = ()  # per-token inputs besides input_ids (0 on padding)
    # the leading shape of a sample's position_ids: () for [n], (4,) for Qwen-VL's [4, n]; a
    # pack takes its shape from here, not from its samples (it may have none left)
    position_rows: tuple[int, ...] = ()
    needs_image_sizes = True  # weighing reads every image's header
    # None: the model masks each sample of a pack from its restarting position_ids; else the
    # name of the attention mask mmdp builds for it instead (mmdp.models.inputs.PACKED_MASKS)
    packed_mask: str | None = None
    # whether its model has linear-attention layers (a state carried along the row): its batch
    # needs the model, which lays it out as one row with every sample's bounds (mmdp.models.inputs)
    linear_attention = False
    # the family's budgets when none is given: tokens a pack holds, and patches (None: no patch
    # budget); each family sets them for a few images a pack. Read only by
    # mmdp.packing.packing_config.default_config, the one place that resolves them
    default_max_length = config.MAX_LENGTH
    default_max_patches: int | None = None

    def __init__(self, processor):
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.feature_token_id = self.tokenizer.convert_tokens_to_ids(self.feature_token)
        self.feature_token_ids = [self.feature_token_id]
        if self.video_feature_token:
            self.feature_token_ids.append(
                self.tokenizer.convert_tokens_to_ids(self.video_feature_token)
            )
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = self.tokenizer.eos_token_id if pad is None else pad
        # strings a conversation may not hold: they would become image or turn tokens
        self.reserved = tuple(self.tokenizer.get_added_vocab())
        self.read_settings()

    # The family's rules --------------------------------------------------------------------

    def image_layout(self, width: int, height: int, images_in_sample: int) -> ImageLayout:
        """The family's: what the processor makes of one image (BadImage if it refuses it)."""
        raise NotImplementedError

    def vision_inputs(self, images: list) -> dict:
        """The family's image processor on one sample's (decoded, RGB) images."""
        return dict(self.processor.image_processor(images=images, return_tensors="pt"))

    def video_frames(self, metadata) -> list[int]:
        """Which frames of a video (its VideoMetadata) the video processor samples, by its own
        rule (all of them when it samples none). A video is refused (BadVideo) by a family that
        takes none, or by the processor's rule (fewer frames than it samples)."""
        from mmdp.data.videos import BadVideo

        videos = getattr(self.processor, "video_processor", None)
        if not self.video_token or videos is None:
            raise BadVideo(VIDEO_REFUSED, f"{self.name or 'this'} family takes no video")
        if not videos.do_sample_frames:
            return list(range(metadata.total_num_frames))
        try:
            return [int(i) for i in videos.sample_frames(copy.copy(metadata))]
        except (ValueError, ZeroDivisionError) as error:  # fewer frames than it samples
            raise BadVideo(VIDEO_REFUSED, str(error)) from error

    def video_layout(self, metadata, frames: list[int]) -> ImageLayout:
        """The family's: what the processor makes of a video whose `frames` are sampled (BadVideo
        if it refuses it). A family that takes none refuses its videos in video_frames."""
        raise NotImplementedError

    def video_inputs(self, videos: list, metadata: list) -> dict:
        """The family's video processor on one sample's sampled frames: its `video_keys` (those
        the processor makes; the family adds any other)."""
        out = self.processed_videos(videos, metadata)
        return {key: out[key] for key in self.video_keys if key in out}

    def processed_videos(self, videos: list, metadata: list):
        """The video processor's outputs for videos whose frames ([T, H, W, 3] each) mmdp sampled
        by its rule (video_frames), so that it samples no more."""
        return self.processor.video_processor(
            videos=list(videos),
            video_metadata=list(metadata),
            do_sample_frames=False,
            return_tensors="pt",
        )

    def check_vision(self, vision: dict, layouts: list[ImageLayout]) -> None:
        """The family's: raise if the image processor made other features than weighed."""

    def positions(self, input_ids: torch.Tensor, token_types: dict, vision: dict) -> torch.Tensor:
        """A sample's position_ids: 0, 1, ... (Qwen-VL's are 4 rows, from its token types and
        images: see mmdp.data.families.qwen_vl)."""
        return torch.arange(len(input_ids))

    def collate_vision(self, samples: list[dict]) -> dict:
        """The vision inputs of a batch's samples (in the order of their tokens), each
        concatenated along its first dimension; none when no sample has an image."""
        return concatenate_vision(samples)

    def read_settings(self) -> dict:
        """The family's: read the processor's effective settings (`effective_settings`) into the
        family, for the weights to follow what the processor will do; refuse (UserError, one
        sentence) settings mmdp cannot weigh. Called when the family is made and again by every
        weigh, make_sample, image_costs and video_costs (a setting changed in between counts).
        Returns the settings that change a count (JSON-able: part of `fingerprint`)."""
        return {}

    def model_settings(self) -> dict:
        """What the batches assume of the model's config, by its path in the config (e.g.
        "vision_config.tokens_per_second"): mmdp.models.inputs.model_inputs refuses a model
        configured otherwise. Every real family: the config's id of its feature token."""
        return {"image_token_id": self.feature_token_id}

    def fingerprint(self) -> dict:
        """Everything that changes a row's weight: what the weights' cache key depends on."""
        return {
            "family": self.name,
            "tokenizer": tokenizer_fingerprint(self.tokenizer),
            "processor": self.processor.to_json_string(),
            "chat_template": self.processor.chat_template,
            "settings": self.read_settings(),  # as resolved: attributes set on it included
        }

    # The same for every family --------------------------------------------------------------

    def render(self, messages: list[dict]) -> str:
        """The conversation in the model's own chat template (the processor's), as text."""
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.processor.chat_template, tokenize=False
        )

    def layouts(self, sizes: list[tuple[int, int]]) -> list[ImageLayout]:
        return [self.image_layout(width, height, len(sizes)) for width, height in sizes]

    def layouts_of_videos(self, metadata) -> list[ImageLayout]:
        """The layouts of videos whose headers say `metadata` (transformers VideoMetadata)."""
        return [self.video_layout(one, self.video_frames(one)) for one in metadata]

    def headers(self, images_of_rows, videos_of_rows):
        """Each row's (image sizes, video metadata), each a mmdp.data.files.in_flight outcome
        (the value, or the exception it raised): every remote header of the rows read at once,
        the images', then the videos', so that their requests wait on the network together."""
        from mmdp.data.videos import video_metadata

        sizes = iter(in_flight(image_size, [i for images in images_of_rows for i in images or []]))
        videos = [v for row_videos in videos_of_rows for v in row_videos or []]
        metadata = iter(in_flight(video_metadata, videos))
        for images, row_videos in zip(images_of_rows, videos_of_rows):
            yield [next(sizes) for _ in images or []], [next(metadata) for _ in row_videos or []]

    def expanded_text(
        self, turns, layouts: list[ImageLayout], labels: bool = True, system: str | None = None
    ) -> tuple[str, list[tuple[int, int]], list[ImageLayout]]:
        """Steps 1-2: the rendered conversation with every image's and video's text in place
        (`layouts`: the images', then the videos', each in file order), the character spans of
        the replies (to label; none when `labels` is False: weighing needs only the text), and
        the layouts in the order the text holds them.

        Each image token the template renders takes the next image's layout, each video token
        the next video's: a row's tags put its files anywhere (mmdp.data.conversation), and a
        template may order a message's items its own way (LLaVA-OneVision's renders a
        message's images first)."""
        videos = sum(layout.video for layout in layouts)
        messages = chat_messages(turns, len(layouts) - videos, videos, system)
        if labels:
            text, spans = reply_spans(self.render, messages, self.end_of_turn)
        else:
            text, spans = self.render(messages), []
        tokens = [self.image_token] + ([self.video_token] if self.video_token else [])
        pieces = re.split("(" + "|".join(map(re.escape, tokens)) + ")", text)
        parts, found = pieces[::2], pieces[1::2]
        queues = {
            self.image_token: iter([layout for layout in layouts if not layout.video]),
            self.video_token: iter([layout for layout in layouts if layout.video]),
        }
        ordered = [next(queues[token], None) for token in found]
        if None in ordered or len(ordered) != len(layouts):
            wanted = [self.video_token if layout.video else self.image_token for layout in layouts]
            raise RuntimeError(f"the chat template rendered {found} for {wanted}")
        # where each image (or video) token starts in the rendered text, and how much its text
        # grows it
        starts = [
            sum(len(part) for part in parts[: k + 1]) + sum(map(len, found[:k]))
            for k in range(len(ordered))
        ]
        grows = [len(layout.text) - len(token) for layout, token in zip(ordered, found)]
        moved = [
            (a + shift, b + shift)
            for a, b in spans
            for shift in [sum(g for s, g in zip(starts, grows) if s < a)]
        ]
        pieces = [parts[0]]
        for layout, part in zip(ordered, parts[1:]):
            pieces += [layout.text, part]
        return "".join(pieces), moved, ordered

    def encode(
        self, turns, layouts: list[ImageLayout], system: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 3: (input_ids, labels) of a conversation whose images cost `layouts`."""
        text, spans, ordered = self.expanded_text(turns, layouts, system=system)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        input_ids = torch.tensor(encoded["input_ids"], dtype=torch.long)
        in_reply = [
            any(a < end and start < b for a, b in spans) for start, end in encoded["offset_mapping"]
        ]
        labels = torch.where(
            torch.tensor(in_reply, dtype=torch.bool), input_ids, config.IGNORE_INDEX
        )
        repeats = self.feature_repeats(input_ids, ordered)
        return input_ids.repeat_interleave(repeats), labels.repeat_interleave(repeats)

    def feature_repeats(self, input_ids: torch.Tensor, layouts: list[ImageLayout]) -> torch.Tensor:
        """How many times each token stands: each feature token its run's length, others once
        (`layouts` in the order the text holds them)."""
        runs = [run for layout in layouts for run in layout.runs]
        is_feature = torch.isin(input_ids, torch.tensor(self.feature_token_ids))
        if int(is_feature.sum()) != len(runs):
            raise RuntimeError(
                f"{int(is_feature.sum())} {self.feature_token!r} tokens for {len(runs)} runs of image "
                "features"
            )
        repeats = torch.ones_like(input_ids)
        repeats[is_feature] = torch.tensor(runs, dtype=torch.long)
        return repeats

    def weigh(
        self, texts_of_rows, images_of_rows, videos_of_rows=None
    ) -> tuple[list, list, list, list]:
        """Tokens, images, patches and drop reason (None: usable) of many rows, from their text
        and their images' and videos' headers; one batched tokenizer call. A video's patches
        count with its row's (it is never split), its frames not as images."""
        self.read_settings()
        lengths, image_counts, patches, reasons = [], [], [], []
        rendered, rendered_rows = [], []
        videos_of_rows = videos_of_rows or [None] * len(texts_of_rows)
        # every header of the rows at once: remote files' requests wait on the network together
        headers = self.headers(images_of_rows, videos_of_rows)
        for row, (texts, images, (sizes, metadata)) in enumerate(
            zip(texts_of_rows, images_of_rows, headers)
        ):
            image_counts.append(len(images or []))
            try:
                layouts = self.layouts([outcome(size) for size in sizes])
                layouts += self.layouts_of_videos([outcome(one) for one in metadata])
                turns = chat_turns(texts, self.reserved)
                text, _, _ = self.expanded_text(
                    turns, layouts, labels=False, system=system_prompt(texts)
                )
            except BadRow as error:
                lengths.append(0)
                patches.append(0)
                reasons.append(error.reason)
                continue
            lengths.append(sum(run - 1 for layout in layouts for run in layout.runs))
            patches.append(sum(layout.patches for layout in layouts))
            reasons.append(None)
            rendered.append(text)
            rendered_rows.append(row)
        if rendered:
            ids = self.tokenizer(rendered, add_special_tokens=False)["input_ids"]
            for row, row_ids in zip(rendered_rows, ids):
                lengths[row] += len(row_ids)
        return lengths, image_counts, patches, reasons

    def image_tokens(self, layout: ImageLayout) -> int:
        """The tokens one image costs (its text's, the feature token repeated per run); the
        newlines some families put around an image may merge with their neighbours: +-1."""
        text = len(self.tokenizer(layout.text, add_special_tokens=False)["input_ids"])
        return text + sum(layout.runs) - len(layout.runs)

    def image_costs(self, images_of_rows) -> list[tuple[int, int]]:
        """(tokens, patches) of every image of the rows, from their headers (refused images
        left out): what a report or a figure shows of a family's rules."""
        return self.costs(images_of_rows, [None] * len(images_of_rows))

    def video_costs(self, videos_of_rows) -> list[tuple[int, int]]:
        """(tokens, patches) of every video of the rows, from their headers (refused or broken
        videos left out): what stage 5 reports of the videos it packed."""
        return self.costs([None] * len(videos_of_rows), videos_of_rows)

    def costs(self, images_of_rows, videos_of_rows) -> list[tuple[int, int]]:
        self.read_settings()
        costs = []
        for sizes, metadata in self.headers(images_of_rows, videos_of_rows):
            try:
                layouts = self.layouts([outcome(size) for size in sizes])
                layouts += self.layouts_of_videos([outcome(one) for one in metadata])
            except BadRow:  # a refused or broken image or video
                continue
            costs += [(self.image_tokens(layout), layout.patches) for layout in layouts]
        return costs

    def tokenize(self, texts, images, videos=None) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """(input_ids, labels, images, patches) of a row, its images and videos read from their
        headers (pretokenizing: mmdp.weighing.weigh, which reads the settings once a
        batch)."""
        from mmdp.data.videos import video_metadata

        layouts = self.layouts([image_size(image) for image in images or []])
        videos = self.layouts_of_videos([video_metadata(video) for video in videos or []])
        turns = chat_turns(texts, self.reserved)
        input_ids, labels = self.encode(turns, layouts + videos, system_prompt(texts))
        patches = sum(layout.patches for layout in layouts + videos)
        return input_ids, labels, len(layouts), patches

    def make_sample(self, row: dict, index: int, tokenized=None) -> dict:
        """One row -> one sample (see mmdp.data.vqa_dataset): the model's processor on its images,
        its tokens from `encode` (or `tokenized`, computed ahead by weighing)."""
        self.read_settings()
        images = row["images"] or []
        try:
            decoded = [decode_image(image) for image in images]
            layouts = self.layouts([pil.size for pil, _ in decoded])
            videos, video_layouts = self.decode_videos(row.get("videos"))
            layouts += video_layouts
            if tokenized is None:
                turns = chat_turns(row["texts"], self.reserved)
                tokenized = self.encode(turns, layouts, system_prompt(row["texts"]))
        except BadRow as error:
            return {"row": index, "drop_reason": error.reason}
        input_ids, labels = tokenized
        vision = self.vision_inputs([pil for pil, _ in decoded]) if decoded else {}
        if videos:
            vision.update(self.video_inputs(*zip(*videos)))
        self.check_vision(vision, layouts)
        token_types = self.token_types(input_ids)
        return {
            "row": index,
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": self.positions(input_ids, token_types, vision),
            **token_types,
            **vision,
            "image_count": len(images),
            "video_count": len(videos),
            "patches": sum(layout.patches for layout in layouts),
            "converted": Counter(mode for _, mode in decoded if mode is not None),
            "drop_reason": None,
        }

    def decode_videos(self, videos) -> tuple[list[tuple], list[ImageLayout]]:
        """Each video's sampled frames with its metadata (frames_indices set, as transformers'
        readers set it), and its layout."""
        from mmdp.data.videos import decode_frames, video_metadata

        decoded, layouts = [], []
        for video in videos or []:
            metadata = video_metadata(video)
            frames = self.video_frames(metadata)
            layouts.append(self.video_layout(metadata, frames))
            metadata.frames_indices = frames
            decoded.append((decode_frames(video, frames), metadata))
        return decoded, layouts

    def token_types(self, input_ids: torch.Tensor) -> dict:
        """The per-token inputs of `token_keys`: 1 on image features, 2 on video features, 0
        elsewhere (ProcessorMixin.create_mm_token_type_ids)."""
        types = sum(
            kind * (input_ids == token).long()
            for kind, token in enumerate(self.feature_token_ids, IMAGE_TYPE)
        )
        return {key: types for key in self.token_keys}


def outcome(result):
    """A result of mmdp.data.files.in_flight: the value, or the exception it holds, raised."""
    if isinstance(result, BaseException):
        raise result
    return result


def tokenizer_fingerprint(tokenizer) -> dict:
    """What in a tokenizer changes a count: its vocabulary, special tokens and chat template."""
    vocabulary = (
        tokenizer.backend_tokenizer.to_str()
        if getattr(tokenizer, "is_fast", False)
        else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    )
    return {
        "vocabulary": hashlib.sha256(vocabulary.encode()).hexdigest(),
        "special": tokenizer.special_tokens_map,
        "added": sorted(tokenizer.get_added_vocab().items()),
        "chat_template": tokenizer.chat_template,
    }
