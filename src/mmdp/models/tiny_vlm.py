"""A deliberately tiny vision-language model in the nanoVLM shape, built from transformers parts.

    image [3, 256, 256] -> SiglipVisionModel (patch 32: 8 x 8 = 64 patches) -> [64, vit_hidden]
                        -> projector (Linear)                              -> [64, lm_hidden]
    input_ids -> token embeddings; the 64 embeddings of each image replace the 64 <|image|>
                 tokens of its sample, image after image -> LlamaForCausalLM

Randomly initialised and small enough to train on 2 CPU cores; the same code runs on a GPU.
It takes every kind of batch mmdp makes: padded (stages 2-3: `attention_mask`) and packed
(stage 5: `position_ids` and FlashAttention's `cu_seq_lens_*` / `max_length_*`, no attention mask,
so transformers keeps samples apart under every attention implementation).
Its loss, two ways, is in mmdp.training.loss.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, SiglipVisionConfig, SiglipVisionModel

from mmdp import config
from mmdp.models.inputs import model_inputs


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

    def embed(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> torch.Tensor:
        """Token embeddings, with each image's 64 projected patches in place of its image tokens.

        Images must come in the order their image tokens appear in the batch (row by row, and
        within a row sample by sample), which is how every mmdp collator orders them.
        """
        embeds = self.lm.get_input_embeddings()(input_ids)
        is_image = input_ids == self.cfg.image_token_id
        expected = int(is_image.sum())
        if pixel_values is None or len(pixel_values) == 0:
            if expected:
                raise ValueError(f"{expected} image tokens but no images")
            return embeds
        # pixels in [0, 1] -> [-1, 1], SigLIP's input range
        patches = self.vision(pixel_values=pixel_values.to(embeds.dtype) * 2 - 1).last_hidden_state
        image_embeds = self.projector(patches)  # [images, 64, lm_hidden]
        if image_embeds.shape[0] * image_embeds.shape[1] != expected:
            raise ValueError(
                f"{len(pixel_values)} images make {image_embeds.shape[0] * image_embeds.shape[1]} "
                f"embeddings for {expected} image tokens"
            )
        return embeds.masked_scatter(is_image[..., None], image_embeds.to(embeds.dtype))

    def forward(
        self,
        input_ids,
        labels=None,
        pixel_values=None,
        position_ids=None,
        attention_mask=None,
        use_cache=False,
        **flash_attention_kwargs,
    ):
        """Logits (and the mean loss over label tokens, Hugging Face's, when labels are given).

        Packed batches: pass position_ids, cu_seq_lens_q/k and max_length_q/k (passed on to the
        language model for FlashAttention) and NO attention_mask (docs/use-in-your-trainer.md: the traps);
        padded batches: pass attention_mask. The cache is always off: `use_cache` is accepted, as
        model_inputs passes it, and must be False.
        """
        refuse_cache(use_cache)
        return self.lm(
            inputs_embeds=self.embed(input_ids, pixel_values),
            labels=labels,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=False,
            **flash_attention_kwargs,
        )

    def hidden_states(
        self,
        inputs_embeds,
        position_ids=None,
        attention_mask=None,
        use_cache=False,
        **flash_attention_kwargs,
    ) -> torch.Tensor:
        """The language model's body on embeddings from `embed`: its last hidden states.

        `embed`, then `hidden_states`, then `logits` is `forward` in three parts (the same
        numbers), so that each can be timed on its own. `use_cache` must be False, as in forward.
        """
        refuse_cache(use_cache)
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

    def get_output_embeddings(self) -> nn.Linear:
        """The output layer (tied to the token embeddings), as transformers' models name it:
        mmdp.training.loss.batch_loss computes the loss from its input."""
        return self.lm.lm_head


def refuse_cache(use_cache) -> None:
    """TinyVLM trains without a cache: a cache would mix the samples of a packed row."""
    if use_cache:
        raise ValueError("TinyVLM trains without a cache: use_cache must be False")


def vlm_inputs(batch: dict, model=None) -> dict:
    """The keys of any mmdp batch that TinyVLM takes: a packed batch's model_inputs and its
    pixel_values, or a padded batch's input_ids, labels, attention_mask and pixel_values. `model`
    is accepted, as model_inputs takes it, and not needed."""
    if "attention_mask" in batch:
        keys = ("input_ids", "labels", "attention_mask", "pixel_values")
        return {key: batch[key] for key in keys}
    return {**model_inputs(batch), "pixel_values": batch["pixel_values"]}
