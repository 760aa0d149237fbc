"""Importing ``rl`` makes OpenMP threads wait passively (before torch loads), unless the environment says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

_PROBE = ("import os, sys; import rl; early = 'torch' in sys.modules; import rl.learner; "
          "print(os.environ['OMP_WAIT_POLICY'], early, 'torch' in sys.modules)")


def _run(env: dict) -> list[str]:
    return subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300,
                          env=env, check=True).stdout.split()


def test_rl_sets_a_passive_wait_policy_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert _run(env) == ["PASSIVE", "False", "True"]  # set before torch was loaded


def test_an_exported_wait_policy_wins():
    assert _run({**os.environ, "OMP_WAIT_POLICY": "ACTIVE"}) == ["ACTIVE", "False", "True"]
