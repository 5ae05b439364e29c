"""The image's entrypoint (`config/kserve/entrypoint.sh`) run on the host with a fake `torchserve` on PATH: a
SIGTERM that arrives before TorchServe's frontend pid is known, or as TorchServe starts, still reaches the frontend,
and the entrypoint waits for TorchServe and exits with its status (no image is built; the container tests are
opt-in)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from model_store.archives import ROOT

ENTRYPOINT = ROOT / "config" / "kserve" / "entrypoint.sh"

# TorchServe's launcher as it behaves (ts/model_server.py, --foreground): starts the frontend, writes its pid to
# `.model_server.pid` in Python's `tempfile.gettempdir()` (asked of Python here, as the launcher does: $TMPDIR,
# $TEMP, $TMP, /tmp, the first that is a writable folder), waits for it; SIGTERM kills the launcher at once and is
# forwarded to nothing. The fake
# frontend records the signals it gets and exits 0 on SIGTERM (FAKE_EXIT: exits with that at once).
# FAKE_PID_DELAY: seconds between starting the frontend and writing its pid; FAKE_TERM_PARENT: the launcher sends
# SIGTERM to the entrypoint as it starts.
FAKE_TORCHSERVE = r"""#!/bin/sh
echo "$$" >"$FAKE_LOG/launcher.pid"
tmp=$("$FAKE_PYTHON" -c 'import tempfile; print(tempfile.gettempdir())')
if [ -n "${FAKE_TERM_PARENT:-}" ]; then kill -TERM "$PPID"; fi
sh -c 'trap "echo TERM >>\"$FAKE_LOG/frontend.signals\"; exit 0" TERM
       echo "$$" >"$FAKE_LOG/frontend.pid"
       if [ -n "${FAKE_EXIT:-}" ]; then exit "$FAKE_EXIT"; fi
       while :; do sleep 0.05; done' &
frontend=$!
sleep "${FAKE_PID_DELAY:-0}"
echo "$frontend" >"$tmp/.model_server.pid"
wait "$frontend"
"""


@pytest.fixture
def fake_path(tmp_path):
    """A PATH whose `torchserve` is the fake, and the folder it logs into."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    fake = bin_dir / "torchserve"
    fake.write_text(FAKE_TORCHSERVE)
    fake.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}", log


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path.name} never written"
        time.sleep(0.02)


def run_entrypoint(fake_path, tmp_path, **env: str | None) -> tuple[subprocess.Popen[str], Path]:
    """The entrypoint with the fake on PATH and TMPDIR a folder of the test's (`env`: more variables; None unsets)."""
    path, log = fake_path
    (tmp_path / "tmp").mkdir()
    base = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    given = {"PATH": path, "FAKE_LOG": str(log), "FAKE_PYTHON": sys.executable, "TMPDIR": str(tmp_path / "tmp"), **env}
    environment = {**base, **{k: v for k, v in given.items() if v is not None}}
    proc = subprocess.Popen(
        ["sh", str(ENTRYPOINT), "--model-store", "x"],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return proc, log


def finish(proc: subprocess.Popen[str], log: Path, timeout: float) -> tuple[int | None, str, list[int]]:
    """The entrypoint's status (None: still running), its output, and the fake's processes still alive; everything
    it started is ended here on every path."""
    try:
        out, _ = proc.communicate(timeout=timeout)
        status: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        status = None
    pids = [int(p.read_text()) for p in (log / "launcher.pid", log / "frontend.pid") if p.exists()]
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    if status is None:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    return status, out, left


def test_a_sigterm_before_the_frontend_pid_is_known_reaches_the_frontend(fake_path, tmp_path):
    """SIGTERM while the launcher has started the frontend but not yet written its pid (here for 6 s): forwarded to
    the frontend once its pid is known, and the entrypoint exits with TorchServe's status (was: after 5 s the
    launcher alone was signalled, which dies and forwards nothing, leaving the frontend running)."""
    proc, log = run_entrypoint(fake_path, tmp_path, FAKE_PID_DELAY="6")
    wait_for(log / "frontend.pid", 10)
    proc.send_signal(signal.SIGTERM)
    status, out, left = finish(proc, log, 15)
    assert left == [], f"still running after the entrypoint: {left}; {out}"
    assert (log / "frontend.signals").read_text().split() == ["TERM"], out
    assert status == 0 and "ts-entrypoint: stopping TorchServe (frontend pid" in out, out


@pytest.mark.parametrize(
    "where",
    [
        pytest.param({"TMPDIR": None, "TEMP": "tmp"}, id="TEMP set, TMPDIR unset"),
        pytest.param({"TMPDIR": "missing", "TEMP": "tmp"}, id="TMPDIR a missing folder"),
    ],
)
def test_a_sigterm_reaches_the_frontend_wherever_python_puts_the_pid_file(fake_path, tmp_path, where):
    """The launcher writes its pid file where Python's `tempfile.gettempdir()` points, which is not `$TMPDIR` when
    TMPDIR is unset and TEMP is set, or when TMPDIR names no folder: the entrypoint finds it there all the same (was:
    it polled `${TMPDIR:-/tmp}` for ever, SIGTERM never reached the frontend)."""
    env = {k: None if v is None else str(tmp_path / v) for k, v in where.items()}
    proc, log = run_entrypoint(fake_path, tmp_path, **env)
    wait_for(log / "frontend.pid", 10)
    proc.send_signal(signal.SIGTERM)
    status, out, left = finish(proc, log, 10)
    assert left == [], f"still running after the entrypoint: {left}; {out}"
    assert (log / "frontend.signals").read_text().split() == ["TERM"], out
    assert status == 0 and (tmp_path / "tmp" / ".model_server.pid").exists(), out


def test_a_sigterm_as_torchserve_starts_reaches_the_frontend(fake_path, tmp_path):
    """SIGTERM arriving the moment TorchServe's launcher starts (it signals the entrypoint itself): the trap is set
    before anything starts, so it is forwarded once the frontend's pid is known, never lost with TorchServe left
    running."""
    proc, log = run_entrypoint(fake_path, tmp_path, FAKE_TERM_PARENT="1", FAKE_PID_DELAY="0.5")
    status, out, left = finish(proc, log, 15)
    assert left == [], f"still running after the entrypoint: {left}; {out}"
    assert (log / "frontend.signals").read_text().split() == ["TERM"], out
    assert status == 0, out


def test_torchserve_ending_by_itself_is_the_entrypoints_status(fake_path, tmp_path):
    proc, log = run_entrypoint(fake_path, tmp_path, FAKE_EXIT="3")
    status, out, left = finish(proc, log, 15)
    assert (status, left) == (3, []) and "ts-entrypoint: TorchServe exited (3)" in out, out
    assert not (log / "frontend.signals").exists()


def test_the_trap_is_set_before_torchserve_starts():
    """No window where a SIGTERM kills the entrypoint and leaves TorchServe running: the trap comes first."""
    lines = [line.strip() for line in ENTRYPOINT.read_text().splitlines()]
    trap = next(i for i, line in enumerate(lines) if line.startswith("trap "))
    start = next(i for i, line in enumerate(lines) if line.startswith("torchserve "))
    assert trap < start
