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
    assert "SWE grading" not in r.stdout  # nothing is announced before the refusal: it is the one line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("module", ["rl.train", "rl.eval"])
def test_a_missing_relative_model_path_is_refused_not_taken_as_a_hub_id(tmp_path, module):
    # the README's own pattern (model.path=runs/<run>/checkpoint) with a typo: two separators,
    # no hub id has that shape
    path = "runs/nonexistent/checkpoint"
    run_dir = tmp_path / "runs" / "r"
    r = subprocess.run([sys.executable, "-m", module, f"model.path={path}", f"run_dir={run_dir}"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"error: model.path={path} does not exist (read from the current folder: "
                               f"{REPO_ROOT / path})") and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("path, local", [
    ("./ckpt", True), ("/abs/ckpt", True), ("~/ckpt", True),
    ("runs/x/checkpoint", True),         # two separators: no hub id has that shape
    ("tests/ckpt", True),                # owner part is a folder here
    ("a b/c", True),                     # a space: not a hub id
    ("HuggingFaceTB/SmolLM2-135M-Instruct", False), ("gpt2", False),
])
def test_what_reads_as_a_local_path(path, local, monkeypatch):
    from common.config import reads_as_local_path

    monkeypatch.chdir(REPO_ROOT)
    assert reads_as_local_path(path) is local
