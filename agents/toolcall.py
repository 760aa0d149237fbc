"""Parsing tool calls out of model text (Hermes-style ``<tool_call>`` JSON by default).

A ChatML model answers, e.g.::

    I will look at the file.
    <tool_call>
    {"name": "read_file", "arguments": {"path": "toolz/itertoolz.py"}}
    </tool_call>

``parse_tool_calls`` returns the calls it could read and, for each part it could not,
a ``ToolCallProblem`` whose ``feedback`` is shown to the model as the next observation.
Malformed output never raises: it is the model's mistake, and the episode goes on.

Accepted:

1. calls between the format's tags (``<tool_call>`` ... ``</tool_call>``), any number, in
   the order written; the JSON may sit in a code fence, and the last call may lack its
   close tag (the model stopped right after the object);
2. only where the text has no open tag at all: exactly one bare call object, a JSON object
   whose keys are exactly the name and the arguments key (``{"name": ..., "arguments":
   {...}}``), wherever it stands (plain, in a code fence, between made-up tags). A small
   model (SmolLM2-135M) sometimes writes a call exactly but in tags of its own
   (``<tool_response>`` ... ``</tool_response>``, ``<prefix_test>`` ... ``</pre>``); the
   call is unambiguous, so it is run.
   Objects with other keys (a tool's schema echoed from the prompt has ``description``
   and ``parameters``) are not calls. Two or more bare call objects are ambiguous (a plan
   or a list of examples as much as calls) and run none: the model is told to tag them.

Everything else (no call, bad JSON, an unknown tool or argument) is a problem with
feedback. The bare-object search looks at no more than ``MAX_BARE_CANDIDATES`` places
that start like a call object, so hostile text costs linear time; JSON nested too deep
for the decoder is bad JSON, not an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

MAX_BARE_CANDIDATES = 8
"""Places that start like a bare call object (``{"name":`` or ``{"arguments":``) the
untagged search decodes at most; text with more has no bare call read from it."""


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

    def signature(self) -> str:
        """One line: ``name(arg, [optional_arg]): description`` (the compact tool listing)."""
        args = [*self.required, *(f"[{k}]" for k in self.optional)]
        return f"{self.name}({', '.join(args)}): {self.description}"

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
        (bad JSON, unknown tool, missing or unexpected argument, unclosed tag, several
        untagged calls, or no tool call at all). Which text is a call: module docstring.
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
    if fmt.open_tag not in text:  # no tagged call: rule 2, one bare call object
        calls, problems = _bare_call(text, specs, fmt, example)
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
    except RecursionError:
        return None, ToolCallProblem(
            f"Your tool call is not valid JSON (nested too deep). Write one flat JSON "
            f"object, like:\n{example}")
    return _check_call(obj, specs, fmt, example)


def _bare_call(text: str, specs: Mapping[str, ToolSpec], fmt: ToolCallFormat,
               example: str) -> tuple[list[ToolCall], list[ToolCallProblem]]:
    """The one untagged call object in ``text`` (rule 2 of the module docstring)."""
    start = re.compile(r"\{\s*\"(?:" + re.escape(fmt.name_key) + "|"
                       + re.escape(fmt.arguments_key) + r")\"\s*:")
    decoder = json.JSONDecoder()
    found: list[Any] = []
    pos = 0
    for _ in range(MAX_BARE_CANDIDATES):
        m = start.search(text, pos)
        if m is None:
            break
        try:
            obj, end = decoder.raw_decode(text, m.start())
        except (ValueError, RecursionError):
            pos = m.end()
            continue
        pos = end  # objects inside this one are its arguments, not calls
        if isinstance(obj, dict) and set(obj) == {fmt.name_key, fmt.arguments_key}:
            found.append(obj)
    if len(found) > 1:
        return [], [ToolCallProblem(
            f"Found {len(found)} JSON tool calls outside {fmt.open_tag} tags; none was run. "
            f"Call one tool per answer, written as:\n{example}")]
    if not found:
        return [], []
    call, problem = _check_call(found[0], specs, fmt, example)
    return ([call], []) if call is not None else ([], [problem])


def _check_call(obj: Any, specs: Mapping[str, ToolSpec], fmt: ToolCallFormat,
                example: str) -> tuple[ToolCall | None, ToolCallProblem | None]:
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
