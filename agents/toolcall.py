"""Parsing tool calls out of model text (Hermes-style ``<tool_call>`` JSON by default).

A ChatML model answers, e.g.::

    I will look at the file.
    <tool_call>
    {"name": "read_file", "arguments": {"path": "toolz/itertoolz.py"}}
    </tool_call>

``parse_tool_calls`` returns the calls it could read and, for each part it could not,
a ``ToolCallProblem`` whose ``feedback`` is shown to the model as the next observation.
Malformed output never raises: it is the model's mistake, and the episode goes on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class ToolCallFormat:
    """Markers around one JSON tool call in the model's text.

    Attributes:
        open_tag, close_tag: the markers (Hermes: ``<tool_call>`` / ``</tool_call>``).
        name_key, arguments_key: JSON keys of the tool name and of its argument object.
    """

    open_tag: str = "<tool_call>"
    close_tag: str = "</tool_call>"
    name_key: str = "name"
    arguments_key: str = "arguments"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: tool ``name`` with keyword ``arguments``."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallProblem:
    """A part of the model's text that looked like a tool call but could not be used."""

    feedback: str


@dataclass(frozen=True)
class ToolSpec:
    """What a tool accepts: its name, a one-line description, and its arguments.

    Attributes:
        required: argument name -> description, for arguments that must be given.
        optional: argument name -> description, for arguments that may be left out.
    """

    name: str
    description: str
    required: Mapping[str, str] = field(default_factory=dict)
    optional: Mapping[str, str] = field(default_factory=dict)

    def as_json_schema(self) -> dict[str, Any]:
        """The OpenAI/Hermes ``function`` schema of this tool (all arguments strings)."""
        props = {k: {"type": "string", "description": v}
                 for k, v in {**self.required, **self.optional}.items()}
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": props,
                           "required": list(self.required)}}}


def format_tool_call(name: str, arguments: Mapping[str, Any],
                     fmt: ToolCallFormat = ToolCallFormat()) -> str:
    """One tool call as a model writes it (the inverse of ``parse_tool_calls``)."""
    body = json.dumps({fmt.name_key: name, fmt.arguments_key: dict(arguments)})
    return f"{fmt.open_tag}\n{body}\n{fmt.close_tag}"


def parse_tool_calls(text: str, specs: Mapping[str, ToolSpec],
                     fmt: ToolCallFormat = ToolCallFormat()
                     ) -> tuple[list[ToolCall], list[ToolCallProblem]]:
    """Find the tool calls in ``text`` and check them against ``specs``.

    Args:
        text: one model turn (decoded completion, end token removed).
        specs: tool name -> ToolSpec of the tools the episode offers.
        fmt: the markers the model's chat template uses.

    Returns:
        (calls, problems): calls in the order written; one problem per unusable part
        (bad JSON, unknown tool, missing or unexpected argument, unclosed tag, or no tool
        call at all).
    """
    calls: list[ToolCall] = []
    problems: list[ToolCallProblem] = []
    example = (f'{fmt.open_tag}\n{{"{fmt.name_key}": "bash", "{fmt.arguments_key}": '
               f'{{"command": "ls"}}}}\n{fmt.close_tag}')
    pattern = re.compile(re.escape(fmt.open_tag) + r"(.*?)(" + re.escape(fmt.close_tag) + r"|$)",
                         re.DOTALL)
    for match in pattern.finditer(text):
        body, closed = match.group(1).strip(), bool(match.group(2))
        call, problem = _read_call(body, specs, fmt, example)
        if call is not None:
            # An unclosed call with valid JSON is accepted: the model was cut off or
            # stopped at the end token right after the object.
            calls.append(call)
        elif not closed:
            problems.append(ToolCallProblem(
                f"Your tool call was cut off: it is not closed with {fmt.close_tag} and its "
                f"JSON is incomplete. Keep the call short and write exactly:\n{example}"))
        elif problem is not None:
            problems.append(problem)
    if not calls and not problems:
        problems.append(ToolCallProblem(
            "No tool call found. Every answer must call exactly one tool, like:\n"
            f"{example}\nAvailable tools: {', '.join(specs)}. Call submit when you are done."))
    return calls, problems


def _read_call(body: str, specs: Mapping[str, ToolSpec], fmt: ToolCallFormat,
               example: str) -> tuple[ToolCall | None, ToolCallProblem | None]:
    body = re.sub(r"^```(?:json)?\s*|\s*```$", "", body)
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return None, ToolCallProblem(
            f"Your tool call is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}). "
            f"Write one JSON object, like:\n{example}")
    if not isinstance(obj, dict) or not isinstance(obj.get(fmt.name_key), str):
        return None, ToolCallProblem(
            f'A tool call must be a JSON object with a string "{fmt.name_key}", like:\n{example}')
    name = obj[fmt.name_key]
    spec = specs.get(name)
    if spec is None:
        return None, ToolCallProblem(
            f"Unknown tool {name!r}. Available tools: {', '.join(specs)}.")
    args = obj.get(fmt.arguments_key, {})
    if isinstance(args, str):  # some templates emit the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            args = None
    if not isinstance(args, dict):
        return None, ToolCallProblem(
            f'"{fmt.arguments_key}" of {name} must be a JSON object, like:\n{example}')
    missing = [k for k in spec.required if k not in args]
    unknown = [k for k in args if k not in spec.required and k not in spec.optional]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing argument(s) {', '.join(missing)}")
        if unknown:
            parts.append(f"unknown argument(s) {', '.join(unknown)}")
        allowed = ", ".join([*spec.required, *(f"{k} (optional)" for k in spec.optional)])
        return None, ToolCallProblem(f"Tool {name}: {'; '.join(parts)}. It takes: {allowed or 'nothing'}.")
    # Tools take strings; a number or list the model wrote is passed on as its JSON text.
    return ToolCall(name, {k: v if isinstance(v, str) else json.dumps(v)
                           for k, v in args.items()}), None
