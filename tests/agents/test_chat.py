"""Token-level trajectory: exact ids, mask and log-probs aligned."""

import pytest

from agents.chat import ByteTokenizer, ChatRenderer, Trajectory


def test_byte_tokenizer_round_trips_specials_and_unicode():
    tok = ByteTokenizer()
    text = "<|im_start|>user\nhé ✓<|im_end|>\n"
    ids = tok.encode(text)
    assert ids[0] == tok.token_id("<|im_start|>")
    assert tok.decode(ids) == text


def test_model_turn_without_end_token_is_closed_by_template_not_model():
    r = ChatRenderer(ByteTokenizer())
    end = r.end_token_id
    assert r.close_model_turn([1, 2, end]) == r.tok.encode("\n")
    assert r.close_model_turn([1, 2]) == [end] + r.tok.encode("\n")


def test_trajectory_mask_and_logprobs_stay_aligned():
    t = Trajectory()
    t.add_context([1, 2, 3])
    t.add_model([4, 5], [-0.1, -0.2])
    t.add_context([6])
    assert t.loss_mask == [0, 0, 0, 1, 1, 0]
    assert t.logprobs == [None, None, None, -0.1, -0.2, None]
    with pytest.raises(ValueError, match="log-probs"):
        t.add_model([7], [])


def test_rendered_turns_equal_whole_conversation_text():
    r = ChatRenderer(ByteTokenizer())
    ids = r.first_prompt("sys", "fix it")
    model = r.tok.encode('<tool_call>{"name": "submit"}</tool_call>') + [r.end_token_id]
    ids += model + r.close_model_turn(model) + r.observation_turn(["ok"])
    assert r.tok.decode(ids) == (
        "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nfix it<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "submit"}</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert r.model_text(model) == '<tool_call>{"name": "submit"}</tool_call>'


def test_demonstrations_are_earlier_user_and_assistant_turns_in_order():
    r = ChatRenderer(ByteTokenizer())
    ids = r.first_prompt("sys", "fix it", [("fix a", "call a"), ("fix b", "call b")])
    assert r.tok.decode(ids) == (
        "<|im_start|>system\nsys<|im_end|>\n"
        "<|im_start|>user\nfix a<|im_end|>\n<|im_start|>assistant\ncall a<|im_end|>\n"
        "<|im_start|>user\nfix b<|im_end|>\n<|im_start|>assistant\ncall b<|im_end|>\n"
        "<|im_start|>user\nfix it<|im_end|>\n<|im_start|>assistant\n")
    assert r.first_prompt("sys", "fix it", []) == r.first_prompt("sys", "fix it")
