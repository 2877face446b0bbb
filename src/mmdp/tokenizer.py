"""The text tokenizer: SmolLM2's, shipped in the repo, with the blog's ChatML template."""

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from mmdp import config
from mmdp.errors import UserError
from mmdp.hub import require_hub


def get_tokenizer(name_or_path: str | Path | None = None) -> PreTrainedTokenizerBase:
    """Load a tokenizer ready for VLM training data.

    `None` loads the SmolLM2 tokenizer shipped in src/mmdp/smollm2_tokenizer (no network needed);
    a local directory or a Hub name (e.g. HuggingFaceTB/SmolLM2-360M-Instruct) loads that one.
    Either way, as in the blog:
    - `<|image|>` is added as a special token (`tokenizer.image_token`, `tokenizer.image_token_id`);
    - the chat template is plain ChatML, with no injected default system prompt;
    - the pad token is the eos token. For SmolLM2 both are `<|im_end|>`, which also closes every
      assistant reply, so nothing downstream may find padding or labels by comparing with pad_token_id.
    """
    source = config.DEFAULT_TOKENIZER if name_or_path is None else name_or_path
    if not Path(source).exists():
        require_hub(
            f"tokenizer {str(source)!r}",
            "run without --tokenizer to use the SmolLM2 tokenizer shipped in the repo",
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(source), extra_special_tokens={"image_token": config.IMAGE_TOKEN}
        )
    except (OSError, ValueError) as error:
        raise UserError(
            f"could not load tokenizer {str(source)!r} ({error.__class__.__name__}); "
            "run without --tokenizer to use the SmolLM2 tokenizer shipped in the repo"
        ) from error
    if not tokenizer.is_fast:
        raise UserError(f"tokenizer {str(source)!r} has no fast (Rust) version, which mmdp needs")
    tokenizer.chat_template = config.CHAT_TEMPLATE
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
