"""Turn one sample's conversation into `input_ids` and `labels` with the chat template.

Example (SmolLM2 tokenizer, one image, image_token_length=2 to keep it short):

    texts = [{"user": "What colour?", "assistant": "Red."}]
    rendered: <|im_start|>user\n<|image|><|image|>What colour?<|im_end|>\n<|im_start|>assistant\nRed.<|im_end|>\n
    labels:   -100 everywhere except the reply tokens "Red", "." and its closing <|im_end|>

Labels follow the Hugging Face convention: aligned with input_ids (the model shifts them), -100
where no loss is taken. The reply's closing `<|im_end|>` is trained, so the model learns to stop.
`<|im_end|>` is also SmolLM2's pad token: that is why labels come from the chat template's
assistant mask, never from comparing ids with pad_token_id.
"""

import torch
from transformers import PreTrainedTokenizerBase

from mmdp import config

# Why a sample's text is unusable. The epoch report counts these.
NO_TEXTS = "no_texts"
EMPTY_REPLY = "empty_reply"
IMAGE_TOKEN_IN_TEXT = "image_token_in_text"


class BadConversation(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def normalize_texts(texts) -> list[dict]:
    """The turns as a list of {"user", "assistant"} dicts (parquet may store a dict of lists)."""
    if isinstance(texts, dict):  # {"user": [...], "assistant": [...]}
        keys = list(texts)
        texts = [dict(zip(keys, values)) for values in zip(*texts.values())]
    return list(texts or [])


def build_messages(texts, num_images: int, tokenizer, image_token_length: int) -> list[dict]:
    """Chat messages for the template; every image becomes `image_token_length` image tokens.

    All image tokens go in front of the first user message, one block per image, in image order
    (the blog's code expanded only the first image).
    """
    turns = normalize_texts(texts)
    if not turns:
        raise BadConversation(NO_TEXTS, "the sample has no conversation")
    messages = []
    for turn in turns:
        user, assistant = turn.get("user") or "", turn.get("assistant") or ""
        if not assistant.strip():
            raise BadConversation(EMPTY_REPLY, f"empty reply to {user[:40]!r}")
        if tokenizer.image_token in user or tokenizer.image_token in assistant:
            raise BadConversation(IMAGE_TOKEN_IN_TEXT, "the text contains the image token itself")
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": assistant})
    image_tokens = tokenizer.image_token * (image_token_length * num_images)
    messages[0]["content"] = image_tokens + messages[0]["content"]
    return messages


def tokenize_conversation(
    texts,
    num_images: int,
    tokenizer: PreTrainedTokenizerBase,
    image_token_length: int = config.IMAGE_TOKEN_LENGTH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (input_ids, labels), both 1-D int64 tensors of the same length."""
    messages = build_messages(texts, num_images, tokenizer, image_token_length)
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    input_ids = torch.tensor(encoded["input_ids"], dtype=torch.long)
    is_reply = torch.tensor(encoded["assistant_masks"], dtype=torch.bool)
    labels = torch.where(is_reply, input_ids, config.IGNORE_INDEX)
    return input_ids, labels


def count_tokens(texts, num_images: int, tokenizer, image_token_length: int) -> int:
    """The length tokenize_conversation would return, from a plain (fast) tokenization."""
    messages = build_messages(texts, num_images, tokenizer, image_token_length)
    return len(
        tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    )
