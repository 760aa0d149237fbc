"""start_router: our router and the real vllm-router as managed processes in front of fake engines."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest
from omegaconf import OmegaConf

from common.config import RECIPES_DIR
from router.launch import REPO_ROOT, RouterConfigError, check_router_cfg, router_argv, start_router
from tests.conftest import GSM8K_TINY_OVERRIDE
from tests.router.fake_engine import running_engines


@pytest.fixture
async def engines():
    async with running_engines() as pair:
        yield pair


async def _one_request_through(handle, engines) -> None:
    try:
        async with httpx.AsyncClient(base_url=handle.url, timeout=10) as client:
            r = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "hello"},
                                  headers={"X-Session-Id": "s-1"})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "toktoktoktok"
        assert sum(len(e.received) for e in engines) == 1
    finally:
        await asyncio.to_thread(handle.stop)


async def test_start_router_launches_vllm_router_in_front_of_two_engines(engines, tmp_path):
    cfg = OmegaConf.load(RECIPES_DIR / "router" / "vllm.yaml")
    # start_router blocks while it health-checks: run it off the loop that serves the engines.
    handle = await asyncio.to_thread(start_router, cfg, [e.url for e in engines], [], None, tmp_path)
    assert handle.kind == "vllm" and (tmp_path / "router.log").exists()
    await _one_request_through(handle, engines)


async def test_start_router_launches_ours_with_policy_params(engines, tmp_path):
    cfg = {"impl": "ours", "policy": "round_robin", "params": {"no_healthy_recheck_s": 0.5}}
    handle = await asyncio.to_thread(start_router, cfg, [e.url for e in engines], [], None, tmp_path)
    assert handle.kind == "ours"
    async with httpx.AsyncClient(base_url=handle.url) as client:
        state = (await client.get("/state")).json()
    assert state["policy"]["policy"] == "round_robin" and len(state["instances"]) == 2
    await _one_request_through(handle, engines)


def test_vllm_router_argv_carries_recipe_thresholds():
    cfg = OmegaConf.to_container(OmegaConf.load(RECIPES_DIR / "router" / "vllm.yaml"))
    argv = router_argv(cfg, ["http://a:1", "http://b:2"], [], None, port=9000)
    flags = dict(zip(argv, argv[1:]))
    assert (flags["--policy"], flags["--cache-threshold"], flags["--balance-abs-threshold"],
            flags["--balance-rel-threshold"]) == ("cache_aware", "0.3", "64", "1.5")  # vllm-router's CLI defaults
    assert argv[argv.index("--worker-urls") + 1: argv.index("--worker-urls") + 3] == ["http://a:1", "http://b:2"]
    assert flags["--log-level"] == "info"
    debug = router_argv({**cfg, "log_level": "debug"}, ["http://a:1"], [], None, port=9000)
    assert debug[debug.index("--log-level") + 1] == "debug"


def test_vllm_router_argv_refuses_an_unknown_log_level():
    cfg = OmegaConf.to_container(OmegaConf.load(RECIPES_DIR / "router" / "vllm.yaml"))
    with pytest.raises(RouterConfigError, match="router.log_level='loud'.*debug, info"):
        router_argv({**cfg, "log_level": "loud"}, ["http://a:1"], [], None, port=9000)
    with pytest.raises(RouterConfigError, match="router.log_level='loud'"):  # before any engine starts
        check_router_cfg({**cfg, "log_level": "loud"})


@pytest.mark.parametrize(
    ("override", "code", "expected"),
    [
        ("nosuchkey=1", 2, "Valid keys at the top level: engines, model, router, server"),
        ("engines.bogus=1", 2, "Valid keys under 'engines': block_size"),
        ("router=nope", 2, "Valid options for router: cache-aware, kv-horizon, misa, misa-t, round-robin, session-admission, vllm"),
        ("engine=gpu", 2, "engine=gpu: this command has no 'engine' choice (recipes/router_service.yaml chooses router)"),
        ("router=round-robin +router.params.nope=1", 2, "valid options: no_healthy_recheck_s"),
        ("router=round-robin router.params.nope=1", 2, "added with a leading '+', e.g. +router.params.nope=VALUE. "
                                                       "Valid options of policy 'round_robin': no_healthy_recheck_s"),
        ("router=vllm router.params.nope=1", 2, "Router impl 'vllm' takes no policy options"),
        ("+router.params.k_quantile=2", 2, "k_quantile must be in (0, 1]"),
        ("router=round-robin", 2, "no engines: set engines.urls"),
        ("router=vllm engines.urls=[http://127.0.0.1:1]", 2, "is run by router.launch.start_router"),
        ("router=round-robin engines.urls=[http://127.0.0.1:1] engines.max_retries=abc", 2,
         "engines.max_retries must be a number"),
        ("router=round-robin engines.urls=[http://127.0.0.1:1] server.port=-1", 2, "server.port must be a TCP port"),
        # the service's idle timeout was renamed (not the policy's idle_timeout_s): never ignored
        ("sessions.idle_timeout_s=5", 2, "'sessions.idle_timeout_s' was renamed 'sessions.forget_idle_s'"),
        ("+sessions.idle_timeout_s=5", 2, "'sessions.idle_timeout_s' was renamed 'sessions.forget_idle_s'"),
        # long_hold_s is one knob, the service's: the policy option is refused, naming it
        ("+router.params.long_hold_s=5", 2, "router.params.long_hold_s is no policy option any more: the router "
                                            "service's server.long_hold_s sets it"),
        ("router=round-robin engines.urls=[http://127.0.0.1:1] server.long_hold_s=0", 2,
         "server.long_hold_s must be > 0"),
        # nan passes '> 0'; a timer of nan seconds stopped the scrape loop without a word
        ("router=round-robin engines.urls=[http://127.0.0.1:1] signals.idle_scrape_interval_s=nan", 2,
         "signals.idle_scrape_interval_s must be a finite number, got nan"),
        ("router=round-robin engines.urls=[http://127.0.0.1:1] signals.scrape_interval_s=inf", 2,
         "signals.scrape_interval_s must be a finite number, got inf"),
        ("router=round-robin engines.urls=[http://127.0.0.1:1] signals.idle_scrape_interval_s=-1", 2,
         "signals.idle_scrape_interval_s must be > 0, got -1"),
    ],
)
def test_config_mistake_gives_one_line_and_no_traceback(override, code, expected):
    """Exit 2 for an unknown name (key, group choice, policy option) and for a bad value."""
    run = subprocess.run([sys.executable, "-m", "router", *override.split()], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=60)
    assert run.returncode == code, run.stderr
    assert expected in run.stderr and "Traceback" not in run.stderr + run.stdout
    assert run.stderr.startswith("error: ") and run.stderr.count("\n") == 1


def test_a_port_in_use_is_one_error_line_before_any_engine_is_scraped():
    """The socket is bound before the first scrape: no line about the (absent) engine."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "router", "router=round-robin", f"server.port={port}",
                              "engines.urls=[http://127.0.0.1:1]"], capture_output=True, text=True,
                             cwd=REPO_ROOT, timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith(f"error: cannot serve on 127.0.0.1:{port}") and run.stderr.count("\n") == 1
    assert "address already in use" in run.stderr.lower() and "Traceback" not in run.stderr + run.stdout


def test_cfg_job_prints_resolved_config():
    run = subprocess.run([sys.executable, "-m", "router", "router=round-robin", "--cfg", "job"], capture_output=True,
                         text=True, cwd=REPO_ROOT, timeout=60)
    assert run.returncode == 0
    cfg = OmegaConf.create(run.stdout)
    assert cfg.router.policy == "round_robin" and cfg.signals.scrape_interval_s == 0.5


def test_engine_request_timeout_reaches_either_router():
    cfg = OmegaConf.to_container(OmegaConf.load(RECIPES_DIR / "router" / "vllm.yaml"))
    argv = router_argv(cfg, ["http://a:1"], [], None, port=9000, request_timeout_s=7200)
    assert dict(zip(argv, argv[1:]))["--request-timeout-secs"] == "7200"
    assert "--request-timeout-secs" not in router_argv(cfg, ["http://a:1"], [], None, port=9000)
    ours = {"impl": "ours", "policy": "misa_t", "params": {}}
    assert "engines.request_timeout_s=7200.0" in router_argv(ours, ["http://a:1"], [], None, 9000,
                                                              request_timeout_s=7200)
    assert not any("request_timeout" in a for a in router_argv(ours, ["http://a:1"], [], None, 9000))


def test_check_router_cfg_refuses_what_would_fail_after_engines_started(monkeypatch, tmp_path):
    from router.launch import check_router_cfg
    from router.policies.base import RouterConfigError, UnknownOptionError

    check_router_cfg(OmegaConf.load(RECIPES_DIR / "router" / "misa-t.yaml"))
    with pytest.raises(UnknownOptionError, match="unknown option"):
        check_router_cfg({"impl": "ours", "policy": "misa_t", "params": {"nope": 1}})
    with pytest.raises(RouterConfigError, match="k_quantile must be in"):
        check_router_cfg({"impl": "ours", "policy": "misa_t", "params": {"k_quantile": 0}})
    with pytest.raises(UnknownOptionError, match="router=vllm takes no policy options"):
        check_router_cfg({**OmegaConf.to_container(OmegaConf.load(RECIPES_DIR / "router" / "vllm.yaml")),
                          "params": {"x": 1}})
    with pytest.raises(RouterConfigError, match="router.impl='sglang' is unknown"):
        check_router_cfg({"impl": "sglang"})
    # vllm-router not installed: no program beside the interpreter, none on PATH.
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RouterConfigError, match="router=vllm needs the vllm-router program: pip install vllm-router"):
        check_router_cfg(OmegaConf.load(RECIPES_DIR / "router" / "vllm.yaml"))


@pytest.mark.parametrize(("override", "code", "expected"), [
    ("+router.params.nope=1", 2, "router policy 'misa_t': unknown option(s) 'nope'"),
    ("router.params.nope=1", 2, "Valid options of policy 'misa_t': protected_fraction"),
    ("+router.params.k_quantile=0", 2, "k_quantile must be in (0, 1]"),
])
def test_training_job_refuses_a_bad_router_option_before_starting_anything(override, code, expected):
    run = subprocess.run([sys.executable, "-m", "rl.train", override, GSM8K_TINY_OVERRIDE], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=120)
    assert run.returncode == code, run.stderr
    assert expected in run.stderr and "Traceback" not in run.stderr + run.stdout
    assert "starting" not in run.stdout.lower()


def test_help_lists_only_the_groups_the_router_uses_and_the_chosen_config():
    run = subprocess.run([sys.executable, "-m", "router", "router=round-robin", "--help"], capture_output=True,
                         text=True, cwd=REPO_ROOT, timeout=60)
    assert run.returncode == 0, run.stderr
    groups = run.stdout.split("Config groups")[1].split("Config (")[0]
    assert "router: cache-aware, kv-horizon, misa, misa-t, round-robin, session-admission, vllm" in groups
    assert "engine:" not in groups and "sim:" not in groups and "trainer:" not in groups
    assert "policy: round_robin" in run.stdout and "max_body_bytes:" in run.stdout
