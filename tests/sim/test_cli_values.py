"""``python -m router.sim`` with a bad override: one line naming the key and what is valid, no
traceback; exit 2 for an unknown key, option or name, 1 for a bad value. Nothing is simulated:
every case stops before the first run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("overrides", "code", "expected"), [
    (["sim=step9"], 2, "Valid options for sim: qwen3.6-like, step3.7-like"),
    (["experiment=table6"], 2, "unknown experiment 'table6'; choose one of: table5, shift"),
    (["+sim.gpus=8"], 2, "sim (step3.7-like): unknown option(s) 'gpus'; valid options: name, model"),
    (["scale=big"], 2, "scale='big' is invalid: give a fraction of the paper-sized system in (0, 4]"),
    (["experiment=run", "run.ceiling=-3"], 2, "run.ceiling=-3 is invalid: give a whole number of units >= 1"),
    (["shapes=[step9]"], 2, "shapes: no model shape 'step9' (recipes/sim/step9.yaml); choose from: qwen3.6-like"),
    (["experiment=run", "shapes=[qwen3.6-like]"], 2, "only experiment=table5 runs several model shapes; for "
     "experiment=run choose one with sim=<name>"),
    (["seeds=[0,-1]"], 2, "seeds=[0, -1] is invalid: give a non-empty list of whole numbers >= 0"),
    (["ceiling_scope=each"], 2, "ceiling_scope='each' is invalid: give total or per_instance"),
    (["prompt_text.chars_per_token=0"], 2, "prompt_text.chars_per_token=0 is invalid: give characters per token > 0"),
    (["+policy_params.misa_t.protected_fraction=3"], 2, "router policy 'misa_t': protected_fraction must be in (0, 1]"),
])
def test_bad_override_is_one_line_with_what_is_valid(tmp_path, overrides, code, expected):
    r = subprocess.run([sys.executable, "-m", "router.sim", *overrides, f"out_dir={tmp_path}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0]
    assert "Traceback" not in r.stderr + r.stdout
