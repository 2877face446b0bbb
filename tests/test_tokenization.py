import pytest
import torch

from mmdp import config
from mmdp.data.conversation import BadConversation, count_tokens_batch, tokenize_conversation
from mmdp.data.tokenizer import get_tokenizer
from mmdp.drop_reasons import EMPTY_REPLY, IMAGE_TOKEN_IN_TEXT, NO_TEXTS
from mmdp.errors import UserError


def test_shipped_tokenizer_is_smollm2_with_image_token(tokenizer):
    assert tokenizer.vocab_size == 49_152
    assert len(tokenizer) == 49_153  # plus <|image|>
    assert tokenizer.image_token == "<|image|>"
    assert tokenizer.convert_tokens_to_ids("<|image|>") == tokenizer.image_token_id == 49_152
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"


def test_chat_template_is_plain_chatml(tokenizer):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"


def trained_tokens(tokenizer, input_ids, labels):
    kept = labels != config.IGNORE_INDEX
    assert torch.equal(labels[kept], input_ids[kept])  # labels are not shifted
    return tokenizer.decode(input_ids[kept])


def test_labels_cover_each_reply_and_its_im_end(tokenizer):
    texts = [
        {"user": "How many circles?", "assistant": "3", "source": "count"},
        {"user": "And squares?", "assistant": "There are 2 squares.", "source": "count"},
    ]
    input_ids, labels = tokenize_conversation(texts, 0, tokenizer)
    assert input_ids.shape == labels.shape and input_ids.dtype == torch.long
    assert (
        trained_tokens(tokenizer, input_ids, labels) == "3<|im_end|>There are 2 squares.<|im_end|>"
    )
    # the <|im_end|> of the user turns is the same id as the pad token, yet is not trained
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (input_ids == im_end).sum() == 4
    assert ((labels == im_end).sum()) == 2


@pytest.mark.parametrize("num_images", [0, 1, 3])
def test_every_image_gets_its_image_tokens(tokenizer, num_images):
    texts = [{"user": "Describe.", "assistant": "Shapes.", "source": "describe"}]
    input_ids, labels = tokenize_conversation(texts, num_images, tokenizer)
    is_image = input_ids == tokenizer.image_token_id
    assert is_image.sum() == num_images * config.IMAGE_TOKEN_LENGTH
    # image tokens are one contiguous block in the first user turn, never trained
    positions = is_image.nonzero().flatten()
    if num_images:
        assert positions.tolist() == list(range(positions[0], positions[0] + len(positions)))
    assert (labels[is_image] == config.IGNORE_INDEX).all()
    lengths, _ = count_tokens_batch([texts], [num_images], tokenizer, config.IMAGE_TOKEN_LENGTH)
    assert len(input_ids) == lengths[0]


def test_texts_stored_as_dict_of_lists_are_read_as_turns(tokenizer):
    as_list = [{"user": "Q1", "assistant": "A1"}, {"user": "Q2", "assistant": "A2"}]
    as_dict = {"user": ["Q1", "Q2"], "assistant": ["A1", "A2"]}
    a = tokenize_conversation(as_list, 1, tokenizer)
    b = tokenize_conversation(as_dict, 1, tokenizer)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize(
    ("texts", "reason"),
    [
        ([], NO_TEXTS),
        (None, NO_TEXTS),
        ([{"user": "Q", "assistant": "  "}], EMPTY_REPLY),
        ([{"user": "Q", "assistant": None}], EMPTY_REPLY),
        ([{"user": "look <|image|> here", "assistant": "A"}], IMAGE_TOKEN_IN_TEXT),
    ],
)
def test_unusable_conversations_name_their_reason(tokenizer, texts, reason):
    with pytest.raises(BadConversation) as error:
        tokenize_conversation(texts, 1, tokenizer)
    assert error.value.reason == reason


def save_tiny_tokenizer(path, chat_template: str) -> str:
    """A tokenizer without ChatML's special tokens (like Llama 3, Gemma, Mistral), saved locally."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "Q", "A", "What?", "This."]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(path)
    return str(path)


MISTRAL_LIKE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST] ' }}"
    "{% else %}{GENERATION}{{ m['content'] + ' </s> ' }}{END}{% endif %}{% endfor %}"
)


def test_a_tokenizer_without_chatml_keeps_its_own_template_when_it_marks_replies(tmp_path):
    template = MISTRAL_LIKE.replace("{GENERATION}", "{% generation %}").replace(
        "{END}", "{% endgeneration %}"
    )
    tokenizer = get_tokenizer(save_tiny_tokenizer(tmp_path, template))
    assert tokenizer.chat_template == template  # its own, not SmolLM2's ChatML
    texts = [{"user": "What?", "assistant": "This."}]
    input_ids, labels = tokenize_conversation(texts, 1, tokenizer, image_token_length=2)
    assert tokenizer.convert_ids_to_tokens(input_ids.tolist()) == [
        "[INST]",
        "<|image|>",
        "<|image|>",
        "What?",
        "[/INST]",
        "This.",
        "</s>",
    ]
    trained = labels != config.IGNORE_INDEX
    assert tokenizer.convert_ids_to_tokens(labels[trained].tolist()) == ["This.", "</s>"]


def test_a_tokenizer_without_chatml_or_reply_markers_is_refused_in_one_sentence(tmp_path):
    template = MISTRAL_LIKE.replace("{GENERATION}", "").replace("{END}", "")
    with pytest.raises(UserError, match=r"does not mark assistant replies with \{% generation %\}"):
        get_tokenizer(save_tiny_tokenizer(tmp_path, template))
