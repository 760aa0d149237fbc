"""``python -m router`` stops on Ctrl-C and SIGTERM with the exit codes of every command:
130 and 143 (common.config), after stopping the service."""

import signal
import subprocess
import sys
import time

import pytest

from common.config import REPO_ROOT


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_router_exits_130_on_ctrl_c_and_143_on_sigterm(tmp_path, sig, code):
    log = tmp_path / "router.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "router", "engines.urls=[http://127.0.0.1:9]",
                                 "server.port=0", f"hydra.run.dir={tmp_path / 'run'}"],
                                cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while "serving on" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        proc.send_signal(sig)
        assert proc.wait(timeout=120) == code, log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        proc.kill()
        proc.wait()

