"""Engine URLs and KV-event endpoints are checked at start: a value that is no
http(s)://host:port (or no connectable ZMQ endpoint) is refused with the key named and a
valid example, before any health check or request waits on it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from common.config import compose
from rollout.engines import EngineError, validate_engine_cfg
from router.launch import REPO_ROOT, router_argv
from router.policies import RoundRobinPolicy
from router.policies.base import RouterConfigError
from router.server import RouterService
from common.urls import engine_urls_problem, kv_event_endpoints_problem, url_problem, zmq_endpoint_problem

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


def test_an_openai_style_base_url_ending_in_v1_is_refused_as_an_engine_url():
    message = engine_urls_problem(["http://127.0.0.1:8001/v1/"], "engines.urls")
    assert "ends in /v1, but the router appends /v1/completions itself" in message
    assert url_problem("http://127.0.0.1:8001/v1") is None  # as a router URL (rl.eval) it is fine


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
    validate_engine_cfg(OmegaConf.merge(ecfg, {"urls": ["http://127.0.0.1:8001"],
                                               "kv_event_endpoints": ["tcp://127.0.0.1:5557"]}))


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


@pytest.mark.parametrize(("endpoint", "why"), [
    ("localhost:5557", "no transport"),
    ("udp://host:5557", "'udp' is not tcp, ipc or inproc"),
    ("tcp://*:5557", "'*' is a bind address"),
    ("tcp://host", "needs host:port"),
    ("tcp://:5557", "needs host:port"),
    ("tcp://host:0", "not a number in 1-65535"),
    ("tcp://host:port", "not a number in 1-65535"),
    ("ipc://", "needs a path"),
    ("", "not an endpoint string"),
])
def test_kv_event_endpoint_that_cannot_be_connected_is_named(endpoint, why):
    assert why in zmq_endpoint_problem(endpoint)
    message = kv_event_endpoints_problem(["tcp://127.0.0.1:5557", endpoint], "engines.kv_event_endpoints", 2)
    assert message.startswith(f"engines.kv_event_endpoints[1]={endpoint!r} is not a ZMQ endpoint") and why in message


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:5557", "tcp://engine-0:5557", "tcp://[::1]:5557",
                                      "ipc:///tmp/kv.sock", "inproc://kv"])
def test_connectable_kv_event_endpoints_are_accepted(endpoint):
    assert zmq_endpoint_problem(endpoint) is None


def test_kv_event_endpoints_pair_with_engines_or_are_empty():
    assert kv_event_endpoints_problem([], "k", 2) is None
    assert "has 1 endpoint(s) for 2 engine URL(s)" in kv_event_endpoints_problem(["tcp://a:1"], "k", 2)
    assert "must be a list of ZMQ endpoints" in kv_event_endpoints_problem("tcp://a:1", "k", 1)


def test_router_service_and_training_job_refuse_a_bad_kv_endpoint():
    with pytest.raises(RouterConfigError, match=r"engines\.kv_event_endpoints\[0\]='tcp://\*:5557'"):
        RouterService(RoundRobinPolicy(), ["http://127.0.0.1:8001"], kv_event_endpoints=["tcp://*:5557"])
    ecfg = compose("train", ["engine.urls=[http://127.0.0.1:8001]", "engine.kv_event_endpoints=[localhost:5557]"]).engine
    with pytest.raises(EngineError, match=r"engine\.kv_event_endpoints\[0\]='localhost:5557' .*no transport"):
        validate_engine_cfg(ecfg)
