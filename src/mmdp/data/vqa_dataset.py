"""Stage 2's map-style dataset: one row in, one tokenized sample with its images out."""

from torch.utils.data import Dataset

from mmdp import config
from mmdp.data.families import family_for
from mmdp.data.images import undecoded


class VQADataset(Dataset):
    """Wraps a dataset in the_cauldron's schema (see mmdp.data.reading.sources) for training.

    `processor`: the tokenizer of mmdp's TinyVLM (the blog's path: 64 <|image|> tokens per image,
    images resized to `image_size` squares), or a transformers processor of a model family mmdp
    packs for (mmdp.data.families.FAMILIES), whose own rules then make the samples.

    `dataset[i]` returns a dict:
        row          the index i in the wrapped dataset (stays attached through collation)
        input_ids    int64 [T]: the chat-templated conversation, each image's tokens in place
        labels       int64 [T]: the reply tokens (and their end-of-turn token), -100 elsewhere
        pixel_values and the processor's other outputs for the images, under their transformers
                     names (TinyVLM: pixel_values float32 [N, 3, S, S] in [0, 1])
        position_ids (real families) the sample's positions, as its model computes them
        image_count, patches  the images, and the vision encoder's patches they make
        converted    Counter of image modes converted to RGB (e.g. {"RGBA": 1})
        loss_weight  (a mixture only) the weight of the sample's label tokens in the loss
        drop_reason  None, or why this row cannot be used (mmdp.drop_reasons: a broken image,
                     no reply...); a dropped row has no tensors. __getitem__ never raises for bad
                     data, because inside a DataLoader worker that would kill the whole epoch:
                     the collator drops skipped rows and reports them.
    """

    def __init__(
        self,
        dataset,
        processor,
        image_size: int = config.IMAGE_SIZE,
        image_token_length: int = config.IMAGE_TOKEN_LENGTH,
        mixture=None,
    ):
        # its images and videos stay encoded: decoded only by the family, where a broken file
        # is a counted drop (datasets' default Image() would decode, and raise, reading the row)
        self.dataset = undecoded(dataset)
        # a mmdp.data.mixture.MixedRows: each row's source sets its labels and loss weight
        self.sources = None if mixture is None else mixture.mixture.sources
        self.source_of_row = None if mixture is None else mixture.source_of_row
        # a real model's processor (or a family), or the blog's tokenizer: mmdp's TinyVLM
        self.family = family_for(
            processor, image_size=image_size, image_token_length=image_token_length
        )
        self.tokenizer = self.family.tokenizer

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        """Row `index` as a sample: the family's make_sample (TinyFamily.make_sample)."""
        return self.sample(self.dataset[index], index)

    def sample(self, row: dict, index: int, tokenized=None) -> dict:
        """Row `index` (given) as a sample; in a mixture, as its source asks (label policy, loss
        weight: mmdp.data.mixture.apply_source_rules). `tokenized`: its tokens, computed ahead."""
        sample = self.family.make_sample(row, index, tokenized=tokenized)
        if self.sources is None:
            return sample
        from mmdp.data.mixture import apply_source_rules  # a mixture's rows only

        return apply_source_rules(sample, self.sources[self.source_of_row[index]])
