"""Start and stop one standalone server (`python -m bucketing.hosts.standalone`) in its own folder, as `process`
does for TorchServe: a pid file read without following links, a process signalled only through a pidfd opened
before its identity was checked, never a process group.

A process is our standalone server only if it is what only ours is: a live `python` running `-m
bucketing.hosts.standalone` with `--key-file <our folder>/key_file.json`, working in our folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .client import ServerError, port_in_use
from .identity import argv, cwd_of, exe_name, state
from .ownfiles import open_own, refuse_symlinks, write_own
from .process import ROOT
from .served import ServedFolder

MODULE = "bucketing.hosts.standalone"
SERVE_DIR = ROOT / ".tmp" / "standalone"
DEFAULT_PORT = 8590  # beside `make serve`'s TorchServe (8580-8584)
PID_FILE_BYTES = 64
OWN_PATHS = ("standalone.pid", "standalone.out", "key_file.json")


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


class Standalone(ServedFolder):
    """One standalone server, in its own folder (pid file, log, key file) and session."""

    NAME = "standalone"
    PID_FILE_BYTES = PID_FILE_BYTES
    PROCESS = SERVICE = "the standalone server"

    def __init__(self, workdir: Path = SERVE_DIR, port: int = DEFAULT_PORT, host: str = "127.0.0.1") -> None:
        super().__init__(workdir, port, host)

    def is_ours(self, pid: int) -> bool:
        return is_our_standalone(pid, self.workdir)

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
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self


__all__ = ["DEFAULT_PORT", "MODULE", "SERVE_DIR", "Standalone", "is_our_standalone"]
