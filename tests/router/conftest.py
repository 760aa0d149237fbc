"""Fixtures shared by the router tests."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def save_word_tokenizer(path, chat_template: str = CHATML) -> str:
    """Save a word-level tokenizer (10 tokens) with ``chat_template`` in ``path``, like a
    model folder; returns the path."""
    words = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system", "hello", "world", "again", "\n"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.WhitespaceSplit()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = chat_template
    fast.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A word-level tokenizer (10 tokens) with a ChatML template (``CHATML``), saved like a
    model folder."""
    return save_word_tokenizer(tmp_path_factory.mktemp("model"))
