"""Worked examples before the task (``episode.demonstrations``): the call shown is one the
episode's parser runs, the server's config gives the default, none, or the user's list, and
an episode's first prompt carries them before the task. And the two tool listings of the
system prompt (``episode.tool_listing``)."""

import httpx
import pytest
from omegaconf import OmegaConf

from agents.chat import ByteTokenizer, ChatRenderer
from agents.loop import (DEFAULT_DEMONSTRATIONS, DEFAULT_SYSTEM_PROMPT, Demonstration, EpisodeConfig,
                         EpisodeLimits, run_episode, tools_prompt)
from agents.scripted import ScriptedServer, tool_call
from agents.server import AgentServerError, demonstrations
from agents.toolcall import ToolCallFormat, parse_tool_calls
from agents.tools import TOOL_SPECS
from rollout.client import ModelClient
from router.headers import SessionHeaders


def test_the_default_demonstration_shows_a_call_the_parser_runs():
    (demo,) = DEFAULT_DEMONSTRATIONS
    issue, answer = demo.exchange()
    calls, problems = parse_tool_calls(answer, TOOL_SPECS)
    assert not problems and [(c.name, c.arguments) for c in calls] == [("str_replace", dict(demo.arguments))]
    assert issue == demo.problem_statement and "box/__init__.py" in issue


def test_a_demonstration_is_written_in_the_episode_tool_format():
    fmt = ToolCallFormat(open_tag="<call>", close_tag="</call>")
    _, answer = Demonstration("x", "submit", {}).exchange(fmt)
    assert answer.startswith("<call>\n") and answer.endswith("\n</call>")


@pytest.mark.parametrize(("tool", "arguments", "why"), [
    ("nope", {}, "Unknown tool 'nope'"),
    ("str_replace", {"path": "a.py"}, "missing argument(s) old_str, new_str"),
    ("submit", {"extra": 1}, "unknown argument(s) extra"),
])
def test_a_demonstration_of_an_invalid_call_is_refused(tool, arguments, why):
    with pytest.raises(ValueError, match="not a valid tool call") as e:
        Demonstration("x", tool, arguments).check()
    assert why in str(e.value)


def test_server_config_null_is_the_default_an_empty_list_none():
    fmt = ToolCallFormat()
    assert demonstrations(None, fmt) == DEFAULT_DEMONSTRATIONS
    assert demonstrations(OmegaConf.create([]), fmt) == ()
    mine = demonstrations(OmegaConf.create([{"problem_statement": "i", "tool": "submit", "arguments": {}}]), fmt)
    assert mine == (Demonstration("i", "submit", {}),)


@pytest.mark.parametrize("entry", ["x", {"problem_statement": "i", "tool": "submit"}, {"problem_statement": 3, "tool": "submit", "arguments": {}}])
def test_server_config_entry_of_the_wrong_shape_names_its_index(entry):
    good = {"problem_statement": "i", "tool": "submit", "arguments": {}}
    with pytest.raises(AgentServerError, match=r"episode.demonstrations\[1\]: give \{problem_statement"):
        demonstrations(OmegaConf.create([good, entry]), ToolCallFormat())


@pytest.mark.parametrize("shown", [(), DEFAULT_DEMONSTRATIONS])
async def test_an_episode_prompt_carries_the_demonstrations_before_the_task(handmade_tasks, shown):
    task = handmade_tasks["handmade__stats_mean"]
    renderer = ChatRenderer(ByteTokenizer())
    cfg = EpisodeConfig(limits=EpisodeLimits(max_turns=2, max_context_tokens=65536,
                                             max_tokens_per_turn=4096),
                        demonstrations=shown)
    server = ScriptedServer(lambda s, turn, p: [tool_call("bash", command="ls"), tool_call("submit")][turn])
    runner, url = await server.start()
    try:
        async with httpx.AsyncClient() as http:
            client = ModelClient(http, url, "scripted", retries=0)
            result = await run_episode(task, SessionHeaders("s", "agent", group_id="g", unit_id="u"),
                                       client, renderer, cfg)
    finally:
        await runner.cleanup()
    # the scripted policy saw turns 0 and 1 (not shifted by the demonstrations' turns)
    assert [t.tool_calls for t in result.turns] == [["bash"], ["submit"]]
    prompt = renderer.tok.decode(result.prompt_ids)
    assert prompt.endswith(f"<|im_start|>user\n{task.problem_statement}<|im_end|>\n<|im_start|>assistant\n")
    for issue, answer in (d.exchange() for d in shown):
        assert f"<|im_start|>user\n{issue}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n" in prompt
    assert prompt.count("<|im_start|>assistant\n") == len(shown) + 1


def test_the_signature_listing_names_every_tool_and_argument_on_one_line_each():
    text = tools_prompt(DEFAULT_SYSTEM_PROMPT, "signatures")
    lines = [line for line in text.splitlines() if "(" in line and "): " in line]
    assert lines == [spec.signature() for spec in TOOL_SPECS.values()]
    assert "str_replace(path, old_str, new_str): Replace" in text
    assert "read_file(path, [start_line], [end_line]): " in text and "submit(): Finish" in text
    assert len(text) < len(tools_prompt(DEFAULT_SYSTEM_PROMPT, "schemas")) / 2
    assert '"parameters"' in tools_prompt(DEFAULT_SYSTEM_PROMPT) and '"parameters"' not in text
    with pytest.raises(ValueError, match="tool listing 'json': choose one of schemas, signatures"):
        tools_prompt(DEFAULT_SYSTEM_PROMPT, "json")


async def test_an_episode_prompt_lists_the_tools_as_configured(handmade_tasks):
    renderer = ChatRenderer(ByteTokenizer())
    server = ScriptedServer(lambda s, turn, p: tool_call("submit"))
    runner, url = await server.start()
    try:
        async with httpx.AsyncClient() as http:
            client = ModelClient(http, url, "scripted", retries=0)
            cfg = EpisodeConfig(limits=EpisodeLimits(max_turns=1, max_context_tokens=65536),
                                tool_listing="signatures")
            result = await run_episode(handmade_tasks["handmade__stats_mean"],
                                       SessionHeaders("s", "agent", group_id="g", unit_id="u"),
                                       client, renderer, cfg)
    finally:
        await runner.cleanup()
    prompt = renderer.tok.decode(result.prompt_ids)
    assert tools_prompt(DEFAULT_SYSTEM_PROMPT, "signatures") in prompt
