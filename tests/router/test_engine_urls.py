"""Engine URLs are checked at start: a value that is no http(s)://host:port is refused with
the key named and a valid example, before any health check or request waits on it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from rl.config import compose
from rollout.engines import EngineError, validate_engine_cfg
from router.launch import REPO_ROOT, router_argv
from router.policies import RoundRobinPolicy
from router.policies.base import RouterConfigError
from router.server import RouterService
from router.urls import engine_urls_problem, url_problem

BAD_URLS = [
    ("notaurl", "no scheme"),
    ("localhost:8000", "no scheme"),
    ("http://", "no host"),
    ("http://:8000", "no host"),
    ("ftp://host:8000", "'ftp' is not http or https"),
    ("http://host:port", "does not parse"),
    ("http://host:99999", "does not parse"),
    ("http://host:8000/?x=1", "no ?query"),
    ("http://ho st:8000", "whitespace"),
    ("", "not a URL string"),
]


@pytest.mark.parametrize(("url", "why"), BAD_URLS)
def test_url_that_is_not_an_engine_base_url_is_named_with_what_is_wrong(url, why):
    assert why in url_problem(url)
    message = engine_urls_problem(["http://127.0.0.1:8001", url], "engines.urls")
    assert message.startswith(f"engines.urls[1]={url!r} is not an engine base URL")
    assert why in message and "e.g. engines.urls=[http://127.0.0.1:8001,http://127.0.0.1:8002]" in message


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "https://node1.example:443/", "http://[::1]:8000",
                                 "http://engine-0", "http://gateway:80/pool-a"])
def test_base_urls_with_scheme_and_host_are_accepted(url):
    assert url_problem(url) is None


def test_a_single_string_instead_of_a_list_is_refused():
    assert "must be a list of engine base URLs" in engine_urls_problem("http://a:1", "engines.urls")


def test_router_service_refuses_a_bad_url_naming_engines_urls():
    with pytest.raises(RouterConfigError, match=r"engines\.urls\[0\]='localhost:8000' .*no scheme"):
        RouterService(RoundRobinPolicy(), ["localhost:8000"])


def test_router_launch_refuses_a_bad_url_naming_engine_urls():
    with pytest.raises(RouterConfigError, match=r"engine\.urls\[0\]='http://' .*no host"):
        router_argv({"impl": "ours", "policy": "round_robin"}, ["http://"], [], None, 8100)


def test_training_job_refuses_a_bad_engine_url_before_starting_anything():
    ecfg = compose("train", ["engine.urls=[http://127.0.0.1:8001,notaurl]"]).engine
    with pytest.raises(EngineError, match=r"engine\.urls\[1\]='notaurl' is not an engine base URL"):
        validate_engine_cfg(ecfg)
    validate_engine_cfg(OmegaConf.merge(ecfg, {"urls": ["http://127.0.0.1:8001"]}))


@pytest.mark.parametrize(("urls", "expected"), [
    ("[localhost:8000]", "engines.urls[0]='localhost:8000' is not an engine base URL: it has no scheme"),
    ("http://127.0.0.1:8001", "engines.urls='http://127.0.0.1:8001' must be a list"),
])
def test_python_m_router_refuses_a_bad_engine_url_at_start(urls, expected):
    run = subprocess.run([sys.executable, "-m", "router", "router=round-robin", f"engines.urls={urls}"],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert run.returncode == 2
    assert expected in run.stderr and "e.g. engines.urls=[http://" in run.stderr
    assert "Traceback" not in run.stderr + run.stdout
