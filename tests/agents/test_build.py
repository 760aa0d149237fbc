"""The task builder: AST mutations, and a whole build from a local sdist (no network)."""

import ast
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agents.envs.build import BuildError, build, fetch_project, Project, quotas
from agents.envs.mutate import OPERATORS, apply_mutation, enumerate_mutations
from agents.envs.task import evaluate, load_tasks
from sandbox import Workspace

LIB = '''"""A tiny library."""


def clamp(x, lo, hi):
    """Clamp x into [lo, hi]."""
    if x < lo:  # below
        return lo
    if x > hi:
        return hi
    return x


def window(seq, n=2):
    out = []
    for i in range(len(seq) - n + 1):
        out.append(tuple(seq[i:i + n]))
    return out


def is_empty(seq):
    return len(seq) == 0 and True


def between(x, lo, hi):
    return clamp(x, lo, hi) == x
'''

TESTS = '''from tinylib import between, clamp, window, is_empty


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_window_pairs():
    assert window([1, 2, 3]) == [(1, 2), (2, 3)]


def test_window_triples():
    assert window([1, 2, 3, 4], 3) == [(1, 2, 3), (2, 3, 4)]


def test_is_empty():
    assert is_empty([]) and not is_empty([1])


def test_between():
    assert between(3, 1, 5) and not between(0, 1, 5)
'''


def test_every_operator_finds_sites_and_keeps_the_rest_of_the_file():
    muts = enumerate_mutations("tinylib/__init__.py", LIB)
    assert {m.operator for m in muts} == set(OPERATORS)
    for m in muts:
        out = apply_mutation(LIB, m)
        ast.parse(out)
        assert out != LIB
        assert "# below" in out or m.operator == "drop_statement"  # comments survive
        changed = [a for a, b in zip(LIB.splitlines(), out.splitlines()) if a != b]
        assert len(changed) >= 1


def test_mutation_kinds_do_what_they_say():
    muts = enumerate_mutations("m.py", LIB)
    flip = next(m for m in muts if m.operator == "flip_comparison" and m.function == "clamp")
    assert "if x >= lo:  # below" in apply_mutation(LIB, flip)
    obo = next(m for m in muts if m.operator == "off_by_one")
    assert "len(seq) - n + 2" in apply_mutation(LIB, obo)
    consts = {apply_mutation(LIB, m).split("def is_empty(seq):\n")[1].split("\n")[0]
              for m in muts if m.operator == "wrong_constant" and m.function == "is_empty"}
    assert consts == {"    return len(seq) == 0 and False", "    return len(seq) == 1 and True"}
    assert not any(m.function == "window" and m.operator == "wrong_constant" and m.line == 13
                   for m in muts)  # the default n=2 is not mutated


def make_sdist(cache: Path) -> None:
    root = cache / "sdists"
    src = cache / "src" / "tinylib-1.0"
    (src / "tinylib").mkdir(parents=True)
    (src / "tinylib" / "__init__.py").write_text(LIB)
    (src / "tests").mkdir()
    (src / "tests" / "test_tinylib.py").write_text(TESTS)
    (src / "docs").mkdir()
    root.mkdir(parents=True)
    with tarfile.open(root / "tinylib-1.0.tar.gz", "w:gz") as tar:
        tar.add(src, arcname="tinylib-1.0")


def build_cfg(tmp_path: Path, **over):
    cfg = OmegaConf.load(Path(__file__).resolve().parents[2] / "recipes/agents/build_tasks.yaml")
    cfg.out_dir, cfg.cache_dir, cfg.work_dir = str(tmp_path / "out"), str(tmp_path / "cache"), None
    cfg.projects = [{"name": "tinylib", "version": "1.0", "source": ["tinylib"], "tests": "tests"}]
    cfg.num_tasks, cfg.max_per_function, cfg.verify_tasks = 4, 2, 4
    for k, v in over.items():
        cfg[k] = v
    return cfg


@pytest.mark.slow
async def test_build_from_local_sdist_gives_solvable_deterministic_tasks(tmp_path):
    make_sdist(tmp_path / "cache")
    report = await build(build_cfg(tmp_path))
    assert report["num_tasks"] == 4
    assert report["verified"] == {"tasks": 4, "ok": 4, "failed": []}
    tasks = load_tasks(tmp_path / "out" / "tasks.jsonl")
    assert not (Path(next(iter(tasks.values())).snapshot) / "docs").exists()
    for task in tasks.values():
        assert 1 <= len(task.FAIL_TO_PASS) <= 10
        assert set(task.FAIL_TO_PASS).isdisjoint(task.PASS_TO_PASS)
        assert all(t in task.problem_statement for t in task.FAIL_TO_PASS)
        async with Workspace.create(task.snapshot, root=tmp_path) as ws:
            assert (await evaluate(ws, task))[0] == 0.0
            await ws.apply_patch(task.patch)
            assert (await evaluate(ws, task))[0] == 1.0
    first = (tmp_path / "out" / "tasks.jsonl").read_text()
    await build(build_cfg(tmp_path))
    assert (tmp_path / "out" / "tasks.jsonl").read_text() == first


def test_missing_path_in_sdist_is_a_clear_error(tmp_path):
    make_sdist(tmp_path / "cache")
    with pytest.raises(BuildError, match="'nope' is not in the sdist"):
        fetch_project(Project("tinylib", "1.0", ("nope",), "tests"), tmp_path / "cache")


def test_quotas_split_evenly():
    assert quotas(240, 3) == [80, 80, 80]
    assert quotas(10, 3) == [4, 3, 3]


def _build_command(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m agents.envs.build args`` in ``folder``, its cache and output under
    ``folder/cache`` (``MISA_RL_CACHE``): a command refused before any work leaves
    ``folder`` empty."""
    repo = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-m", "agents.envs.build", *args], cwd=folder, capture_output=True,
                          text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(repo), "MISA_RL_CACHE": str(folder / "cache")})


@pytest.mark.parametrize(("arg", "says"), [
    ("num_tasks=abc", "num_tasks='abc' is invalid: give a whole number of tasks >= 1"),
    ("num_tasks=-1", "num_tasks=-1 is invalid: give a whole number of tasks >= 1"),
    ("workers=0", "workers=0 is invalid: give a whole number of mutants tested at once >= 1"),
    ("max_failing=0", "max_failing=0 is invalid: give a whole number >= min_failing"),
    ("projects=[]", "projects=[] is invalid: give a non-empty list"),
    ("nosuch=1", "unknown config key 'nosuch'. Valid keys at the top level: cache_dir, "),
    ("+nosuch=1", "unknown config key 'nosuch': the builder has no such option. Valid keys: cache_dir, "),
])
def test_build_command_refuses_a_mistake_with_one_line_and_exit_2_before_any_work(arg, says, tmp_path):
    r = _build_command(tmp_path, arg)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.startswith(f"error: {says}") and len(r.stderr.splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert list(tmp_path.iterdir()) == []  # no download, no cache, no build.log


def test_build_command_help_names_the_builder_and_its_keys(tmp_path):
    r = _build_command(tmp_path, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Task builder (python -m agents.envs.build)")
    assert "num_tasks: 240" in r.stdout and "workers: 2" in r.stdout
    assert "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_builders_recipe_passes_its_own_checks():
    from agents.envs.build import check_build_cfg
    from common.config import compose

    check_build_cfg(compose("agents/build_tasks"))
