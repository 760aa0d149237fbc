"""Engine base URLs as the router takes them (``engines.urls`` of ``python -m router``,
``engine.urls`` of a training job).

An engine base URL is ``http(s)://host[:port][/prefix]``: the router appends
``/v1/completions``, ``/health`` and ``/metrics`` to it, so it has a scheme and a host,
a numeric port if any, and no query or fragment. A value such as ``localhost:8000``
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


def engine_urls_problem(urls: Any, key: str) -> str | None:
    """A message naming ``key`` when ``urls`` is not a list of engine base URLs, else None.

    Args:
        urls: the configured value (a list or tuple of strings is expected; empty is
            allowed here, callers that need engines say so themselves).
        key: the config key the value came from (``engines.urls``, ``engine.urls``).
    """
    if isinstance(urls, (str, bytes)) or not hasattr(urls, "__iter__"):
        return f"{key}={urls!r} must be a list of engine base URLs, e.g. {key}={EXAMPLE_URLS}"
    for i, url in enumerate(urls):
        problem = url_problem(url)
        if problem is not None:
            return (f"{key}[{i}]={url!r} is not an engine base URL: {problem}. "
                    f"Give http(s)://host:port for each engine, e.g. {key}={EXAMPLE_URLS}")
    return None


def normalize_engine_urls(urls: Any) -> list[str]:
    """Engine base URLs stripped of whitespace and trailing ``/`` (the router's instance ids)."""
    return [str(u).strip().rstrip("/") for u in urls]
