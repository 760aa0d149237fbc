"""``python -m router.sim``: a user mistake is one message, no traceback; exit status 2 for an
unknown name, 1 for a bad value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test starts a Python process with Hydra (a few seconds)

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*overrides: str, tmp_path: Path, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "router.sim", *overrides, f"out_dir={tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s)


def test_unknown_experiment_is_one_clear_error(tmp_path):
    p = run_cli("experiment=nope", tmp_path=tmp_path)
    assert p.returncode == 2
    assert "unknown experiment 'nope'" in p.stderr and "table5" in p.stderr
    assert "Traceback" not in p.stderr


def test_unknown_policy_option_names_the_valid_ones(tmp_path):
    p = run_cli("experiment=run", "run.policy=misa_t", "+policy_params.misa_t.bogus=1", tmp_path=tmp_path)
    assert p.returncode == 2
    assert "bogus" in p.stderr and "protected_fraction" in p.stderr
    assert "Traceback" not in p.stderr


def test_policy_params_of_no_such_policy_are_refused_not_ignored(tmp_path):
    p = run_cli("experiment=run", "run.policy=misa_t", "+policy_params.nope.k_quantile=0.5", tmp_path=tmp_path)
    assert p.returncode == 2
    assert "policy_params.nope: no such policy" in p.stderr and "misa_t" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("overrides, key, name", [
    (("run.policy=nope",), "run.policy", "nope"),  # the default experiment (table5) does not read it
    (("experiment=run", "run.policy=nope"), "run.policy", "nope"),
    (("shift.policies=[kv_horizon,bogus]",), "shift.policies", "bogus"),
    (("experiment=ceilings", "ceilings.baseline=vllm-routr"), "ceilings.baseline", "vllm-routr"),
])
def test_a_policy_name_no_policy_has_is_refused_in_any_experiment(overrides, key, name, tmp_path):
    p = run_cli(*overrides, tmp_path=tmp_path)
    assert p.returncode == 2
    assert f"{key}: unknown router policy {name!r}" in p.stderr and "kv_horizon" in p.stderr
    assert "Traceback" not in p.stderr and not list(tmp_path.iterdir())  # refused before any run starts


def test_policy_params_under_a_hyphenated_name_reach_the_policy(tmp_path):
    """``misa-t`` (the router group's spelling) is the policy misa_t: a bad value is refused."""
    p = run_cli("experiment=run", "run.policy=misa_t", "+policy_params.misa-t.k_footprint=bogus", tmp_path=tmp_path)
    assert p.returncode == 2 and "k_footprint" in p.stderr and "bogus" in p.stderr


@pytest.mark.parametrize("experiment", ["run", "sensitivity"])
def test_a_hyphenated_policy_to_run_gets_its_policy_params(experiment, tmp_path):
    """``run.policy=misa-t`` is misa_t with its options: a bad one is refused, not dropped."""
    p = run_cli(f"experiment={experiment}", f"{experiment}.policy=misa-t", "+policy_params.misa_t.k_footprint=bogus",
                tmp_path=tmp_path)
    assert p.returncode == 2 and "k_footprint" in p.stderr and "bogus" in p.stderr


def test_malformed_trace_is_reported_before_the_run(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"session_id": "s", "workload_class": "agent", "turn": 0, "prompt_tokens": -1, '
                     '"output_tokens": 3}\n')
    p = run_cli("experiment=run", f"trace={trace}", "workers=1", "seeds=[0]", tmp_path=tmp_path)
    assert p.returncode == 2  # a bad value, as an unknown name
    assert "bad.jsonl:1: field 'prompt_tokens'" in p.stderr
    assert "Traceback" not in p.stderr


def test_a_trace_class_the_mixture_does_not_name_is_refused_not_dropped(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(
        f'{{"session_id": "{c}1", "workload_class": "{c}", "turn": 0, "prompt_tokens": 100, "output_tokens": 10}}\n'
        for c in ("agent", "bogus", "rlvr", "rlhf")))
    p = run_cli("experiment=run", f"trace={trace}", "workers=1", "seeds=[0]", tmp_path=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "class 'bogus'" in lines[0] and "mixture.bogus=10" in lines[0]
    assert "Traceback" not in p.stderr


def test_table5_reports_every_baseline_the_composition_and_ends_with_the_headline(tmp_path):
    # 13 tiny runs: ~25 s on an idle core; the limit is for a loaded machine
    p = run_cli("experiment=table5", "seeds=[0]", "scale=0.05", "workers=1", "sim.sweep_ceilings=[64,128]",
                tmp_path=tmp_path, timeout_s=1200)
    assert p.returncode == 0, p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("misa_t vs vllm_router (sweep-tuned): ") and "samples/min" in last
    assert "output tokens/min" in last
    heads = p.stdout.strip().splitlines()[-6:]  # the project's own policy (issue 15) beside it,
    # against the vLLM Router as vLLM's defaults leave it (least loaded) and with its prefix path
    assert [h.split(":")[0] for h in heads] == [
        "decode ceiling over cache_aware (sweep-tuned)", "decode ceiling over vllm_router (sweep-tuned)",
        "kv_horizon vs vllm_router_least_loaded (sweep-tuned)", "misa_t vs vllm_router_least_loaded (sweep-tuned)",
        "kv_horizon vs vllm_router (sweep-tuned)", "misa_t vs vllm_router (sweep-tuned)"]
    assert all(p.stdout.count(h) == 1 for h in heads)  # printed once, at the end
    out = next(line for line in p.stdout.splitlines() if line.startswith("results: ")).removeprefix("results: ")
    assert all(h in Path(out, "table.md").read_text() for h in heads)  # and kept in table.md
    table = next(tmp_path.glob("table5-*/table.md")).read_text()
    for b in ("vllm_router", "vllm_router_least_loaded", "cache_aware"):
        assert f"baseline: sweep-tuned {b}@" in table and f"The static-ceiling sweep of {b}\n" in table
    assert "Composition of the completed samples" in table and "| total |" in table
    # how far each run decoded below the KV cache's ceiling, the bound on what a router can add
    ceiling = table.split("Decode rate against the KV cache's ceiling", 1)[1]
    assert "| kv_horizon | " in ceiling and "| misa_t | " in ceiling
    assert "(about the most a router could add to its decode rate on this trace)" in heads[1]
    # stderr is a pipe here, as a log file is: one line per finished run, no bar redraws
    assert "\r" not in p.stderr
    assert "runs done; misa_t s0:" in p.stderr


def test_log_lines_count_the_runs_of_each_phase(tmp_path):
    """Into a pipe, each finished run is one line ``<phase>: k/N runs done; ...`` with k
    counting that phase's runs only (an experiment of several phases restarts at 1)."""
    import re

    p = run_cli("experiment=shift", "seeds=[0]", "scale=0.05", "workers=1", "shift.sweep_ceilings=[64,128]",
                tmp_path=tmp_path, timeout_s=1200)
    assert p.returncode == 0, p.stderr
    counts = [(m[1], int(m[2]), int(m[3])) for m in re.finditer(r"^(.+?): (\d+)/(\d+) runs done;", p.stderr, re.M)]
    phases = list(dict.fromkeys(c[0] for c in counts))
    assert len(phases) >= 2
    for phase in phases:
        ks = [(k, n) for ph, k, n in counts if ph == phase]
        assert [k for k, _ in ks] == list(range(1, len(ks) + 1))
        assert ks[-1][0] == ks[-1][1]
