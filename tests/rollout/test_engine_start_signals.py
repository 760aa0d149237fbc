"""Ctrl-C and SIGTERM while ``EnginePool.start`` waits for the engines' health end the
wait at once (exit 130 / 143) and stop every engine it started. The engines here are a
cheap stand-in that never becomes healthy (``engine_argv`` replaced by a sleeping
Python), so the test starts no vLLM."""

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from common.config import REPO_ROOT
from tests.processes import kill_marked, marked_processes, new_marker, wait_until_gone

SCRIPT = textwrap.dedent("""
    import signal
    import sys
    from pathlib import Path

    import rollout.engines as engines
    from common.config import compose
    from rollout.serve import stop_on_sigterm

    marker, log_dir = sys.argv[1], Path(sys.argv[2])
    # an engine that starts and never answers /health
    engines.engine_argv = lambda *a, **k: [sys.executable, "-c", "import time; time.sleep(900)", marker]
    stop_on_sigterm()
    # A job started in the background by a shell without job control (CI's runner) inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler; a terminal's
    # Ctrl-C reaches a foreground job, whose handler this restores.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ecfg = compose("train", ["run_dir=runs/test", "engine.num_engines=2",
                             "engine.startup_timeout_s=900"]).engine
    try:
        engines.EnginePool.start(ecfg, "/tmp/model", "policy", 2048, "float32", log_dir)
    except KeyboardInterrupt:
        sys.exit(130)
""")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_the_engine_health_wait_stops_at_once(tmp_path, sig, code):
    marker = new_marker()
    job = subprocess.Popen([sys.executable, "-c", SCRIPT, marker, str(tmp_path / "logs")],
                           cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len([p for p in marked_processes(marker) if p.pid != job.pid]) < 2:
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.2)
        time.sleep(1.0)  # inside the health wait
        job.send_signal(sig)
        try:  # the engines' wait is 900 s: before the fix the job ran on until then
            _, err = job.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the job did not stop within 60 s of the signal")
        assert job.returncode == code, err
        assert wait_until_gone(lambda: marked_processes(marker)) == []
    finally:
        job.kill()
        job.wait()
        kill_marked(marker)
