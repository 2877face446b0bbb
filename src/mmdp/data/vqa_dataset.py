"""Stage 2's map-style dataset: one row in, one tokenized sample with its images out."""

from collections import Counter

import torch
from torch.utils.data import Dataset

from mmdp import config
from mmdp.data.conversation import BadConversation, tokenize_conversation
from mmdp.data.images import BadImage, load_image


class VQADataset(Dataset):
    """Wraps a dataset in the_cauldron's schema (see mmdp.data.sources) for training.

    `dataset[i]` returns a dict:
        row        the index i in the wrapped dataset (stays attached through collation)
        input_ids  int64 [T]: chat-templated conversation, image_token_length image tokens per image
        labels     int64 [T]: the reply tokens, -100 elsewhere
        pixel_values  float32 [N, 3, S, S] in [0, 1]: the N images in order (N may be 0)
        converted  Counter of image modes converted to RGB (e.g. {"RGBA": 1})
        drop_reason  None, or why this row cannot be used (mmdp.drop_reasons: a broken image,
                   no reply...); a dropped row has no tensors. __getitem__ never raises for bad data, because
                   inside a DataLoader worker that would kill the whole epoch: the collator
                   drops skipped rows and reports them.
    """

    def __init__(
        self,
        dataset,
        tokenizer,
        image_size: int = config.IMAGE_SIZE,
        image_token_length: int = config.IMAGE_TOKEN_LENGTH,
    ):
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.image_size = image_size
        self.image_token_length = image_token_length

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        return make_sample(
            self.dataset[index], index, self.tokenizer, self.image_size, self.image_token_length
        )


def make_sample(
    row: dict,
    index: int,
    tokenizer,
    image_size: int = config.IMAGE_SIZE,
    image_token_length: int = config.IMAGE_TOKEN_LENGTH,
    tokenized: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict:
    """One row in the_cauldron's schema -> one sample, as VQADataset's docstring describes it.

    `index` is the row's position in its dataset (or stream); the sample carries it as "row".
    `tokenized`: the row's (input_ids, labels) when they were computed ahead (mmdp.packing.weighing with
    pretokenize=True); then the row needs no "texts", and only its images are decoded here.
    """
    images = row["images"] or []
    try:
        if tokenized is None:
            tokenized = tokenize_conversation(
                row["texts"], len(images), tokenizer, image_token_length
            )
        input_ids, labels = tokenized
        loaded = [load_image(image, image_size) for image in images]
    except (BadConversation, BadImage) as error:
        return {"row": index, "drop_reason": error.reason}
    pixels = [tensor for tensor, _ in loaded]
    converted = Counter(mode for _, mode in loaded if mode is not None)
    return {
        "row": index,
        "input_ids": input_ids,
        "labels": labels,
        "pixel_values": torch.stack(pixels)
        if pixels
        else torch.zeros(0, 3, image_size, image_size),
        "converted": converted,
        "drop_reason": None,
    }
