"""Weight sync: the dev-endpoint protocol against a mock engine (fast), and a real
engine whose greedy output changes and whose prefix cache is emptied (``engine``)."""

import json
import re
from pathlib import Path

import httpx
import pytest

from rollout.weight_sync import (HttpReloadSync, NcclWeightSync, WeightSyncConfig,
                                 WeightSyncError, make_weight_sync)


class FakeEngines:
    """Records every call; answers like vLLM's dev endpoints."""

    def __init__(self, fail_reload_on=None, reset_false_times=0, router_status=200):
        self.calls = []
        self.fail_reload_on = fail_reload_on
        self.reset_false_left = reset_false_times
        self.router_status = router_status

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        body = json.loads(request.content) if request.content else None
        self.calls.append((host, request.url.path, dict(request.url.params), body))
        if request.url.path == "/admin/reset_prefix_index":
            return httpx.Response(self.router_status, json={})
        if request.url.path == "/collective_rpc" and host == self.fail_reload_on:
            return httpx.Response(500, text="reload failed: shape mismatch")
        if request.url.path == "/reset_prefix_cache":
            if self.reset_false_left > 0:
                self.reset_false_left -= 1
                return httpx.Response(200, json={"success": False})
            return httpx.Response(200, json={"success": True})
        return httpx.Response(200, json={"status": "ok"})


E1, E2, ROUTER = "http://e1:8000", "http://e2:8000", "http://router:9000"


def _sync(tmp_path, fake, **cfg):
    c = WeightSyncConfig(shm_dir=str(tmp_path / "shm"), router_url=ROUTER, **cfg)
    return HttpReloadSync([E1, E2], c, client=httpx.Client(transport=httpx.MockTransport(fake)))


class WritesWeights:
    """A weight source (the learner's part a sync reads) writing ``payload`` as the model file."""

    def __init__(self, payload: bytes):
        self.payload = payload

    def save_weights(self, folder: Path):
        (folder / "model.safetensors").write_bytes(self.payload)


_write = WritesWeights(b"weights")


def test_each_engine_is_paused_reloaded_reset_and_resumed_in_order(tmp_path):
    fake = FakeEngines()
    report = _sync(tmp_path, fake).sync(_write, policy_version=3)
    folder = str(tmp_path / "shm" / "v3")
    for e in (E1, E2):
        mine = [(p, q, b) for h, p, q, b in fake.calls if h == e]
        assert mine == [("/pause", {"mode": "wait"}, None),
                        ("/collective_rpc", {}, {"method": "reload_weights", "args": [],
                                                 "kwargs": {"weights_path": folder}}),
                        ("/reset_prefix_cache", {}, None), ("/resume", {}, None)]
    router = [b for h, p, q, b in fake.calls if p == "/admin/reset_prefix_index"]
    assert router == [{"instance": E1}, {"instance": E2}]
    assert report.policy_version == 3 and report.router_errors == {}
    assert [t.engine_url for t in report.engines] == [E1, E2]
    assert report.total_s >= max(t.total_s for t in report.engines)


def test_previous_version_folder_is_deleted_after_next_sync(tmp_path):
    s = _sync(tmp_path, FakeEngines())
    s.sync(_write, 1)
    s.sync(_write, 2)
    assert not (tmp_path / "shm" / "v1").exists()
    assert (tmp_path / "shm" / "v2" / "model.safetensors").exists()
    s.close()
    assert not (tmp_path / "shm").exists()  # nothing left behind in shared memory


def test_engine_is_resumed_when_reload_fails(tmp_path):
    fake = FakeEngines(fail_reload_on=E2)
    with pytest.raises(WeightSyncError, match="e2.*HTTP 500.*shape mismatch"):
        _sync(tmp_path, fake).sync(_write, 1)
    assert ("/resume" in [p for h, p, _, _ in fake.calls if h == E2])
    assert not [c for c in fake.calls if c[1] == "/admin/reset_prefix_index"]


def test_reset_is_retried_while_blocks_are_held(tmp_path):
    fake = FakeEngines(reset_false_times=2)
    _sync(tmp_path, fake, reset_retries=3).sync(_write, 1)
    assert sum(1 for c in fake.calls if c[1] == "/reset_prefix_cache") == 4  # 2 false + 2 ok
    with pytest.raises(WeightSyncError, match="success=false"):
        _sync(tmp_path, FakeEngines(reset_false_times=10), reset_retries=1).sync(_write, 2)


def test_router_failure_is_reported_not_raised(tmp_path):
    report = _sync(tmp_path, FakeEngines(router_status=404)).sync(_write, 1)
    assert set(report.router_errors) == {E1, E2} and "404" in report.router_errors[E1]


def test_bad_options_are_rejected():
    with pytest.raises(WeightSyncError, match="method"):
        WeightSyncConfig(method="rsync")
    with pytest.raises(WeightSyncError, match="pause_mode"):
        WeightSyncConfig(pause_mode="later")
    assert isinstance(make_weight_sync(WeightSyncConfig(method="nccl"), [E1]), NcclWeightSync)


def test_nccl_sync_needs_connect_and_a_gpu():
    s = NcclWeightSync([E1], cfg=WeightSyncConfig(method="nccl"))
    with pytest.raises(WeightSyncError, match="connect"):
        s.sync(_write, 1)
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(WeightSyncError, match="CUDA"):
            s.connect()


class SlowPauseEngine:
    """A real HTTP server (aiohttp, in a thread) with vLLM's dev endpoints, whose /pause
    sleeps ``pause_s`` before answering ``pause_status`` (a generation still in flight)."""

    def __init__(self, pause_s: float = 0.0, pause_status: int = 200):
        self.pause_s, self.pause_status = pause_s, pause_status
        self.paths: list[str] = []
        self.url = ""

    def __enter__(self) -> "SlowPauseEngine":
        import asyncio
        import threading

        from aiohttp import web

        async def handle(request: web.Request) -> web.Response:
            self.paths.append(request.path)
            if request.path == "/pause":
                await asyncio.sleep(self.pause_s)
                return web.Response(status=self.pause_status, text="pause failed")
            return web.json_response({"success": True})

        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def serve() -> None:
            app = web.Application()
            app.router.add_route("POST", "/{tail:.*}", handle)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
            ready.set()

        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(serve(), self._loop).result(timeout=30)
        ready.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


_write_big = WritesWeights(b"w" * 1024)


def test_pause_that_times_out_still_resumes_the_engine_and_removes_the_folder(tmp_path):
    with SlowPauseEngine(pause_s=5.0) as engine:
        cfg = WeightSyncConfig(shm_dir=str(tmp_path / "shm"), request_timeout_s=0.3)
        sync = HttpReloadSync([engine.url], cfg)
        with pytest.raises(WeightSyncError) as err:
            sync.sync(_write_big, policy_version=7)
        sync.close()
        paths = list(engine.paths)
    assert paths[0] == "/pause" and paths[-1] == "/resume"  # resumed although pause failed
    assert "/collective_rpc" not in paths  # nothing was loaded into a half-paused engine
    msg = str(err.value)
    assert "POST /pause" in msg and "0.3 s" in msg  # what failed: the pause timed out
    assert "VLLM_SERVER_DEV_MODE" not in msg  # the dev-mode hint is for a missing endpoint
    assert not (tmp_path / "shm" / "v7").exists()  # the version folder is gone


def test_pause_that_fails_resumes_and_removes_the_folder_with_the_engines_answer(tmp_path):
    with SlowPauseEngine(pause_status=500) as engine:
        sync = HttpReloadSync([engine.url], WeightSyncConfig(shm_dir=str(tmp_path / "shm")))
        with pytest.raises(WeightSyncError, match=r"POST /pause answered HTTP 500: pause failed"):
            sync.sync(_write_big, policy_version=2)
        sync.close()
        paths = list(engine.paths)
    assert paths == ["/pause", "/resume"]
    assert not (tmp_path / "shm" / "v2").exists()


def test_failed_reload_removes_the_new_folder_and_keeps_nothing_behind(tmp_path):
    s = _sync(tmp_path, FakeEngines(fail_reload_on=E2))
    with pytest.raises(WeightSyncError):
        s.sync(_write, 1)
    assert not (tmp_path / "shm" / "v1").exists()
    s.close()


def test_missing_dev_endpoint_says_to_turn_on_dev_mode(tmp_path):
    def no_dev_mode(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"detail": "Not Found"})

    c = WeightSyncConfig(shm_dir=str(tmp_path / "shm"))
    s = HttpReloadSync([E1], c, client=httpx.Client(transport=httpx.MockTransport(no_dev_mode)))
    with pytest.raises(WeightSyncError, match="HTTP 404.*VLLM_SERVER_DEV_MODE=1"):
        s.sync(_write, 1)


# --------------------------------------------------------------------------- real engine


def _prefix_hits(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(m.group(1)) for m in
               re.finditer(r'^vllm:prefix_cache_hits_total\{[^}]*\} ([0-9.e+]+)$', text, re.M))


def _greedy(url: str, prompt_ids: list[int], n: int = 12) -> list[int]:
    r = httpx.post(f"{url}/v1/completions", timeout=300, json={
        "model": "smollm2-135m", "prompt": prompt_ids, "max_tokens": n, "temperature": 0.0,
        "return_token_ids": True})
    r.raise_for_status()
    return r.json()["choices"][0]["token_ids"]


@pytest.mark.engine
def test_sync_changes_greedy_output_and_resets_prefix_cache(real_engine_url, model_path):
    import torch

    from rl.learner import Learner

    learner = Learner(model_path)
    tok = learner.tokenizer
    # longer than two 128-token KV blocks, so a repeat hits the prefix cache
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Repeat after me. " + "The quick brown fox jumps over "
          "the lazy dog. " * 30 + "What animal jumps?"}], tokenize=False, add_generation_prompt=True)
    ids = tok(prompt)["input_ids"]
    before = _greedy(real_engine_url, ids)
    _greedy(real_engine_url, ids)
    warm_hits = _prefix_hits(real_engine_url)
    assert warm_hits >= 256  # the repeat hit the cache: the metric works

    torch.manual_seed(0)
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else model_path
    sync = HttpReloadSync([real_engine_url], WeightSyncConfig(shm_dir=f"{shm}/misa-rl-test-sync"))
    try:
        report = sync.sync(learner, policy_version=1)
    finally:
        sync.close()
    assert report.engines[0].load_s > 0

    after = _greedy(real_engine_url, ids)
    # the cache was emptied by the sync: the first repeat after it finds no cached block
    assert _prefix_hits(real_engine_url) == warm_hits
    assert after != before
    # and the engine now serves exactly the trainer's weights
    with torch.no_grad():
        hf = learner.model.generate(torch.tensor([ids]), max_new_tokens=len(after),
                                    do_sample=False)[0, len(ids):].tolist()
    assert hf[:6] == after[:6]


def _engine_prompt_logprobs(url: str, ids: list[int]) -> list[float]:
    """The engine's log-prob of each of ``ids[1:]`` given the tokens before it."""
    r = httpx.post(f"{url}/v1/completions", timeout=300, json={
        "model": "smollm2-135m", "prompt": ids, "max_tokens": 1, "temperature": 0.0,
        "prompt_logprobs": 0})
    r.raise_for_status()
    per_pos = r.json()["choices"][0]["prompt_logprobs"]
    assert per_pos[0] is None and len(per_pos) == len(ids)
    return [float(per_pos[i][str(ids[i])]["logprob"]) for i in range(1, len(ids))]


@pytest.mark.engine
def test_engine_log_probs_equal_learners_after_every_parameter_changed(real_engine_url, model_path):
    # Noise on every parameter, the embedding and its tied output head included: if the
    # sync leaves lm_head out, the engine keeps its startup head and its log-probs are
    # about 1.2 nats off the learner's (measured); with it they agree to ~3e-5.
    import torch

    from rl.grpo import TrainSample
    from rl.learner import Learner

    learner = Learner(model_path)
    tok = learner.tokenizer
    prompt = tok(tok.apply_chat_template([{"role": "user", "content": "What is 17 + 25?"}],
                                         tokenize=False, add_generation_prompt=True))["input_ids"]
    completion = tok(" 17 + 25 = 42. The answer is 42.")["input_ids"]
    torch.manual_seed(1)
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(1e-2 * torch.randn_like(p))
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else model_path
    sync = HttpReloadSync([real_engine_url], WeightSyncConfig(shm_dir=f"{shm}/misa-rl-test-logp"))
    try:
        sync.sync(learner, policy_version=1)
    finally:
        sync.close()
    learner.model.eval()
    ours = learner.log_probs([TrainSample(prompt, completion, [0.0] * len(completion), 0.0)])[0]
    engine = _engine_prompt_logprobs(real_engine_url, prompt + completion)[len(prompt) - 1:]
    assert len(engine) == len(ours) == len(completion)
    diff = sum(abs(a - b) for a, b in zip(ours, engine)) / len(ours)
    assert diff < 1e-3, f"engine log-probs are {diff:.3g} nats off the learner's"


def test_worker_extension_names_cannot_collide_with_vllms_worker():
    # vLLM refuses to start a worker whose class already has a name of the extension
    # (its GPU worker has update_weights of its own); ours all carry a prefix.
    from rollout.weight_sync import WORKER_EXTENSION, NcclWeightSyncWorker

    names = [n for n in vars(NcclWeightSyncWorker) if not n.startswith("__")]
    assert names and all(n.startswith("misa_") for n in names)
    assert WORKER_EXTENSION == f"{NcclWeightSyncWorker.__module__}.{NcclWeightSyncWorker.__qualname__}"


@pytest.mark.slow
def test_worker_extension_has_no_name_of_vllms_gpu_worker():
    from vllm.v1.worker.gpu_worker import Worker

    from rollout.weight_sync import NcclWeightSyncWorker

    clash = [n for n in dir(NcclWeightSyncWorker) if not n.startswith("__") and hasattr(Worker, n)]
    assert not clash


def test_each_job_has_its_own_weights_folder_and_a_killed_jobs_folder_is_removed(tmp_path):
    import os
    import subprocess
    import sys

    from rollout.weight_sync import job_shm_dir, remove_stale_shm_dirs

    mine = job_shm_dir(tmp_path, "20260101-mixed_step-misa-t")
    assert mine.parent == tmp_path and mine.name == f"20260101-mixed_step-misa-t-{os.getpid()}"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed = tmp_path / f"other-run-{dead.pid}"
    (killed / "v3").mkdir(parents=True)
    mine.mkdir()
    unrelated = tmp_path / "not-a-job"
    unrelated.mkdir()
    remove_stale_shm_dirs(tmp_path)
    assert not killed.exists()  # its job is gone: its weights are removed
    assert mine.exists() and unrelated.exists()
