"""Turn one sample's conversation into `input_ids` and `labels` with the chat template.

Where the images go. A row's user turns may hold `<image>` and `<video>` tags (the messages and
LLaVA formats keep them: mmdp.data.reading.formats): each file then stands where its tag stands, the
k-th `<image>` tag for the row's k-th image. A row with no tag at all (the_cauldron's) has its
images, then its videos, first in the first user turn. A row whose tags do not match its files in
number is dropped (MEDIA_TAG_MISMATCH): mmdp never guesses where an image goes. Only the user
turns' tags stand for files; a reply's or a system prompt's text is text.

Two ways to find the replies, the tokens that get labels:
- mmdp's own ChatML template (TinyVLM, the default) marks them with {% generation %}, and
  `tokenize_conversation` reads transformers' assistant mask;
- a real model's template (every family of mmdp.data.families) has no such markers, and
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

import re

import torch
from transformers import PreTrainedTokenizerBase

from mmdp import config
from mmdp.drop_reasons import (
    AUDIO_REFUSED,
    EMPTY_REPLY,
    IMAGE_TOKEN_IN_TEXT,
    MEDIA_TAG_MISMATCH,
    NO_TEXTS,
    BadRow,
)
from mmdp.errors import UserError

# The tags that say where a file stands in a user turn (ms-swift's, LLaMA-Factory's and LLaVA's).
IMAGE_TAG = "<image>"
VIDEO_TAG = "<video>"
TAGS = re.compile(f"({re.escape(IMAGE_TAG)}|{re.escape(VIDEO_TAG)})")
AUDIO_TAG = "<audio>"  # a row with audio: dropped (AUDIO_REFUSED), mmdp packs no audio yet


class BadConversation(BadRow):
    """A conversation that cannot be used; `reason` is one of mmdp.drop_reasons."""


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
    """Chat messages for the template; every image becomes `image_token_length` image tokens,
    where its tag stands, or (a row without tags) in front of the first user message, one block
    per image, in image order (the blog's code expanded only the first image). The system
    prompt, if the row has one, comes first.
    """
    turns = chat_turns(texts, (tokenizer.image_token,))
    image_tokens = tokenizer.image_token * image_token_length
    messages = chat_messages(turns, num_images, 0, system_prompt(texts))
    return [  # the blog's template takes text: each image item becomes its tokens
        {
            **message,
            "content": "".join(item.get("text", image_tokens) for item in message["content"]),
        }
        for message in messages
    ]


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


# Real chat templates ------------------------------------------------------------------------------


def chat_turns(texts, reserved: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (user, assistant) turns of a row, checked: a row with no turns, an empty reply, audio (an
    <audio> tag in a user turn), or a `reserved` string (a model's image or turn tokens) in its
    text raises BadConversation. A user turn's tags are not its text (they stand for files), the
    system prompt is."""
    turns = normalize_texts(texts)
    if not turns:
        raise BadConversation(NO_TEXTS, "the sample has no conversation")
    checked = []
    system = turns[0].get("system") or ""
    for turn in turns:
        user, assistant = turn.get("user") or "", turn.get("assistant") or ""
        if not assistant.strip():
            raise BadConversation(EMPTY_REPLY, f"empty reply to {user[:40]!r}")
        if AUDIO_TAG in user:
            raise BadConversation(AUDIO_REFUSED, "the row holds audio, which mmdp does not pack")
        for token in reserved:
            if token in TAGS.sub("", user) or token in assistant or token in system:
                raise BadConversation(IMAGE_TOKEN_IN_TEXT, f"the text contains {token!r} itself")
        checked.append((user, assistant))
    return checked


def system_prompt(texts) -> str | None:
    """The row's system prompt (its first turn's "system"), or None: the_cauldron's rows have none.

    >>> system_prompt([{"user": "Hi", "assistant": "Hello.", "system": "Be brief."}])
    'Be brief.'
    """
    turns = normalize_texts(texts)
    return turns[0].get("system") if turns else None


def placed_at_tags(turns: list[tuple[str, str]], num_images: int, num_videos: int) -> bool:
    """Whether the row's files stand where its user turns' tags say (True), or, with no tag at
    all, first in the first user turn (False: the_cauldron's rows). Tags that do not match the
    files in number raise BadConversation(MEDIA_TAG_MISMATCH).

    >>> placed_at_tags([("What is in <image>?", "A cat.")], 1, 0)
    True
    >>> placed_at_tags([("What is in it?", "A cat.")], 1, 0)
    False
    >>> placed_at_tags([("<image> vs <image>?", "The left.")], 1, 0)
    Traceback (most recent call last):
    ...
    mmdp.data.conversation.BadConversation: media_tag_mismatch: 2 <image> and 0 <video> tags for 1 image(s) and 0 video(s)
    """
    tags = [tag for user, _ in turns for tag in TAGS.findall(user)]
    images, videos = tags.count(IMAGE_TAG), tags.count(VIDEO_TAG)
    if not tags:
        return False
    if (images, videos) != (num_images, num_videos):
        raise BadConversation(
            MEDIA_TAG_MISMATCH,
            f"{images} {IMAGE_TAG} and {videos} {VIDEO_TAG} tags for {num_images} image(s) and "
            f"{num_videos} video(s)",
        )
    return True


def user_content(text: str) -> list[dict]:
    """A tagged user turn as content items in text order: its text cut at each tag.

    >>> user_content("Compare <image> with <image>.")  # doctest: +NORMALIZE_WHITESPACE
    [{'type': 'text', 'text': 'Compare '}, {'type': 'image'}, {'type': 'text', 'text': ' with '},
     {'type': 'image'}, {'type': 'text', 'text': '.'}]
    """
    items = []
    for k, piece in enumerate(TAGS.split(text)):
        if k % 2:
            items.append({"type": "image" if piece == IMAGE_TAG else "video"})
        elif piece:  # no empty text between two tags: some templates render a newline for it
            items.append({"type": "text", "text": piece})
    return items or [{"type": "text", "text": ""}]


def chat_messages(
    turns: list[tuple[str, str]], num_images: int, num_videos: int = 0, system: str | None = None
) -> list[dict]:
    """Messages in the structured form real chat templates take: each image or video where its
    tag stands, or (a row without tags: the_cauldron's rows give no positions) the images first
    in the first user message, then the videos, then its text. The system prompt, if any, first.
    """
    tagged = placed_at_tags(turns, num_images, num_videos)
    messages = []
    if system is not None:
        messages.append({"role": "system", "content": [{"type": "text", "text": system}]})
    for user, assistant in turns:
        content = user_content(user) if tagged else [{"type": "text", "text": user}]
        messages.append({"role": "user", "content": content})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": assistant}]})
    if not tagged:
        media = [{"type": "image"}] * num_images + [{"type": "video"}] * num_videos
        first_user = messages[len(messages) - 2 * len(turns)]
        first_user["content"] = media + first_user["content"]
    return messages


def marked_turns(
    texts, num_images: int, num_videos: int = 0
) -> tuple[list[tuple[str, str]], str | None]:
    """The (user, reply) turns with each file's place marked as the families place it ("[image 1]",
    "[video 1]"), and None; or, when the row cannot place them (no turns, tags that do not match
    the files), the turns as they are and the drop reason. For people (stage 1), not models.

    >>> marked_turns([{"user": "Is <image> or <image> larger?", "assistant": "The first."}], 2)
    ([('Is [image 1] or [image 2] larger?', 'The first.')], None)
    >>> marked_turns([{"user": "Which is larger?", "assistant": "The first."}], 2)
    ([('[image 1] [image 2] Which is larger?', 'The first.')], None)
    """
    try:
        turns = [(user or "", assistant or "") for user, assistant in chat_turns(texts, ())]
        tagged = placed_at_tags(turns, num_images, num_videos)
    except BadConversation as error:
        turns = [
            (t.get("user") or "", t.get("assistant") or "") for t in normalize_texts_or_none(texts)
        ]
        return turns, error.reason
    counters = {
        IMAGE_TAG: iter(range(1, num_images + 1)),
        VIDEO_TAG: iter(range(1, num_videos + 1)),
    }

    def mark(tag: str) -> str:
        return f"[{tag.strip('<>')} {next(counters[tag])}]"

    if tagged:
        return [(TAGS.sub(lambda m: mark(m.group()), user), reply) for user, reply in turns], None
    marks = [mark(tag) for tag in [IMAGE_TAG] * num_images + [VIDEO_TAG] * num_videos]
    first_user, first_reply = turns[0]
    return [(" ".join([*marks, first_user]), first_reply), *turns[1:]], None


def normalize_texts_or_none(texts) -> list[dict]:
    try:
        return normalize_texts(texts)
    except BadConversation:
        return []


def reply_spans(
    render, messages: list[dict], end_of_turn: str
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation, and the character spans of each reply and its end-of-turn token.

    `render(messages)` is the model's own chat template (no generation prompt). A real template
    has no {% generation %} markers, so the replies are found by rendering the turns before each:
    for assistant message i, render(messages[:i]) must begin the whole conversation's text (the
    turns before a reply are rendered as in the whole), and the reply's turn, from there to the
    first `end_of_turn`, must end with the reply (as it is, or trimmed, as Gemma's and Qwen3.5's
    templates do). The turn itself is read in the whole text: Qwen3.5's template opens only the
    replies after the last user message with a thinking block, so a reply's turn changes once
    another turn follows it. The span runs from the reply's first character through
    `end_of_turn`; the newline after it is the template's, not the model's. A template where this
    does not hold raises a UserError: mmdp never guesses labels.

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
        before = render(messages[:i])
        if not text.startswith(before):
            raise UserError(
                "this chat template rewrites earlier turns when a turn is added, so mmdp cannot "
                "find the replies in it (labels would be guessed); use a template that only "
                "appends each turn"
            )
        reply = message["content"][-1]["text"]
        end = text.find(end_of_turn, len(before))  # where the reply's turn ends
        for candidate in (reply, reply.strip()):
            if end >= 0 and text.endswith(candidate, len(before), end):
                break
        else:
            raise UserError(
                f"this chat template does not render a reply as its text followed by "
                f"{end_of_turn!r}, so mmdp cannot find the replies in it"
            )
        spans.append((end - len(candidate), end + len(end_of_turn)))
    return text, spans
