"""Engine base URLs and KV-event endpoints as the router takes them (``engines.urls`` /
``engines.kv_event_endpoints`` of ``python -m router``, ``engine.urls`` /
``engine.kv_event_endpoints`` of a training job).

An engine base URL is ``http(s)://host[:port][/prefix]``: the router appends
``/v1/completions``, ``/health`` and ``/metrics`` to it, so it has a scheme and a host,
a numeric port if any, no query or fragment, and no trailing ``/v1`` (the OpenAI
client's base URL has one; the router's engine URL does not). A value such as ``localhost:8000``
(no scheme) or ``http://`` (no host) is refused before anything starts, with the key
named and a valid example, instead of failing on the first request or health probe.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

EXAMPLE_URLS = "[http://127.0.0.1:8001,http://127.0.0.1:8002]"
"""A valid value for an engine URL list, as a command-line override writes it."""


def url_problem(url: Any) -> str | None:
    """What keeps ``url`` from being an engine base URL, or None when it is one."""
    if not isinstance(url, str) or not url.strip():
        return "it is not a URL string"
    url = url.strip()
    if any(c.isspace() for c in url):
        return "it contains whitespace"
    if "://" not in url:
        return "it has no scheme (write http://host:port)"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is no number or out of range)
    except ValueError as exc:
        return f"it does not parse ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"its scheme {parts.scheme!r} is not http or https"
    if not parts.hostname:
        return "it has no host"
    if parts.query or parts.fragment:
        return "a base URL has no ?query or #fragment"
    return None


def _engine_url_problem(url: Any) -> str | None:
    """:func:`url_problem`, and no trailing ``/v1``: the router appends ``/v1/completions``."""
    problem = url_problem(url)
    if problem is None and urlsplit(url.strip()).path.rstrip("/").endswith("/v1"):
        return "it ends in /v1, but the router appends /v1/completions itself (give the URL without /v1)"
    return problem


def engine_urls_problem(urls: Any, key: str) -> str | None:
    """A message naming ``key`` when ``urls`` is not a list of engine base URLs, else None.

    Args:
        urls: the configured value (a list or tuple of strings is expected; empty is
            allowed here, callers that need engines say so themselves).
        key: the config key the value came from (``engines.urls``, ``engine.urls``).
    """
    return _list_problem(urls, key, "engine base URL", _engine_url_problem,
                         f"Give http(s)://host:port for each engine, e.g. {key}={EXAMPLE_URLS}")


def _list_problem(values: Any, key: str, what: str, item_problem, hint: str) -> str | None:
    """``key`` named with the first problem of ``values`` as a list of ``what`` (each item
    checked by ``item_problem``), followed by ``hint``; None when there is none."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        return f"{key}={values!r} must be a list of {what}s. {hint}"
    for i, value in enumerate(values):
        problem = item_problem(value)
        if problem is not None:
            return f"{key}[{i}]={value!r} is not a{'n' if what[0] in 'aeiou' else ''} {what}: {problem}. {hint}"
    return None


EXAMPLE_KV_ENDPOINTS = "[tcp://127.0.0.1:5557,tcp://127.0.0.1:5558]"
"""A valid value for a KV-event endpoint list (vLLM's ``--kv-events-config`` publishers)."""


def zmq_endpoint_problem(endpoint: Any) -> str | None:
    """What keeps ``endpoint`` from being a ZMQ endpoint the router can connect to (a vLLM
    KV-event publisher), or None: ``tcp://host:port`` (port 1-65535; not the bind-only
    ``*`` host), ``ipc://path`` or ``inproc://name``."""
    if not isinstance(endpoint, str) or not endpoint.strip():
        return "it is not an endpoint string"
    endpoint = endpoint.strip()
    transport, sep, address = endpoint.partition("://")
    if not sep:
        return "it has no transport (write tcp://host:port)"
    if transport in ("ipc", "inproc"):
        return None if address else f"{transport}:// needs a path or name"
    if transport != "tcp":
        return f"its transport {transport!r} is not tcp, ipc or inproc"
    host, colon, port = address.rpartition(":")
    if not colon or not host:
        return "tcp:// needs host:port"
    if host == "*":
        return "'*' is a bind address; give the engine's host"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"its port {port!r} is not a number in 1-65535"
    return None


def kv_event_endpoints_problem(endpoints: Any, key: str, num_engines: int) -> str | None:
    """A message naming ``key`` when ``endpoints`` is not a list of ZMQ endpoints, one per
    engine (or empty: no KV events), else None.

    Args:
        endpoints: the configured value.
        key: the config key it came from (``engines.kv_event_endpoints``, ...).
        num_engines: how many engine URLs were given (the lists pair up by position).
    """
    problem = _list_problem(endpoints, key, "ZMQ endpoint", zmq_endpoint_problem,
                            f"Give one per engine URL, e.g. {key}={EXAMPLE_KV_ENDPOINTS}")
    if problem is None and endpoints and len(list(endpoints)) != num_engines:
        problem = (f"{key} has {len(list(endpoints))} endpoint(s) for {num_engines} engine URL(s); give one per "
                   "engine URL, in the same order, or none")
    return problem


def normalize_engine_urls(urls: Any) -> list[str]:
    """Engine base URLs stripped of whitespace and trailing ``/`` (the router's instance ids)."""
    return [str(u).strip().rstrip("/") for u in urls]
