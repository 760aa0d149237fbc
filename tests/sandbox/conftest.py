from pathlib import Path

import pytest

from sandbox import Workspace


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    """A tiny repository snapshot: one module and its test."""
    snap = tmp_path / "snapshot"
    (snap / "pkg").mkdir(parents=True)
    (snap / "pkg" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (snap / "test_pkg.py").write_text("from pkg import add\n\ndef test_add():\n    assert add(1, 2) == 3\n")
    return snap


@pytest.fixture
async def workspace(snapshot: Path, tmp_path: Path):
    ws = Workspace.create(snapshot, root=tmp_path)
    yield ws
    await ws.destroy()
