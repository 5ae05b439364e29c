"""Start and stop one TorchServe process tree, and nothing else.

Which process is ours is `identity`'s rule; signals go through `signals.Checked`; files of the server's folder
through `ownfiles`. A pid
file that survived a crash or a reboot (its pid reused by anything else) is reported and removed, never
signalled; a pid file that is not a small regular file (a FIFO, a folder, a symlink) is a one-line error. Stopping
signals only processes whose identity was checked, each through a pidfd opened before the check (so a pid reused
in between is never hit): the frontend, then its own worker children (`ts/model_service_worker.py`, children of
that frontend) that outlive it. No process group is ever signalled. Nothing is written through a symlink in the
server's folder.

TorchServe 0.12's traps handled here: a taken port makes the launcher exit 0 while an old server answers (ports
are checked free first, and the new server's own pid must be alive and answering); gRPC ports 7070/7071 are
opened too (each server gets its own); `torchserve --stop` deletes `key_file.json` in the folder it runs from,
trusts the pid file unchecked and leaves workers to the JVM (so we do not call it: we signal the checked
frontend ourselves).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .client import Client, Endpoints, ServerError, free_ports, port_in_use, read_properties
from .exporter import drain
from .identity import children, cwd_of, describe, find_servers, is_our_server, is_worker_of, state
from .ownfiles import open_own, read_small_file, refuse_symlinks, write_own
from .signals import Checked, deferred_signals

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROPERTIES = ROOT / "config" / "config.properties"
DEFAULT_STORE = ROOT / "model_store"
GRPC_PORTS = {"grpc_inference_port": "7070", "grpc_management_port": "7071"}
PID_FILE_BYTES = 64  # a pid file is one number; anything larger is not TorchServe's
SETTLE_S = 5.0  # how long a launched process that is not yet recognisable as our server is given to become one
# What TorchServe and we write in the server's folder: none of them may be a symlink (nothing is written through one).
OWN_PATHS = ("config.properties", "torchserve.out", "key_file.json", "logs", "tmp", "tmp/.model_server.pid")


class TorchServe:
    """One TorchServe process tree, in its own folder (logs, key file, TMPDIR) and process group."""

    def __init__(
        self,
        workdir: Path,
        endpoints: Endpoints | None = None,
        model_store: Path = DEFAULT_STORE,
        base_properties: Path = DEFAULT_PROPERTIES,
        extra_properties: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir.resolve()
        props = read_properties(base_properties)
        if endpoints is not None:
            grpc = free_ports(2)
            props.update(
                inference_address=endpoints.inference,
                management_address=endpoints.management,
                metrics_address=endpoints.metrics,
                grpc_inference_port=str(grpc[0]),
                grpc_management_port=str(grpc[1]),
            )
        props["model_store"] = str(model_store.resolve())
        props.update(extra_properties or {})
        self.properties = props
        self.endpoints = Endpoints.from_properties(props)
        self.tmp = self.workdir / "tmp"
        auth_off = props.get("disable_token_authorization", "false").lower() == "true"
        self.client = Client(self.endpoints, None if auth_off else self.workdir / "key_file.json")

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "TMPDIR": str(self.tmp), "TEMP": str(self.tmp)}

    @property
    def pid_file(self) -> Path:
        return self.tmp / ".model_server.pid"

    @property
    def config_file(self) -> Path:
        return self.workdir / "config.properties"

    def recorded_pid(self) -> int | None:
        """The pid the pid file names, whatever it is now (None without one); a pid file that is not a small
        regular file is a ServerError, read without blocking and without following a symlink."""
        text = read_small_file(self.pid_file, PID_FILE_BYTES, "pid file")
        try:
            return int(text.split()[0]) if text is not None else None
        except (ValueError, IndexError):
            return None

    def pid(self) -> int | None:
        """The pid of our running server: the pid file's if that process is TorchServe working in our folder, else
        such a process found by its command line and folder (the pid file is written after the JVM starts)."""
        pid = self.recorded_pid()
        if pid is not None and is_our_server(pid, self.workdir, self.config_file):
            return pid
        return next(iter(find_servers(self.workdir, self.config_file)), None)

    def clear_stale(self) -> str | None:
        """Remove a pid file whose pid is not our server; say what it pointed at (None if there was none)."""
        pid = self.recorded_pid()
        if pid is None or is_our_server(pid, self.workdir, self.config_file):
            return None
        what = describe(pid)
        self.pid_file.unlink(missing_ok=True)
        return f"stale pid file {self.pid_file} named pid {pid} ({what}): removed, nothing signalled"

    def start(self, timeout: float = 120.0) -> TorchServe:
        """Launch and wait until the server answers; on any failure or interruption, stop what was launched."""
        if self.pid() is not None:
            raise ServerError(f"a TorchServe from {self.workdir} is already running (pid {self.pid()})")
        self.clear_stale()
        grpc = [f"http://127.0.0.1:{self.properties.get(k, d)}" for k, d in GRPC_PORTS.items()]
        for url in (self.endpoints.inference, self.endpoints.management, self.endpoints.metrics, *grpc):
            if port_in_use(url):
                raise ServerError(f"{url} is already in use: stop what listens there or choose other ports")
        self.workdir.mkdir(parents=True, exist_ok=True)
        refuse_symlinks(self.workdir, OWN_PATHS)
        self.tmp.mkdir(exist_ok=True)
        (self.workdir / "key_file.json").unlink(missing_ok=True)
        conf = self.config_file
        write_own(conf, "".join(f"{k}={v}\n" for k, v in self.properties.items()).encode())
        launcher = [str(Path(sys.executable).parent / "torchserve"), "--start", "--ncs", "--ts-config", str(conf)]
        try:
            with os.fdopen(open_own(self.workdir / "torchserve.out", os.O_APPEND), "ab") as out:
                subprocess.run(
                    launcher,
                    cwd=self.workdir,
                    env=self.env,
                    stdout=out,
                    stderr=out,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    check=True,
                    timeout=60,
                )
            self._wait_answering(timeout)
        except BaseException:
            self.stop()  # whatever went wrong (Ctrl-C and SIGTERM included), leave no process behind
            raise
        return self

    def launched(self) -> int | None:
        """The pid the pid file names while that process is alive and works in our folder: our server, or one not
        yet recognisable as such (a JVM just started may not yet show its command line); else None."""
        pid = self.recorded_pid()
        if pid is None or state(pid) in (None, "Z"):
            return None
        return pid if cwd_of(pid) == self.workdir.resolve() else None

    def settled_pid(self, wait_s: float = SETTLE_S) -> int | None:
        """`pid()`, or, while the launched process is alive but not yet recognisable, the same after it settles
        (at most `wait_s`): a server caught mid-start is then found and stopped instead of left running."""
        deadline = time.monotonic() + wait_s
        while (pid := self.pid()) is None and self.launched() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        return pid

    def _wait_answering(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.settled_pid() is None:
                raise ServerError(f"TorchServe exited during start; see {self.workdir / 'torchserve.out'}")
            if self.client.ping():
                time.sleep(1.0)  # a late bind failure (gRPC) stops the server just after its first answer
                if self.pid() is not None and self.client.ping():
                    return
            time.sleep(0.25)
        raise ServerError(f"TorchServe did not answer /ping in {timeout:.0f} s; see {self.workdir / 'logs'}")

    def stop(self, timeout: float = 60.0, drain_s: float = 0.0) -> bool:
        """Stop our server and every process of its group; safe to call twice; a stale pid file is only removed.

        SIGINT and SIGTERM wait until it is done (a second Ctrl-C must not leave the server half-stopped).
        `drain_s`: first wait up to that long until what TorchServe admitted is answered (`exporter.drain`: its
        SIGTERM closes every connection, answered or not); whether it drained (True without a drain)."""
        with deferred_signals():
            drained = True
            if drain_s > 0 and self.pid() is not None:
                drained = drain(self.client, drain_s)
            self._stop(timeout)
            return drained

    def _stop(self, timeout: float) -> None:
        pid = self.settled_pid()
        if pid is None:
            self.clear_stale()
            return
        frontend = Checked.open(pid, lambda p: is_our_server(p, self.workdir, self.config_file))
        if frontend is not None:
            workers = [w for w in (Checked.open(c, lambda p: is_worker_of(p, pid)) for c in children(pid)) if w]
            try:
                frontend.signal(signal.SIGTERM)  # what `torchserve --stop` sends, to the checked process only
                if not frontend.wait(timeout):
                    frontend.signal(signal.SIGKILL)
                    frontend.wait(10.0)
                for worker in workers:  # they exit when the frontend's socket closes; a stuck one is ended
                    if not worker.wait(5.0):
                        worker.signal(signal.SIGKILL)
                        worker.wait(5.0)
            finally:
                for held in (frontend, *workers):
                    held.close()
        if self.recorded_pid() in (pid, None):
            self.pid_file.unlink(missing_ok=True)

    def __enter__(self) -> TorchServe:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
