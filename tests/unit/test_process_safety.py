"""A stale pid file is reported and removed, never acted on: the process it names survives."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tsctl import TorchServe
from tsctl.process import is_our_server


@pytest.fixture
def bystander():
    """A live process that is not TorchServe (what a reused pid points at after a crash or a reboot)."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def stale_server(tmp_path, pid: int) -> TorchServe:
    server = TorchServe(tmp_path / "serve")
    server.tmp.mkdir(parents=True)
    server.pid_file.write_text(f"{pid}\n")
    return server


@pytest.mark.parametrize("pid", ["bystander", "self", 1])
def test_stop_never_signals_what_a_stale_pid_file_names(tmp_path, bystander, pid):
    target = {"bystander": bystander.pid, "self": os.getpid()}.get(pid, pid)
    server = stale_server(tmp_path, target)
    assert server.pid() is None and not is_our_server(target, server.workdir)
    server.stop(timeout=1)
    assert bystander.poll() is None, "the unrelated process was signalled"
    assert not server.pid_file.exists()


def test_cli_reports_and_removes_a_stale_pid_file(tmp_path, bystander):
    server = stale_server(tmp_path, bystander.pid)
    for command in ("status", "stop"):
        server.pid_file.write_text(f"{bystander.pid}\n")
        out = subprocess.run([sys.executable, "-m", "tsctl", command, "--workdir", str(server.workdir)],
                             capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
        assert f"stale pid file {server.pid_file} named pid {bystander.pid} (sleep 300)" in out
        assert "nothing signalled" in out and not server.pid_file.exists()
    assert bystander.poll() is None
    token = subprocess.run([sys.executable, "-m", "tsctl", "token", "--workdir", str(server.workdir)],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert token.returncode == 1 and "make serve" in token.stderr
