"""Ctrl-C, SIGTERM (a CI timeout, `kill`) in `make serve`, `bench/compare.py` and the test fixtures: each stops
exactly the TorchServe it started, and nothing is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from model_store.archives import ROOT
from tests.e2e.conftest import OUTER_STORE, processes_under

pytestmark = pytest.mark.e2e
SIGNALS = [signal.SIGINT, signal.SIGTERM]


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def interrupt(proc: subprocess.Popen, signum: int, timeout: float = 120.0) -> int:
    proc.send_signal(signum)
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def java_under(folder: Path) -> list[int]:
    pids = []
    for pid in processes_under(folder):
        try:
            if "java" in Path(f"/proc/{pid}/cmdline").read_bytes().decode():
                pids.append(pid)
        except OSError:  # ended in between
            continue
    return pids


def end_whatever_is_left(proc: subprocess.Popen, *folders: Path) -> None:
    """After a failed check: end the process the test started and every process working in its folders (its
    server's JVM and workers), so that no path of a test leaves anything running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)
    for folder in folders:
        for pid in processes_under(folder):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("signum", SIGNALS)
def test_serve_interrupted_during_start_leaves_nothing(tmp_path, signum):
    workdir = tmp_path / "serve"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tsctl", "start", "--workdir", str(workdir), "--free-ports"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: java_under(workdir), 60, "TorchServe's JVM")
        assert interrupt(proc, signum) != 0
        wait_for(lambda: not processes_under(workdir), 30, "every process of the server to end")
    finally:
        end_whatever_is_left(proc, workdir)


@pytest.mark.parametrize("signum", SIGNALS)
def test_bench_interrupted_mid_run_stops_its_server(tmp_path, signum):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "bench/compare.py", "--suite", "smoke", "--out", str(tmp_path), "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("[1/"):  # the server is up and the first configuration is being measured
                break
        assert lines and lines[-1].startswith("[1/"), "".join(lines)
        stamp = next(p.name for p in tmp_path.iterdir())
        workdir = ROOT / ".tmp" / f"bench-{stamp}"
        assert java_under(workdir)
        rc = interrupt(proc, signum)
        output = "".join(lines) + proc.stdout.read()
        assert rc == 130, output
        assert "interrupted: results so far are kept" in output
        assert processes_under(workdir) == [], output
        assert (tmp_path / stamp / "report.md").exists()
    finally:
        end_whatever_is_left(proc, *(ROOT / ".tmp" / f"bench-{p.name}" for p in tmp_path.iterdir()))


@pytest.mark.parametrize("signum", SIGNALS)
def test_test_fixtures_stop_their_server_when_pytest_is_interrupted(tmp_path, model_store, signum):
    """The inner session's `torchserve` fixture, interrupted while it holds its server (on this session's model
    store: the inner one registers nothing, building its own would only take time)."""
    ready = tmp_path / "ready"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--basetemp",
        str(tmp_path / "base"),
        "tests/e2e/targets/serve_and_wait.py",
    ]
    env = {**os.environ, "READY_FILE": str(ready), OUTER_STORE: str(model_store)}
    with open(tmp_path / "inner.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: ready.exists() and ready.read_text(), 240, "the inner session's TorchServe")
        workdir = Path(ready.read_text())
        assert java_under(workdir)
        interrupt(proc, signum)
        assert processes_under(workdir) == [], (tmp_path / "inner.log").read_text()[-3000:]
    finally:
        end_whatever_is_left(proc, tmp_path / "base")
