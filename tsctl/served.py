"""What a server of ours started in its own folder has, whichever it is (the standalone server, a local Ray head):
its URL, pid file, log and key file, the pid file read without following links, and its pid only once its identity
is checked (`is_ours`); a pid file naming anything else is removed, never signalled."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from .client import KeyFile, ServerError, request
from .identity import describe
from .ownfiles import read_small_file
from .signals import Checked, deferred_signals


class ServedFolder:
    """One server in its own folder: `NAME.pid` (its pid and ports, as numbers), `NAME.out`, `key_file.json`."""

    NAME = "server"  # the pid file's and log's stem
    PID_FILE_BYTES = 64
    PORTS = 1  # ports the pid file names after the pid (the first is `port`)
    PROCESS = "the server"  # what the launched process is, in errors
    SERVICE = "the server"  # what answers `/v2/health/ready`, in errors
    TAIL_LINES = 15  # the log's last lines an error shows
    POLL_S = 0.25  # readiness asked this often during a start

    def __init__(self, workdir: Path, port: int, host: str = "127.0.0.1") -> None:
        self.workdir = workdir.resolve()
        self.port = port
        self.host = host
        self.process: subprocess.Popen[bytes] | None = None  # when started by this process

    def is_ours(self, pid: int) -> bool:
        """Whether `pid` is this folder's live server (each kind checks what only its own process is)."""
        raise NotImplementedError

    def adopt(self, ports: tuple[int, ...]) -> None:
        """The recorded ports of the running server become ours."""
        self.port = ports[0]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.workdir / f"{self.NAME}.pid"

    @property
    def key_file(self) -> Path:
        return self.workdir / "key_file.json"

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.NAME}.out"

    def key(self) -> str | None:
        return KeyFile(self.key_file).key("inference")

    def headers(self) -> dict[str, str]:
        key = self.key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def tail(self, lines: int | None = None) -> str:
        """The log's last lines ("" without one)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-(lines or self.TAIL_LINES) :])
        except OSError:
            return ""

    def ready(self) -> bool:
        try:
            return request(f"{self.url}/v2/health/ready", timeout=5).status == 200
        except OSError:
            return False

    def alive_or_raise(self) -> None:
        """During a start: the launched process has not exited (else a ServerError with its log's tail)."""
        if self.process is not None and self.process.poll() is not None:
            code = self.process.returncode
            raise ServerError(f"{self.PROCESS} exited during start ({code}):\n{self.tail()}")

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.alive_or_raise()
            if self.ready():
                return
            time.sleep(self.POLL_S)
        raise ServerError(f"{self.SERVICE} was not ready in {timeout:.0f} s; see {self.log}")

    def recorded(self) -> tuple[int, ...] | None:
        """The pid and ports the pid file names, whatever they are now (None without one)."""
        text = read_small_file(self.pid_file, self.PID_FILE_BYTES, "pid file")
        try:
            numbers = tuple(int(x) for x in (text or "").split()[: 1 + self.PORTS])
        except ValueError:
            return None
        return numbers if len(numbers) == 1 + self.PORTS else None

    def pid(self) -> int | None:
        """The pid of our running server (the pid file's, checked), else None; its ports become ours."""
        recorded = self.recorded()
        if recorded is None or not self.is_ours(recorded[0]):
            return None
        self.adopt(recorded[1:])
        return recorded[0]

    def clear_stale(self) -> str | None:
        """Remove a pid file whose pid is not our server; say what it pointed at (None if there was none)."""
        recorded = self.recorded()
        if recorded is None or self.is_ours(recorded[0]):
            return None
        what = describe(recorded[0])
        self.pid_file.unlink(missing_ok=True)
        return f"stale pid file {self.pid_file} named pid {recorded[0]} ({what}): removed, nothing signalled"

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM our server (the standalone server drains, then exits; a Ray head ends every Ray process it
        started), SIGKILL if it outlives `timeout`; only through a pidfd opened before its identity was checked;
        safe to call twice; its exit status when this process started it (else None)."""
        with deferred_signals():
            pid = self.pid() if self.process is None else self.process.pid
            held = Checked.open(pid, self.is_ours) if pid is not None else None
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
            if recorded is None or recorded[0] == pid:  # the pid file goes if it still names the stopped server
                self.pid_file.unlink(missing_ok=True)
            return code


__all__ = ["ServedFolder"]
