"""bench.omp_wait_policy on a tiny batch: every (load, policy) pair runs in its own child and the table has both ratios."""

from __future__ import annotations

import subprocess
import sys

import psutil


def test_the_benchmark_times_both_policies_under_both_loads(tmp_path):
    before = {p.pid for p in psutil.process_iter()}
    r = subprocess.run([sys.executable, "-m", "bench.omp_wait_policy", "--batch", "1", "--prompt-tokens", "8",
                        "--completion-tokens", "4", "--repeats", "1", "--plot", str(tmp_path / "p.png")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line for line in r.stdout.splitlines() if "x" in line and ("idle" in line or "busy cores" in line)]
    assert len(rows) == 2 and all(line.rstrip(" │|").endswith("x") for line in rows), r.stdout
    assert (tmp_path / "p.png").stat().st_size > 0
    # the busy loops and the children are gone
    left = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
            and "omp_wait_policy" in " ".join(p.info["cmdline"] or [])]
    assert not left


def test_ctrl_c_stops_the_benchmark_in_one_line_and_leaves_no_process(tmp_path):
    import signal
    import time

    before = {p.pid for p in psutil.process_iter()}
    # enough timed steps that the run cannot end before the signal, however idle the machine
    # (with 1 repeat an idle machine finished all four children within the 3 s)
    # A suite started in the background by a shell without job control (`make test &`, CI's
    # runner) passes SIGINT on ignored, and Python then installs no KeyboardInterrupt handler;
    # a terminal's Ctrl-C reaches a foreground job, whose disposition this restores.
    proc = subprocess.Popen([sys.executable, "-m", "bench.omp_wait_policy", "--batch", "1", "--prompt-tokens", "8",
                             "--completion-tokens", "4", "--repeats", "5000", "--plot", str(tmp_path / "p.png")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().startswith("idle, OMP_WAIT_POLICY=ACTIVE")  # a child is running
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:  # a failed run does not go on with its 5000 steps
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and err.strip().endswith("bench.omp_wait_policy: interrupted"), err[-2000:]
    assert "Traceback" not in err
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
                and "omp_wait_policy" in " ".join(p.info["cmdline"] or [])]
        if not left:
            break
        time.sleep(0.5)
    assert not left
