"""Start and stop one standalone server (`python -m bucketing.hosts.standalone`) in its own folder, as `process`
does for TorchServe: a pid file read without following links, a process signalled only through a pidfd opened
before its identity was checked, never a process group.

A process is our standalone server only if it is what only ours is: a live `python` running `-m
bucketing.hosts.standalone` with `--key-file <our folder>/key_file.json`, working in our folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .client import KeyFile, ServerError, port_in_use, request
from .identity import argv, cwd_of, describe, exe_name, state
from .ownfiles import open_own, read_small_file, refuse_symlinks, write_own
from .process import ROOT
from .signals import Checked, deferred_signals

MODULE = "bucketing.hosts.standalone"
SERVE_DIR = ROOT / ".tmp" / "standalone"
DEFAULT_PORT = 8590  # beside `make serve`'s TorchServe (8580-8584)
PID_FILE_BYTES = 64
OWN_PATHS = ("standalone.pid", "standalone.out", "key_file.json")
TAIL_LINES = 15


def is_our_standalone(pid: int, workdir: Path) -> bool:
    """Whether `pid` is a live standalone server of ours: python running `-m MODULE` with our key file, in our
    folder."""
    args = argv(pid)
    if not args or state(pid) in (None, "Z") or not (exe_name(pid) or "").startswith("python"):
        return False
    if args[1:3] != ["-m", MODULE]:
        return False
    key_file = str((workdir / "key_file.json").resolve())
    if not any(a == "--key-file" and i + 1 < len(args) and args[i + 1] == key_file for i, a in enumerate(args)):
        return False
    return cwd_of(pid) == workdir.resolve()


class Standalone:
    """One standalone server, in its own folder (pid file, log, key file) and session."""

    def __init__(self, workdir: Path = SERVE_DIR, port: int = DEFAULT_PORT, host: str = "127.0.0.1") -> None:
        self.workdir = workdir.resolve()
        self.port = port
        self.host = host
        self.process: subprocess.Popen[bytes] | None = None  # when started by this process

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.workdir / "standalone.pid"

    @property
    def key_file(self) -> Path:
        return self.workdir / "key_file.json"

    @property
    def log(self) -> Path:
        return self.workdir / "standalone.out"

    def key(self) -> str | None:
        return KeyFile(self.key_file).key("inference")

    def headers(self) -> dict[str, str]:
        key = self.key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def recorded(self) -> tuple[int, int] | None:
        """The (pid, port) the pid file names, whatever they are now (None without one)."""
        text = read_small_file(self.pid_file, PID_FILE_BYTES, "pid file")
        try:
            pid, port = (int(x) for x in (text or "").split()[:2])
        except ValueError:
            return None
        return pid, port

    def pid(self) -> int | None:
        """The pid of our running server (the pid file's, checked), else None; its port becomes ours."""
        recorded = self.recorded()
        if recorded is None or not is_our_standalone(recorded[0], self.workdir):
            return None
        self.port = recorded[1]
        return recorded[0]

    def clear_stale(self) -> str | None:
        """Remove a pid file whose pid is not our server; say what it pointed at (None if there was none)."""
        recorded = self.recorded()
        if recorded is None or is_our_standalone(recorded[0], self.workdir):
            return None
        what = describe(recorded[0])
        self.pid_file.unlink(missing_ok=True)
        return f"stale pid file {self.pid_file} named pid {recorded[0]} ({what}): removed, nothing signalled"

    def start(self, source: Sequence[str], extra: Sequence[str] = (), timeout: float = 300.0) -> Standalone:
        """Launch on `source` (`--archive X.mar`, ...) and wait until every model is ready; on any failure or
        interruption, stop what was launched."""
        if self.pid() is not None:
            raise ServerError(f"a standalone server from {self.workdir} is already running (pid {self.pid()})")
        self.clear_stale()
        if port_in_use(self.url):
            raise ServerError(f"{self.url} is already in use: stop what listens there or choose another port")
        self.workdir.mkdir(parents=True, exist_ok=True)
        refuse_symlinks(self.workdir, OWN_PATHS)
        command = [sys.executable, "-m", MODULE, *source, "--host", self.host, "--port", str(self.port)]
        command += ["--key-file", str(self.key_file), *extra]
        try:
            with os.fdopen(open_own(self.log, os.O_APPEND), "ab") as out:
                self.process = subprocess.Popen(
                    command, cwd=self.workdir, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True
                )
            write_own(self.pid_file, f"{self.process.pid} {self.port}\n".encode())
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def ready(self) -> bool:
        try:
            return request(f"{self.url}/v2/health/ready", timeout=5).status == 200
        except OSError:
            return False

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                raise ServerError(f"the standalone server exited during start ({code}):\n{self.tail()}")
            if self.ready():
                return
            time.sleep(0.25)
        raise ServerError(f"the standalone server was not ready in {timeout:.0f} s; see {self.log}")

    def tail(self, lines: int = TAIL_LINES) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM our server (it drains, then exits), SIGKILL if it outlives `timeout`; safe to call twice; its
        exit status when this process started it (else None)."""
        with deferred_signals():
            pid = self.pid() if self.process is None else self.process.pid
            held = Checked.open(pid, lambda p: is_our_standalone(p, self.workdir)) if pid is not None else None
            if held is not None:
                try:
                    held.signal(signal.SIGTERM)
                    if not held.wait(timeout):
                        held.signal(signal.SIGKILL)
                        held.wait(10.0)
                finally:
                    held.close()
            elif pid is None:
                self.clear_stale()
            code = None
            if self.process is not None:
                try:
                    code = self.process.wait(10.0)
                except subprocess.TimeoutExpired:
                    code = None
            recorded = self.recorded()
            if recorded is None or recorded[0] == pid:
                self.pid_file.unlink(missing_ok=True)
            return code


__all__ = ["DEFAULT_PORT", "MODULE", "SERVE_DIR", "Standalone", "is_our_standalone"]
