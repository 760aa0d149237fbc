"""What the live router refuses, and how: request-body checks and OpenAI-format errors.

A bad request gets an OpenAI-format JSON error ``{"error": {"message", "type", "param",
"code"}}`` (see ``router.server``'s docstring for the statuses and codes). The checks here
read only the body; the prompt's shape is checked where it is tokenized
(``router.tokenize``).
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import msgspec
from aiohttp import web, web_protocol


def _client_http_error_as_one_line(record: logging.LogRecord) -> bool:
    """Log filter for ``aiohttp.server``: a client's malformed HTTP (aiohttp answers it 400)
    becomes one warning line instead of an error with a traceback; nothing is dropped."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, aiohttp.http_exceptions.HttpProcessingError) and exc.code == 400:
        record.msg, record.args = "client sent malformed HTTP (answered 400): %s", (exc.message,)
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


logging.getLogger("aiohttp.server").addFilter(_client_http_error_as_one_line)


class BadRequestError(Exception):
    """A bad client request; becomes an OpenAI-format JSON error with ``status``."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def error_body(status: int, message: str, code: str | None = None) -> dict:
    """OpenAI-format error ``{"error": {"message", "type", "param", "code"}}`` for ``status``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code or str(status)}}


def error_response(status: int, message: str, code: str | None = None) -> web.Response:
    """:func:`error_body` as a JSON response with ``status``."""
    return web.json_response(error_body(status, message, code), status=status)


class JsonErrorRequestHandler(web_protocol.RequestHandler):
    """aiohttp's connection handler, answering the errors of the HTTP layer itself
    (malformed request line or headers, a line over aiohttp's 8190-byte limit, a bad
    method, a handler that escaped) in OpenAI format instead of aiohttp's text/plain."""

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if the answer has begun
        if isinstance(exc, aiohttp.http_exceptions.LineTooLong):
            text = ("malformed HTTP request: the request line or a header line is longer than the server's "
                    "limit of 8190 bytes; send large data in the body")
        elif isinstance(exc, aiohttp.http_exceptions.HttpProcessingError):
            detail = " ".join((exc.message or "").split())
            text = f"malformed HTTP request: {detail[:200]}"
        elif status == 504:
            text = "the router timed out handling the request"
        else:
            text = f"internal router error: {type(exc).__name__}" if exc is not None else (message or "error")
        response = error_response(status, text, "malformed_http" if status == 400 else None)
        response.force_close()
        return response


class JsonErrorServer(web.Server):
    """``web.Server`` whose connections use :class:`JsonErrorRequestHandler`."""

    def __call__(self) -> web_protocol.RequestHandler:
        return JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)


def json_type(value: Any) -> str:
    """``value`` for an error message: a scalar as JSON (cut to 40 characters), else its type."""
    if isinstance(value, (list, dict)):
        return "an array" if isinstance(value, list) else "an object"
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= 40 else text[:37] + "..."


def decode_json_object(raw: bytes) -> dict:
    """Decode a request body that must be one JSON object (UTF-8).

    Raises:
        BadRequestError: 400 ``invalid_json`` naming the problem: invalid UTF-8 (with the byte
            offset), malformed JSON, nesting deeper than the decoder's limit, or a value
            that is not an object.
    """
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise BadRequestError(400, f"request body is not valid UTF-8 (byte {raw[bad.start]:#04x} at offset "
                              f"{bad.start}); send JSON encoded as UTF-8", "invalid_json") from None
        raise BadRequestError(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
    except RecursionError:  # msgspec stops at ~1000 nested arrays/objects
        raise BadRequestError(400, "request body nests JSON arrays/objects too deeply (the limit is about "
                          "1000 levels); an OpenAI request needs a few", "invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequestError(400, f"request body must be a JSON object, got {json_type(body)}", "invalid_json")
    return body


def check_field_types(body: dict) -> None:
    """Check the types of the request fields the router reads besides the prompt.

    ``model`` must be a string, ``stream`` true/false/null, ``max_tokens`` and
    ``max_completion_tokens`` non-negative integers or null.

    Raises:
        BadRequestError: 400 ``invalid_type`` naming the field, the expected and the given type.
    """
    checks = (
        ("model", lambda v: isinstance(v, str), "a string"),
        ("stream", lambda v: v is None or isinstance(v, bool), "true, false or null"),
        ("max_tokens", _is_token_count, "a non-negative integer or null"),
        ("max_completion_tokens", _is_token_count, "a non-negative integer or null"),
    )
    for name, ok, expected in checks:
        if name in body and not ok(body[name]):
            raise BadRequestError(400, f"'{name}' must be {expected}, got {json_type(body[name])}", "invalid_type")


def _is_token_count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
