"""The tool-call parser on well-formed and malformed model output."""

from agents.toolcall import ToolCall, ToolCallFormat, format_tool_call, parse_tool_calls
from agents.tools import TOOL_SPECS


def parse(text, fmt=ToolCallFormat()):
    return parse_tool_calls(text, TOOL_SPECS, fmt)


def test_hermes_call_with_surrounding_text_is_parsed():
    calls, problems = parse('Let me look.\n<tool_call>\n{"name": "read_file", '
                            '"arguments": {"path": "a.py", "start_line": 3}}\n</tool_call>')
    assert problems == []
    assert [(c.name, c.arguments) for c in calls] == [("read_file", {"path": "a.py", "start_line": "3"})]


def test_two_calls_keep_their_order():
    text = ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
            '<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
    calls, problems = parse(text)
    assert [c.name for c in calls] == ["bash", "submit"] and problems == []


def test_no_tool_call_gets_feedback_with_example():
    calls, problems = parse("I think the bug is in line 3.")
    assert calls == []
    assert "No tool call found" in problems[0].feedback
    assert "<tool_call>" in problems[0].feedback


def test_invalid_json_reports_position():
    calls, problems = parse('<tool_call>{"name": "bash", "arguments": {"command": "ls"}</tool_call>')
    assert calls == []
    assert "not valid JSON" in problems[0].feedback and "column" in problems[0].feedback


def test_unknown_tool_lists_available_tools():
    _, problems = parse('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>')
    assert "Unknown tool 'rm_rf'" in problems[0].feedback
    assert "str_replace" in problems[0].feedback


def test_missing_and_unknown_arguments_are_named():
    _, problems = parse('<tool_call>{"name": "str_replace", "arguments": '
                        '{"path": "a.py", "old": "x"}}</tool_call>')
    msg = problems[0].feedback
    assert "missing argument(s) old_str, new_str" in msg and "unknown argument(s) old" in msg


def test_cut_off_call_is_reported_not_raised():
    calls, problems = parse('<tool_call>\n{"name": "write_file", "arguments": {"path": "a.py", "cont')
    assert calls == []
    assert "cut off" in problems[0].feedback


def test_unclosed_call_with_complete_json_is_accepted():
    calls, problems = parse('<tool_call>\n{"name": "submit", "arguments": {}}')
    assert [c.name for c in calls] == ["submit"] and problems == []


def test_arguments_as_json_string_and_code_fence_are_accepted():
    calls, problems = parse('<tool_call>```json\n{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}\n```</tool_call>')
    assert problems == [] and calls[0].arguments == {"command": "pwd"}


def test_non_object_payloads_get_feedback():
    for body in ('["bash"]', '{"arguments": {}}', '{"name": "bash", "arguments": [1]}'):
        calls, problems = parse(f"<tool_call>{body}</tool_call>")
        assert calls == [] and len(problems) == 1, body


def test_custom_format_markers():
    fmt = ToolCallFormat(open_tag="[CALL]", close_tag="[/CALL]", name_key="tool", arguments_key="args")
    calls, problems = parse('[CALL]{"tool": "bash", "args": {"command": "ls"}}[/CALL]', fmt)
    assert problems == [] and calls[0].name == "bash"


def test_a_formatted_call_parses_back_to_itself_in_any_format():
    fmt = ToolCallFormat(open_tag="<call>", close_tag="</call>", name_key="tool", arguments_key="args")
    for f in (ToolCallFormat(), fmt):
        text = format_tool_call("read_file", {"path": "a.py", "start_line": "2"}, f)
        assert parse_tool_calls(text, TOOL_SPECS, f) == (
            [ToolCall("read_file", {"path": "a.py", "start_line": "2"})], [])
