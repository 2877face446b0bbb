"""mmdp's own family: TinyVLM with the blog's tokenizer, the default of every stage.

VQADataset calls `make_sample`, the blog's whole path: tokenize_conversation (64 <|image|> tokens
an image) and load_image. The other methods answer what the planned loaders ask every family
(ModelFamily, base.py, the real families' machinery): a row's weight, a batch's pixels.
"""

from collections import Counter

import torch

from mmdp import config
from mmdp.data.conversation import BadConversation, count_tokens_batch, tokenize_conversation
from mmdp.data.families.base import ImageLayout, ModelFamily, concatenate, tokenizer_fingerprint
from mmdp.data.images import BadImage, load_image
from mmdp.drop_reasons import VIDEO_REFUSED


class TinyFamily(ModelFamily):
    """mmdp's TinyVLM with the blog's tokenizer (the default): every image is a square of
    `image_size` pixels and `image_token_length` <|image|> tokens, one per patch of the vision
    encoder; labels come from the ChatML template's {% generation %} markers."""

    name = "tiny"
    needs_image_sizes = False

    def __init__(
        self,
        tokenizer,
        image_size: int = config.IMAGE_SIZE,
        image_token_length: int = config.IMAGE_TOKEN_LENGTH,
    ):
        self.feature_token = tokenizer.image_token  # what ModelFamily.__init__ looks up
        super().__init__(tokenizer)  # the tokenizer is the whole processor
        self.image_size = image_size
        self.image_token_length = image_token_length

    def make_sample(self, row: dict, index: int, tokenized=None) -> dict:
        """Row `index` as VQADataset's sample: its input_ids and labels (`tokenized`: computed
        ahead by weighing), its images resized; a row it cannot use, only its drop_reason."""
        images = row["images"] or []
        if row.get("videos"):
            return {"row": index, "drop_reason": VIDEO_REFUSED}
        try:
            if tokenized is None:
                tokenized = tokenize_conversation(
                    row["texts"], len(images), self.tokenizer, self.image_token_length
                )
            loaded = [load_image(image, self.image_size) for image in images]
        except (BadConversation, BadImage) as error:
            return {"row": index, "drop_reason": error.reason}
        input_ids, labels = tokenized
        pixels = [tensor for tensor, _ in loaded]
        size = self.image_size
        return {
            "row": index,
            "input_ids": input_ids,
            "labels": labels,
            "pixel_values": torch.stack(pixels) if pixels else torch.zeros(0, 3, size, size),
            "image_count": len(images),
            "patches": len(images) * self.image_token_length,
            "converted": Counter(mode for _, mode in loaded if mode is not None),
            "drop_reason": None,
        }

    # What the planned loaders ask every family (ModelFamily) -----------------------------------

    def tokenize(self, texts, images, videos=None) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        if videos:
            from mmdp.data.videos import BadVideo  # PyAV's readers: only for a row with video

            raise BadVideo(VIDEO_REFUSED, "TinyVLM takes no video")
        count = images if isinstance(images, int) else len(images or [])
        input_ids, labels = tokenize_conversation(
            texts, count, self.tokenizer, self.image_token_length
        )
        return input_ids, labels, count, count * self.image_token_length

    def weigh(
        self, texts_of_rows, images_of_rows, videos_of_rows=None
    ) -> tuple[list, list, list, list]:
        """`images_of_rows`: each row's images, or just how many (all weighing needs). TinyVLM
        takes no video: a row with one is refused."""
        counts = [n if isinstance(n, int) else len(n or []) for n in images_of_rows]
        lengths, reasons = count_tokens_batch(
            texts_of_rows, counts, self.tokenizer, self.image_token_length
        )
        for row, videos in enumerate(videos_of_rows or []):
            if videos:
                lengths[row], reasons[row] = 0, VIDEO_REFUSED
        patches = [count * self.image_token_length for count in counts]
        return lengths, counts, patches, reasons

    def image_layout(self, width: int, height: int, images_in_sample: int) -> ImageLayout:
        """Every image costs the same: image_token_length tokens, one per patch."""
        n = self.image_token_length
        return ImageLayout(self.feature_token, (n,), n)

    def collate_vision(self, samples: list[dict]) -> dict:
        """Every image of the batch as one [N, 3, S, S] tensor (N may be 0), written straight
        into shared memory in a DataLoader worker (`concatenate`)."""
        size = self.image_size
        pixels = [s["pixel_values"] for s in samples]
        return {"pixel_values": concatenate(pixels or [torch.zeros(0, 3, size, size)])}

    def model_settings(self) -> dict:
        """TinyVLM's model takes its settings from the same config (mmdp.config): none to check."""
        return {}

    def fingerprint(self) -> dict:
        return {
            "family": self.name,
            "tokenizer": tokenizer_fingerprint(self.tokenizer),
            "image_token_length": self.image_token_length,
        }
