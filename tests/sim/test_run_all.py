"""Worker processes of ``router.sim`` experiments: errors come back, and no worker outlives its parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from router.sim.experiments import ClusterSpec, RunSpec, run_all

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ClusterSpec("step3.7-like", "step3.7-like", "H200", 8, 2)


def spec(policy: str, params: dict, scale: float = 0.05, seed: int = 0) -> RunSpec:
    return RunSpec(f"{policy}", CLUSTER, policy, params, ceiling=8, seed=seed, scale=scale,
                   engine={"block_size": 256}, signals={}, mixture={"agent": 48.6, "rlvr": 33.1, "rlhf": 18.2})


def children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except FileNotFoundError:
        return set()


def workers_of(pid: int) -> set[int]:
    """Child processes of ``pid`` other than multiprocessing's resource tracker (one per
    parent, it lives as long as the parent)."""
    out = set()
    for c in children(pid):
        try:
            if "resource_tracker" not in Path(f"/proc/{c}/cmdline").read_text():
                out.add(c)
        except FileNotFoundError:
            pass
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_error_stops_every_worker_and_is_raised_here():
    # the first run fails at once (a bad option); the second, long one must be stopped, not waited for
    specs = [spec("misa_t", {"k_quantile": 5.0}), spec("misa_t", {}, scale=1.0)]
    before = workers_of(os.getpid())
    t0 = time.monotonic()
    with pytest.raises(Exception, match="k_quantile"):
        run_all(specs, workers=2)
    assert time.monotonic() - t0 < 60
    assert not {p for p in workers_of(os.getpid()) - before if alive(p)}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_stops_every_worker_and_keeps_the_finished_runs(tmp_path):
    p = subprocess.Popen(
        [sys.executable, "-m", "router.sim", "experiment=run", "run.policy=misa_t",
         "seeds=[0,1,2,3]", "workers=2", "scale=0.1", f"out_dir={tmp_path}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        workers: set[int] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            workers |= workers_of(p.pid)
            if list(tmp_path.glob("*/runs.jsonl")) and len(workers) >= 2:
                break  # a run finished and the workers are up: interrupt the rest
            time.sleep(0.2)
        assert p.poll() is None, p.communicate()[1]
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err and "Traceback" not in err
    time.sleep(1.0)
    assert workers and not [w for w in workers if alive(w)]
    results = json.loads(next(tmp_path.glob("*/results.json")).read_text())
    assert results["interrupted"] == "SIGTERM"
    assert len(results["runs"]) >= 1
    assert len(next(tmp_path.glob("*/runs.jsonl")).read_text().splitlines()) == len(results["runs"])


def test_a_signal_inside_the_record_step_is_raised_after_it():
    """router.sim keeps a finished run in runs.jsonl and in its run list, or in neither: a
    SIGTERM arriving between the two writes is raised when both are done."""
    import signal as signals

    from router.sim.__main__ import Interrupted, _raise_interrupted, _signals_deferred

    done = []
    with pytest.raises(Interrupted) as raised:
        with _signals_deferred():
            done.append("runs.jsonl")
            _raise_interrupted(signals.SIGTERM, None)  # what the handler does when SIGTERM arrives
            done.append("run list")
    assert done == ["runs.jsonl", "run list"] and raised.value.signum == signals.SIGTERM
    with pytest.raises(Interrupted):  # outside the block it raises at once
        _raise_interrupted(signals.SIGHUP, None)
    with _signals_deferred():  # and nothing is left pending for the next block
        pass
