"""The text tokenizer: SmolLM2's, shipped in the repo, with the blog's ChatML template."""

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from mmdp import config
from mmdp.data.hub import looks_like_a_path, require_hub
from mmdp.errors import UserError

CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
GENERATION_MARKER = "{% generation %}"  # marks the assistant replies in a chat template


def get_tokenizer(name_or_path: str | Path | None = None) -> PreTrainedTokenizerBase:
    """Load a tokenizer ready for VLM training data.

    `None` loads the SmolLM2 tokenizer shipped in src/mmdp/data/smollm2_tokenizer (no network needed);
    a local directory or a Hub name (e.g. HuggingFaceTB/SmolLM2-360M-Instruct) loads that one.
    Either way, as in the blog:
    - `<|image|>` is added as a special token (`tokenizer.image_token`, `tokenizer.image_token_id`);
    - the chat template is plain ChatML, with no injected default system prompt, for a tokenizer
      whose vocabulary has ChatML's special tokens (SmolLM2, Qwen...). Any other tokenizer (Llama 3,
      Gemma, Mistral...) keeps its own template, which must mark the replies with
      `{% generation %}` so that labels can come from the assistant mask; mmdp never swaps in a
      template the model did not see;
    - the pad token is the eos token. For SmolLM2 both are `<|im_end|>`, which also closes every
      assistant reply, so nothing downstream may find padding or labels by comparing with pad_token_id.
    """
    source = str(config.DEFAULT_TOKENIZER if name_or_path is None else name_or_path)
    hint = "run without --tokenizer to use the SmolLM2 tokenizer shipped in the repo"
    if looks_like_a_path(source) and not Path(source).exists():
        raise UserError(f"tokenizer {source!r}: no such directory")
    if not Path(source).exists():
        require_hub(f"tokenizer {source!r}", hint)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source, extra_special_tokens={"image_token": config.IMAGE_TOKEN}
        )
    except (OSError, ValueError) as error:
        raise UserError(
            f"could not load tokenizer {source!r} ({error.__class__.__name__}); {hint}"
        ) from error
    if not tokenizer.is_fast:
        raise UserError(f"tokenizer {source!r} has no fast (Rust) version, which mmdp needs")
    tokenizer.chat_template = chat_template(tokenizer, source)
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def chat_template(tokenizer: PreTrainedTokenizerBase, source: str) -> str:
    """The blog's ChatML template when the vocabulary has ChatML's special tokens, else the
    tokenizer's own one if it marks replies; otherwise a UserError that says what to do."""
    if all(token in tokenizer.get_added_vocab() for token in CHATML_TOKENS):
        return config.CHAT_TEMPLATE
    own = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    if own and GENERATION_MARKER in own:
        return own
    raise UserError(
        f"tokenizer {source!r} has no {' and '.join(CHATML_TOKENS)} special tokens for the blog's "
        f"ChatML template, and its own chat template does not mark assistant replies with "
        f"{GENERATION_MARKER}...{{% endgeneration %}}: add those markers around the replies in "
        f"its chat_template (tokenizer_config.json or chat_template.jinja), so that labels can "
        f"come from the assistant mask"
    )
