"""Nothing a test session runs is left in the temp folder: the session's own temp folder and
its check (tests/conftest.py), and the parts that used to leave files there."""

from __future__ import annotations

import os
import tempfile

from tests.conftest import OURS, leftovers_message


def test_leftovers_named_as_the_projects_are_listed_with_their_sizes(tmp_path):
    assert leftovers_message(tmp_path, OURS) is None
    (tmp_path / "vllm_dist_0123").write_bytes(b"x" * 3 * 2**20)
    (tmp_path / "sandbox-empty-ab").mkdir()
    (tmp_path / "080184a6-c8c5-4071-8186-28cdb0ff3486").write_text("")  # a vLLM RPC socket's name
    (tmp_path / "tmpepy2zpvdwandb-media").mkdir()  # wandb's, removed at interpreter exit
    message = leftovers_message(tmp_path, OURS)
    assert message.startswith("the test session left 3 entries in its temp folder: ")
    assert "sandbox-empty-ab (0.0 MiB)" in message and "vllm_dist_0123 (3.0 MiB)" in message
    assert "wandb" not in message
    assert "4 entries" in leftovers_message(tmp_path)


def test_the_session_writes_temp_files_into_a_folder_of_its_own(session_temp_folder):
    assert session_temp_folder.name.startswith("misa-rl-tests-")
    assert tempfile.gettempdir() == os.environ["TMPDIR"] == str(session_temp_folder)


def test_a_sandboxed_program_leaves_nothing_in_the_temp_folder(tmp_path, monkeypatch):
    import asyncio

    from sandbox.snippet import run_python_program

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for _ in range(2):
        assert asyncio.run(run_python_program("print('ran')")).stdout.strip() == "ran"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_engine_temp_files_go_to_the_pools_folder_which_stop_removes(tmp_path):
    from rollout.engines import EnginePool, private_temp_env

    folder = tmp_path / "misa-rl-engines-x"
    folder.mkdir()
    env = private_temp_env(folder)
    # vLLM's vllm_dist_<hex> file store (tempfile) and its RPC sockets (VLLM_RPC_BASE_PATH)
    assert env["TMPDIR"] == env["VLLM_RPC_BASE_PATH"] == str(folder)
    assert not env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(folder))  # the compile cache is kept
    (folder / "vllm_dist_0123").write_text("")
    EnginePool([], folder).stop()
    assert not folder.exists()
