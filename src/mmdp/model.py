"""A deliberately tiny vision-language model in the nanoVLM shape, built from transformers parts.

    image [3, 256, 256] -> SiglipVisionModel (patch 32: 8 x 8 = 64 patches) -> [64, vit_hidden]
                        -> projector (Linear)                              -> [64, lm_hidden]
    input_ids -> token embeddings; the 64 embeddings of each image replace the 64 <|image|>
                 tokens of its sample, image after image -> LlamaForCausalLM

Randomly initialised and small enough to train on 2 CPU cores; the same code runs on a GPU.
It takes every kind of batch mmdp makes: padded (stages 2-3: `attention_mask`) and packed
(stage 5: `position_ids` and FlashAttention's `cu_seq_lens_*` / `max_length_*`, no attention mask,
so transformers keeps samples apart under every attention implementation).

The loss, two ways (padded and packed batches of the same samples give the same value for both):
    mean_over_tokens   every label token weighs the same (transformers' loss)
    mean_over_samples  every sample weighs the same: each sample's mean, then the mean of those
For DDP and gradient accumulation, add up their parts (summed_loss and label_tokens,
summed_sample_means) over ranks and micro-batches before dividing: see mmdp.ddp.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, SiglipVisionConfig, SiglipVisionModel

from mmdp import config
from mmdp.collate import real_token_mask
from mmdp.packed_batch import model_inputs


@dataclass
class TinyVLMConfig:
    vocab_size: int  # the tokenizer's, <|image|> included: len(tokenizer)
    image_token_id: int
    image_size: int = config.IMAGE_SIZE
    vit_patch_size: int = 32  # (256 / 32)^2 = 64 patches = 64 image tokens per image
    vit_hidden: int = 32
    vit_layers: int = 1
    vit_heads: int = 2
    lm_hidden: int = 64
    lm_intermediate: int = 128
    lm_layers: int = 2
    lm_heads: int = 4
    lm_kv_heads: int = 2
    lm_max_positions: int = 2048
    # std of the initial weights (transformers' default is 0.02). A model that starts near zero
    # barely looks at its inputs; checks of what it sees (masks, images) start it larger.
    initializer_range: float = 0.02
    attn_implementation: str = "sdpa"


class TinyVLM(nn.Module):
    def __init__(self, cfg: TinyVLMConfig):
        super().__init__()
        patches = (cfg.image_size // cfg.vit_patch_size) ** 2
        if patches != config.IMAGE_TOKEN_LENGTH:
            raise ValueError(
                f"{patches} patches per image, but {config.IMAGE_TOKEN_LENGTH} image tokens"
            )
        self.cfg = cfg
        self.vision = SiglipVisionModel(
            SiglipVisionConfig(
                hidden_size=cfg.vit_hidden,
                intermediate_size=2 * cfg.vit_hidden,
                num_hidden_layers=cfg.vit_layers,
                num_attention_heads=cfg.vit_heads,
                image_size=cfg.image_size,
                patch_size=cfg.vit_patch_size,
                vision_use_head=False,  # no pooling head: every patch goes to the LM
                initializer_range=cfg.initializer_range,
                attn_implementation=cfg.attn_implementation,
            )
        )
        self.projector = nn.Linear(cfg.vit_hidden, cfg.lm_hidden)
        self.lm = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=cfg.vocab_size,
                hidden_size=cfg.lm_hidden,
                intermediate_size=cfg.lm_intermediate,
                num_hidden_layers=cfg.lm_layers,
                num_attention_heads=cfg.lm_heads,
                num_key_value_heads=cfg.lm_kv_heads,
                max_position_embeddings=cfg.lm_max_positions,
                tie_word_embeddings=True,
                initializer_range=cfg.initializer_range,
                attn_implementation=cfg.attn_implementation,
            )
        )

    def embed(self, input_ids: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """Token embeddings, with each image's 64 projected patches in place of its image tokens.

        Images must come in the order their image tokens appear in the batch (row by row, and
        within a row sample by sample), which is how every mmdp collator orders them.
        """
        embeds = self.lm.get_input_embeddings()(input_ids)
        is_image = input_ids == self.cfg.image_token_id
        expected = int(is_image.sum())
        if images is None or len(images) == 0:
            if expected:
                raise ValueError(f"{expected} image tokens but no images")
            return embeds
        patches = self.vision(pixel_values=images.to(embeds.dtype) * 2 - 1).last_hidden_state
        image_embeds = self.projector(patches)  # [images, 64, lm_hidden]
        if image_embeds.shape[0] * image_embeds.shape[1] != expected:
            raise ValueError(
                f"{len(images)} images make {image_embeds.shape[0] * image_embeds.shape[1]} "
                f"embeddings for {expected} image tokens"
            )
        return embeds.masked_scatter(is_image[..., None], image_embeds.to(embeds.dtype))

    def forward(
        self,
        input_ids,
        labels=None,
        images=None,
        position_ids=None,
        attention_mask=None,
        **flash_attention_kwargs,
    ):
        """Logits (and the mean loss over label tokens, Hugging Face's, when labels are given).

        Packed batches: pass position_ids, cu_seq_lens_q/k and max_length_q/k (passed on to the
        language model for FlashAttention) and NO attention_mask (see the README's traps);
        padded batches: pass attention_mask. The cache is always off.
        """
        return self.lm(
            inputs_embeds=self.embed(input_ids, images),
            labels=labels,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=False,
            **flash_attention_kwargs,
        )

    def hidden_states(
        self, inputs_embeds, position_ids=None, attention_mask=None, **flash_attention_kwargs
    ) -> torch.Tensor:
        """The language model's body on embeddings from `embed`: its last hidden states.

        `embed`, then `hidden_states`, then `logits` is `forward` in three parts (the same
        numbers), so that each can be timed on its own.
        """
        return self.lm.model(
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=False,
            **flash_attention_kwargs,
        ).last_hidden_state

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The language model's head: one logit per vocabulary entry at every position."""
        return self.lm.lm_head(hidden_states)


def next_token_labels(labels: torch.Tensor) -> torch.Tensor:
    """The label each position is trained to predict: logit t predicts label t + 1 (the model's
    own shift). Shifting the labels, not the logits, leaves the large logits tensor uncopied.

    Example: labels [[-100, 7, 8, 9]] -> [[7, 8, 9, -100]]
    """
    return nn.functional.pad(labels[:, 1:], (0, 1), value=config.IGNORE_INDEX)


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss of every position, [B, L], float32: 0 where the next label is ignored."""
    return nn.functional.cross_entropy(
        logits.flatten(0, 1).float(),
        next_token_labels(labels).flatten(),
        ignore_index=config.IGNORE_INDEX,
        reduction="none",
    ).view(labels.shape)


def summed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The sum (not the mean) of the token losses, with the model's own shift: logit t predicts
    label t + 1. Sums add up across batches of any shape, which lets padded and packed batches of
    the same samples be compared, and ranks of a DDP run be normalised together."""
    return nn.functional.cross_entropy(
        logits.flatten(0, 1).float(),
        next_token_labels(labels).flatten(),
        ignore_index=config.IGNORE_INDEX,
        reduction="sum",
    )


def label_tokens(labels: torch.Tensor) -> int:
    """How many positions a batch trains: the denominator of the mean over label tokens."""
    return int((next_token_labels(labels) != config.IGNORE_INDEX).sum())


def sample_ids(batch: dict) -> torch.Tensor:
    """Which sample each token of any mmdp batch belongs to, [B, L]; -1 on padding.

    A padded batch (stages 2-3) holds one sample per row; a packed batch (stage 5) several per
    row, found from its segments (cu_seq_lens_q over the B * L tokens read as one flat row).
    Ids are unique within the batch, not consecutive. Example, one pack of 8 tokens holding
    samples of 3 and 4 tokens: cu_seq_lens_q [0, 3, 7, 8] -> [[0, 0, 0, 1, 1, 1, 1, -1]]
    """
    real = real_token_mask(batch)
    if "cu_seq_lens_q" in batch:
        flat = torch.arange(real.numel(), device=real.device)
        bounds = batch["cu_seq_lens_q"][1:].to(device=real.device, dtype=torch.long)
        ids = torch.searchsorted(bounds, flat, right=True).view(real.shape)
    else:
        ids = torch.arange(real.shape[0], device=real.device)[:, None].expand(real.shape)
    return torch.where(real, ids, -1)


def mean_over_tokens(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Every label token weighs the same (what transformers computes): use it by default; a
    sample with a long reply counts more than one with a short reply, as in pretraining.

    Padded and packed batches of the same samples give the same value.
    """
    return summed_loss(logits, labels) / label_tokens(labels)


def mean_over_samples(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Every sample weighs the same, whatever its reply length (each sample's mean over its
    label tokens, then the mean over samples): use it when short answers must not be drowned by
    long ones. With packing it is computed per segment, never per row: a row holds several
    samples. Samples without a label token are left out.
    """
    summed, samples = summed_sample_means(logits, batch)
    return summed / samples


def summed_sample_means(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, int]:
    """The sum over samples of each sample's mean token loss, and the number of samples (the
    parts of mean_over_samples; add them up across ranks or micro-batches before dividing)."""
    labels = batch["labels"]
    trained = next_token_labels(labels) != config.IGNORE_INDEX
    # the sample a position's loss belongs to is that of the label it predicts (position t + 1)
    owner = nn.functional.pad(sample_ids(batch)[:, 1:], (0, 1), value=-1)[trained]
    losses = token_losses(logits, labels)[trained]
    ids, owner = torch.unique(owner, return_inverse=True)
    sums = torch.zeros(len(ids), device=losses.device).index_add(0, owner, losses)
    counts = torch.bincount(owner, minlength=len(ids))
    return (sums / counts).sum(), len(ids)


def vlm_inputs(batch: dict) -> dict:
    """The keys of any mmdp batch that TinyVLM takes: a packed batch's model_inputs and its
    images, or a padded batch's input_ids, labels, attention_mask and images."""
    if "attention_mask" in batch:
        keys = ("input_ids", "labels", "attention_mask", "images")
        return {key: batch[key] for key in keys}
    return {**model_inputs(batch), "images": batch["images"]}
