"""Turn one sample's conversation into `input_ids` and `labels` with the chat template.

Two ways to find the replies, the tokens that get labels:
- mmdp's own ChatML template (TinyVLM, the default) marks them with {% generation %}, and
  `tokenize_conversation` reads transformers' assistant mask;
- a real model's template (Qwen-VL, SmolVLM, LLaVA-OneVision, Gemma 3) has no such markers, and
  `reply_spans` finds them by rendering the conversation a turn at a time (see there).

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
from mmdp.drop_reasons import EMPTY_REPLY, IMAGE_TOKEN_IN_TEXT, NO_TEXTS
from mmdp.errors import UserError


class BadConversation(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def normalize_texts(texts) -> list[dict]:
    """The turns as a list of {"user", "assistant"} dicts (parquet may store a dict of lists)."""
    if isinstance(texts, dict):  # {"user": [...], "assistant": [...]}
        keys = list(texts)
        texts = [dict(zip(keys, values)) for values in zip(*texts.values())]
    turns = list(texts or [])
    if any(not isinstance(turn, dict) for turn in turns):  # a null turn (nulls in a parquet list)
        raise BadConversation(NO_TEXTS, "a turn of the conversation is null")
    return turns


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
    # Tokenize with ONE image token per image, then repeat each image token image_token_length
    # times: the same ids as tokenizing all of them (a special token is never merged with its
    # neighbours), without running 64 tokens per image through the tokenizer.
    messages = build_messages(texts, num_images, tokenizer, image_token_length=1)
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    input_ids = torch.tensor(encoded["input_ids"], dtype=torch.long)
    is_reply = torch.tensor(encoded["assistant_masks"], dtype=torch.bool)
    if num_images and image_token_length != 1:
        repeats = torch.where(input_ids == tokenizer.image_token_id, image_token_length, 1)
        input_ids = input_ids.repeat_interleave(repeats)
        is_reply = is_reply.repeat_interleave(repeats)
    labels = torch.where(is_reply, input_ids, config.IGNORE_INDEX)
    return input_ids, labels


def count_tokens_batch(
    texts_of_rows, images_of_rows, tokenizer, image_token_length: int = config.IMAGE_TOKEN_LENGTH
) -> tuple[list[int], list[str | None]]:
    """Token counts of many rows at once, as tokenize_conversation would return them.

    Returns (lengths, reasons): a row that cannot be tokenized has length 0 and its reason
    (NO_TEXTS, EMPTY_REPLY, IMAGE_TOKEN_IN_TEXT); the others have reason None. Uses one image
    token per image in a single batched (Rust) tokenizer call, then adds the rest.
    """
    lengths, reasons, rendered, rendered_rows = [], [], [], []
    for row, (texts, num_images) in enumerate(zip(texts_of_rows, images_of_rows)):
        try:
            messages = build_messages(texts, int(num_images), tokenizer, image_token_length=1)
        except BadConversation as error:
            lengths.append(0)
            reasons.append(error.reason)
            continue
        lengths.append((image_token_length - 1) * int(num_images))
        reasons.append(None)
        rendered.append(tokenizer.apply_chat_template(messages, tokenize=False))
        rendered_rows.append(row)
    if rendered:
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        for row, row_ids in zip(rendered_rows, ids):
            lengths[row] += len(row_ids)
    return lengths, reasons


def count_tokens(texts, num_images: int, tokenizer, image_token_length: int) -> int:
    """The length tokenize_conversation would return for one row."""
    lengths, reasons = count_tokens_batch([texts], [num_images], tokenizer, image_token_length)
    if reasons[0] is not None:
        raise BadConversation(reasons[0], "see build_messages")
    return lengths[0]


# Real chat templates ------------------------------------------------------------------------------


def chat_turns(texts, reserved: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (user, assistant) turns of a row, checked: a row with no turns, an empty reply, or a
    `reserved` string (a model's image or turn tokens) in its text raises BadConversation."""
    turns = normalize_texts(texts)
    if not turns:
        raise BadConversation(NO_TEXTS, "the sample has no conversation")
    checked = []
    for turn in turns:
        user, assistant = turn.get("user") or "", turn.get("assistant") or ""
        if not assistant.strip():
            raise BadConversation(EMPTY_REPLY, f"empty reply to {user[:40]!r}")
        for token in reserved:
            if token in user or token in assistant:
                raise BadConversation(IMAGE_TOKEN_IN_TEXT, f"the text contains {token!r} itself")
        checked.append((user, assistant))
    return checked


def chat_messages(turns: list[tuple[str, str]], num_images: int, num_videos: int = 0) -> list[dict]:
    """Messages in the structured form real chat templates take: the images first in the first
    user message, then the videos, then its text (the_cauldron's rows give no image positions)."""
    messages = []
    for user, assistant in turns:
        messages.append({"role": "user", "content": [{"type": "text", "text": user}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": assistant}]})
    media = [{"type": "image"}] * num_images + [{"type": "video"}] * num_videos
    messages[0]["content"] = media + messages[0]["content"]
    return messages


def reply_spans(
    render, messages: list[dict], end_of_turn: str
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation, and the character spans of each reply and its end-of-turn token.

    `render(messages)` is the model's own chat template (no generation prompt). A real template
    has no {% generation %} markers, so the replies are found by rendering one turn at a time:
    for assistant message i, render(messages[:i + 1]) must extend render(messages[:i]) (the
    template is append-only), and the added text holds the reply (as it is, or trimmed, as
    Gemma's template does) followed by `end_of_turn`. The span runs from the reply's first
    character through `end_of_turn`; the newline after it is the template's, not the model's.
    A template where this does not hold raises a UserError: mmdp never guesses labels.

    >>> def chatml(messages):
    ...     turns = [f"<|im_start|>{m['role']}:{m['content'][-1]['text']}<|im_end|>" for m in messages]
    ...     return "".join(turns)
    >>> text, spans = reply_spans(chatml, chat_messages([("Hi", "Hello.")], 0), "<|im_end|>")
    >>> [text[a:b] for a, b in spans]
    ['Hello.<|im_end|>']
    """
    text = render(messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, upto = render(messages[:i]), render(messages[: i + 1])
        if not (upto.startswith(before) and text.startswith(upto)):
            raise UserError(
                "this chat template rewrites earlier turns when a turn is added, so mmdp cannot "
                "find the replies in it (labels would be guessed); use a template that only "
                "appends each turn"
            )
        reply = message["content"][-1]["text"]
        turn = upto[len(before) :]
        for candidate in (reply, reply.strip()):
            end = turn.rfind(candidate + end_of_turn)
            if end >= 0:
                break
        else:
            raise UserError(
                f"this chat template does not render a reply as its text followed by "
                f"{end_of_turn!r}, so mmdp cannot find the replies in it"
            )
        start = len(before) + end
        spans.append((start, start + len(candidate) + len(end_of_turn)))
    return text, spans
