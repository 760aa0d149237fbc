"""Prompt -> token ids -> block hashes (router/tokenize.py), with a tiny local tokenizer
(``model_dir`` in conftest.py)."""

from __future__ import annotations

import pytest

from router.prefix_index import chain_hashes
from router.tokenize import PromptError, PromptTokenizer

def test_chat_prompt_rendered_with_template_and_hashed_per_full_block(model_dir):
    tokenizer = PromptTokenizer(model_dir, block_size=4)
    body = {"model": "m", "messages": [{"role": "user", "content": "hello world hello world"}]}
    info = tokenizer.prompt_info(body, "chat")
    ids, text = tokenizer.token_ids(body, "chat")
    assert text.endswith("<|im_start|>assistant\n") and "hello world" in text
    assert info.prompt_tokens == len(ids) and len(ids) >= 8
    assert info.block_hashes == tuple(chain_hashes(ids, 4)) and len(info.block_hashes) == len(ids) // 4


def test_continuation_shares_the_prefix_blocks_of_its_first_turn(model_dir):
    tokenizer = PromptTokenizer(model_dir, block_size=2)
    first = [{"role": "user", "content": "hello world"}]
    second = first + [{"role": "assistant", "content": "again"}, {"role": "user", "content": "world"}]
    a = tokenizer.prompt_info({"messages": first}, "chat").block_hashes
    b = tokenizer.prompt_info({"messages": second}, "chat").block_hashes
    shared = len(tokenizer.token_ids({"messages": first}, "chat")[0]) // 2 - 1  # the generation prompt differs
    assert a[:shared] == b[:shared] and len(b) > len(a)


def test_completion_token_list_used_as_is_without_a_tokenizer():
    info = PromptTokenizer(None, block_size=4).prompt_info({"prompt": list(range(10))}, "completions")
    assert info.prompt_tokens == 10 and info.block_hashes == tuple(chain_hashes(list(range(10)), 4))


def test_text_prompt_without_tokenizer_estimates_length_and_has_no_hashes():
    info = PromptTokenizer(None, block_size=4).prompt_info({"prompt": "x" * 41}, "completions")
    assert info.prompt_tokens == 11 and info.block_hashes == () and info.prompt_text == "x" * 41


def test_block_size_unknown_gives_no_hashes(model_dir):
    info = PromptTokenizer(model_dir).prompt_info({"prompt": "hello world hello world"}, "completions")
    assert info.block_hashes == () and info.prompt_tokens >= 4


@pytest.mark.parametrize(("body", "endpoint"), [({"messages": "hi"}, "chat"), ({"messages": ["hi"]}, "chat"),
                                               ({"prompt": 3}, "completions"), ({"prompt": [1.5]}, "completions")])
def test_malformed_prompt_raises_prompt_error(body, endpoint):
    with pytest.raises(PromptError):
        PromptTokenizer(None).prompt_info(body, endpoint)



def test_a_missing_model_path_is_refused_at_once_with_rl_trains_wording():
    import pytest

    from router.policies.base import RouterConfigError
    from router.tokenize import load_tokenizer

    with pytest.raises(RouterConfigError, match=r"model.path=/nonexist does not exist\. Give an existing local "
                                                r"Hugging Face folder or a hub id \(org/name\)"):
        load_tokenizer("/nonexist")
