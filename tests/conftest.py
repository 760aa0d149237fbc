"""Shared fixtures. The real-engine ones start ONE vLLM engine per test session.

Tests that use them are marked ``engine`` (select with ``-m engine``, skip with
``-m "not engine"``). The engine runs the packaged SmolLM2-135M in eager mode with a small
KV cache; it is stopped (whole process group) at the end of the session.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from common.config import compose

SERVED_NAME = "smollm2-135m"

TESTS_DIR = Path(__file__).resolve().parent
GSM8K_TINY = TESTS_DIR / "data" / "gsm8k_tiny.jsonl"
"""Three made-up problems in GSM8K's format, for the parsing tests."""
SHARED_GSM8K = TESTS_DIR.parent.parent / "shared" / "data" / "gsm8k"
"""The real GSM8K files, beside the repository as the README says (``../shared``)."""
GSM8K_TINY_OVERRIDE = f"trainer.domains.rlvr.gsm8k.path={GSM8K_TINY}"
"""For commands and configs whose pre-start checks read the GSM8K file: the fixture, so a
clone without ``../shared`` runs them."""


@pytest.fixture
def real_gsm8k_dir() -> Path:
    """``SHARED_GSM8K``; the test is skipped (reason given) where it is absent."""
    if not (SHARED_GSM8K / "test.jsonl").is_file():
        pytest.skip(f"the real GSM8K files are not at {SHARED_GSM8K} (../shared beside the repository)")
    return SHARED_GSM8K


def _size_bytes(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*"))


OURS = re.compile(r"(sandbox-|ws-|eval-|humaneval-|bench-|router-proxy-|misa-rl-|vllm_dist_"
                  r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$)")
"""Temp names the project makes, or vLLM does for it (``vllm_dist_<hex>``, RPC sockets
``<uuid>``). Others (wandb's ``tmp...wandb-media``) belong to libraries that remove them at
interpreter exit, after the session's check."""


def leftovers_message(folder: Path, names: re.Pattern = re.compile("")) -> str | None:
    """What was left in ``folder`` among the entries whose name starts with a match of
    ``names`` (each with its size), or None when there is none."""
    left = sorted(p for p in folder.iterdir() if names.match(p.name))
    if not left:
        return None
    listed = ", ".join(f"{p.name} ({_size_bytes(p) / 2**20:.1f} MiB)" for p in left[:20])
    return (f"the test session left {len(left)} entries in its temp folder: {listed}. Whatever writes "
            "there (a fixture, the code under test, a process it starts) must remove it.")


@pytest.fixture(scope="session", autouse=True)
def session_temp_folder(tmp_path_factory):
    """Everything this session writes through ``tempfile`` (the code under test, the processes
    it starts, vLLM's files) goes to one folder of its own; at the end, anything left there
    fails the session (listed with sizes), and the folder is removed.

    pytest's own ``tmp_path`` folders are made first, where pytest keeps them (its
    retention is set in pyproject.toml). Other sessions on the machine write elsewhere,
    so only this session's leftovers are counted: those named as the project names its
    temp files (``OURS``) fail the session, the others are listed on stderr.
    """
    from rollout.engines import inductor_cache_dir

    tmp_path_factory.getbasetemp()
    private = Path(tempfile.mkdtemp(prefix="misa-rl-tests-"))
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")}
    saved_tempdir = tempfile.tempdir
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache_dir()  # a cache meant to stay
    os.environ["TMPDIR"] = tempfile.tempdir = str(private)
    try:
        yield private
    finally:
        tempfile.tempdir = saved_tempdir
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        problem, others = leftovers_message(private, OURS), leftovers_message(private)
        shutil.rmtree(private, ignore_errors=True)
    if others and not problem:
        print(f"\nnote: {others} (not named as the project's; removed)", file=sys.stderr)
    if problem:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def train_cfg():
    """The default composed config (recipe=mixed_step router=misa-t), unresolved run_dir."""
    return compose("train", ["run_dir=runs/test", GSM8K_TINY_OVERRIDE])


@pytest.fixture(scope="session")
def model_path(train_cfg) -> str:
    """Folder of the prepared default model (converted once, then cached)."""
    from rollout.model import resolve_model_path

    return resolve_model_path(train_cfg.model)


@pytest.fixture(scope="session")
def real_engine(model_path, tmp_path_factory):
    """One real vLLM engine (EngineHandle) with prefix caching and KV events on."""
    from rollout.engines import EnginePool

    ecfg = OmegaConf.load(Path(__file__).resolve().parent.parent / "recipes/engine/cpu.yaml")
    ecfg.num_engines = 1
    ecfg.kv_cache_space_gib = 0.25
    ecfg.max_num_seqs = 32
    pool = EnginePool.start(ecfg, model_path, SERVED_NAME, 2048, "float32",
                            tmp_path_factory.mktemp("engine-logs"))
    try:
        yield pool.handles[0]
    finally:
        pool.stop()


@pytest.fixture(scope="session")
def real_engine_url(real_engine) -> str:
    return real_engine.url


@pytest.fixture(scope="session")
def real_router_url(real_engine, model_path, tmp_path_factory, train_cfg) -> str:
    """Our router (policy misa_t) over HTTP in front of the real engine."""
    from router.launch import start_router

    handle = start_router(train_cfg.router, [real_engine.url], [real_engine.kv_events_endpoint],
                          model_path, tmp_path_factory.mktemp("router-logs"))
    try:
        yield handle.url
    finally:
        handle.stop()

# A model folder that exists, for tests of the checks a job runs before it starts (they
# refuse a model.path that does not exist; nothing here loads it).
STAND_IN_MODEL_OVERRIDE = f"model.path={Path(__file__).resolve().parent / 'data' / 'stand_in_model'}"
