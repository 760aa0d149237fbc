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
