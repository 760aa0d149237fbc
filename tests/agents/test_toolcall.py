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


STR_REPLACE = ('{"name": "str_replace", "arguments": {"path": "dice/__init__.py", '
               '"old_str": "FACES_PER_DIE = 4", "new_str": "FACES_PER_DIE = 6"}}')


def test_one_bare_call_object_is_accepted_wherever_it_stands():
    # What SmolLM2-135M writes for constant_fix_l1: the call exactly, in tags of its own.
    for text in (STR_REPLACE, f"<prefix_test>\n{STR_REPLACE}\n</pre>",
                 f"Sure, here it is:\n```json\n{STR_REPLACE}\n```", f"{STR_REPLACE} and then I am done"):
        calls, problems = parse(text)
        assert problems == [], text
        assert calls == [ToolCall("str_replace", {"path": "dice/__init__.py",
                                                  "old_str": "FACES_PER_DIE = 4",
                                                  "new_str": "FACES_PER_DIE = 6"})], text


def test_bare_call_is_checked_like_a_tagged_one():
    _, problems = parse('{"name": "rm_rf", "arguments": {}}')
    assert "Unknown tool 'rm_rf'" in problems[0].feedback
    _, problems = parse('{"name": "str_replace", "arguments": {"path": "a.py"}}')
    assert "missing argument(s) old_str, new_str" in problems[0].feedback


def test_objects_that_are_not_exactly_a_call_are_not_calls():
    # An echoed tool schema (extra keys), a name or arguments alone, not an object, cut off.
    for text in ('{"name": "submit", "description": "Finish.", "parameters": {}}',
                 '{"name": "submit"}', '{"arguments": {}}', '{"name": "submit", "arguments": {}, "x": 1}',
                 "[1, 2]", '{"name": "submit", "arguments": {'):
        calls, problems = parse(text)
        assert calls == [] and len(problems) == 1 and "No tool call found" in problems[0].feedback, text
    calls, problems = parse('{"name": {"a": 1}, "arguments": {}}')
    assert calls == [] and 'with a string "name"' in problems[0].feedback


def test_two_bare_calls_are_ambiguous_and_none_runs():
    calls, problems = parse(f'{STR_REPLACE}\n{{"name": "submit", "arguments": {{}}}}')
    assert calls == [] and "Found 2 JSON tool calls outside <tool_call>" in problems[0].feedback


def test_a_tagged_call_wins_and_bare_objects_beside_it_are_not_run():
    calls, problems = parse(f'{STR_REPLACE}\n<tool_call>{{"name": "submit", "arguments": {{}}}}</tool_call>')
    assert [c.name for c in calls] == ["submit"] and problems == []
    # An open tag with bad JSON is that call's problem; the bare object is not a fallback.
    calls, problems = parse(f"{STR_REPLACE}\n<tool_call>{{oops</tool_call>")
    assert calls == [] and "not valid JSON" in problems[0].feedback


def test_bare_call_in_a_custom_format_uses_its_keys():
    fmt = ToolCallFormat(open_tag="[CALL]", close_tag="[/CALL]", name_key="tool", arguments_key="args")
    calls, problems = parse('<x>{"tool": "bash", "args": {"command": "ls"}}</x>', fmt)
    assert problems == [] and calls == [ToolCall("bash", {"command": "ls"})]
    calls, _ = parse('{"name": "bash", "arguments": {"command": "ls"}}', fmt)
    assert calls == []


def test_hostile_text_is_rejected_cleanly():
    deep = 200_000
    hostile = [
        "<tool_call>" + "[" * deep + "</tool_call>",                        # nested too deep, tagged
        '{"name": "bash", "arguments": {"command": ' + "[" * deep + "]" * deep + "}}",  # bare
        '{"name": ' * 100_000,                                              # many starts, none closed
        '{"name": "submit", "arguments": {}}'[:-1] * 50_000,               # many unclosed objects
        "{" * 1_000_000,
        "\x00\ud800 <tool_call> \uffff",
    ]
    for text in hostile:
        calls, problems = parse(text)
        assert calls == [] and len(problems) == 1, text[:40]
    tagged_deep = parse("<tool_call>" + "[" * deep + "</tool_call>")[1][0].feedback
    assert "nested too deep" in tagged_deep


def test_bare_search_stops_after_its_candidate_budget():
    from agents.toolcall import MAX_BARE_CANDIDATES

    junk = '{"name": oops} ' * MAX_BARE_CANDIDATES
    calls, _ = parse(junk + '{"name": "submit", "arguments": {}}')
    assert calls == []
    calls, _ = parse(junk[: -len('{"name": oops} ')] + '{"name": "submit", "arguments": {}}')
    assert [c.name for c in calls] == ["submit"]
