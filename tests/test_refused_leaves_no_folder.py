"""A command refused for the user's mistake (exit 2) leaves no run folder: ``model.path``
that does not exist is checked before anything is written (rl.train, rl.eval)."""

import subprocess
import sys

import pytest

from common.config import REPO_ROOT


@pytest.mark.parametrize("module, path", [("rl.train", "/nonexistent/model"), ("rl.eval", "/nonexistent/ckpt")])
def test_a_missing_model_path_is_refused_and_leaves_no_run_folder(tmp_path, module, path):
    run_dir = tmp_path / "runs" / "r"
    r = subprocess.run([sys.executable, "-m", module, f"model.path={path}", f"run_dir={run_dir}"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert f"model.path={path} does not exist" in r.stderr and "Traceback" not in r.stderr
    assert "run folder" not in r.stdout
    assert not (tmp_path / "runs").exists()
