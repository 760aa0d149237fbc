"""rl.compare: the Table 4 rows relative to the first router, and its command-line checks."""

from __future__ import annotations

import subprocess
import sys

from rl.compare import comparison_rows


def test_rows_are_changes_relative_to_the_first_router():
    summaries = {
        "vllm": {"iteration_s": 100.0, "requests_per_min": 50.0, "samples_per_min": 10.0,
                 "prefill_tok_s": 1000.0, "decode_tok_s": 200.0, "prefix_hit_rate": 0.745,
                 "consumed_mixture": {"agent": 0.483, "rlvr": 0.294, "rlhf": 0.224}},
        "misa-t": {"iteration_s": 77.2, "requests_per_min": 66.25, "samples_per_min": 13.56,
                   "prefill_tok_s": 1336.0, "decode_tok_s": 276.0, "prefix_hit_rate": 0.962,
                   "consumed_mixture": {"agent": 0.459, "rlvr": 0.333, "rlhf": 0.208}},
    }
    header, rows = comparison_rows(summaries)
    assert header[:6] == ["Router", "Iter. time", "RPM", "Sample rate", "Prefill TPS", "Decode TPS"]
    assert rows[0][1:6] == ["+0.0%"] * 5
    assert rows[1][1:6] == ["-22.8%", "+32.5%", "+35.6%", "+33.6%", "+38.0%"]
    assert rows[1][6] == "96.2%"
    assert rows[1][7:] == ["45.9", "20.8", "33.3"]  # agent, rlhf, rlvr (sorted)


def test_unknown_router_in_the_list_is_refused_with_the_options():
    r = subprocess.run([sys.executable, "-m", "rl.compare", "routers=[vllm,misa-x]"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2  # as rl.train router=misa-x
    assert "misa-x" in r.stderr and "misa-t" in r.stderr and "Traceback" not in r.stderr


def _refused(tmp_path, arg: str, said: str) -> None:
    """``rl.compare run_dir=... arg`` exits 2 saying ``said``, no traceback, and starts no run."""
    run_dir = tmp_path / "cmp"
    r = subprocess.run([sys.executable, "-m", "rl.compare", f"run_dir={run_dir}", arg],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert said in r.stderr and "Traceback" not in r.stderr
    assert "router=" not in r.stdout and not run_dir.exists()  # no run was started


def test_one_value_where_a_list_belongs_is_refused_with_the_list_form(tmp_path):
    _refused(tmp_path, "routers=misa-t", "routers=misa-t: give a list in brackets, e.g. 'routers=[vllm,misa-t]'")
    _refused(tmp_path, 'train_overrides="trainer.iterations=4"', "train_overrides=trainer.iterations=4: give a list")


def test_bad_train_overrides_are_refused_before_any_run(tmp_path):
    _refused(tmp_path, 'train_overrides=["trainer.iteratons=3"]', "unknown config key 'trainer.iteratons'")
    _refused(tmp_path, 'train_overrides=["trainer.iterations=abc"]', "trainer")
