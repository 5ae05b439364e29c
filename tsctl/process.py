"""Start and stop one TorchServe process tree, and nothing else.

A server is ours only if the pid in its pid file is alive, runs TorchServe's `org.pytorch.serve.ModelServer`,
and works in our folder: a pid file that survived a crash or a reboot (its pid reused by anything else) is
reported and removed, never signalled. TorchServe 0.12's traps handled here: a taken port makes the launcher
exit 0 while an old server answers (ports are checked free first, and the new server's own pid must be alive and
answering); gRPC ports 7070/7071 are opened too (each server gets its own); `torchserve --stop` deletes
`key_file.json` in the folder it runs from and leaves workers to the JVM (it runs from the server's folder, then
the server's whole process group is ended).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from .client import Client, Endpoints, ServerError, free_ports, port_in_use, read_properties

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROPERTIES = ROOT / "config" / "config.properties"
DEFAULT_STORE = ROOT / "model_store"
GRPC_PORTS = {"grpc_inference_port": "7070", "grpc_management_port": "7071"}
SERVER_CLASS = "org.pytorch.serve.ModelServer"


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

    def recorded_pid(self) -> int | None:
        """The pid the pid file names, whatever it is now."""
        try:
            return int(self.pid_file.read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def pid(self) -> int | None:
        """The pid of our running server: the pid file's if that process is TorchServe working in our folder, else
        such a process found by its command line and folder (the pid file is written after the JVM starts)."""
        pid = self.recorded_pid()
        if pid is not None and is_our_server(pid, self.workdir):
            return pid
        return next(iter(find_servers(self.workdir)), None)

    def clear_stale(self) -> str | None:
        """Remove a pid file whose pid is not our server; say what it pointed at (None if there was none)."""
        pid = self.recorded_pid()
        if pid is None or is_our_server(pid, self.workdir):
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
        self.tmp.mkdir(parents=True, exist_ok=True)
        (self.workdir / "key_file.json").unlink(missing_ok=True)
        conf = self.workdir / "config.properties"
        conf.write_text("".join(f"{k}={v}\n" for k, v in self.properties.items()))
        launcher = [str(Path(sys.executable).parent / "torchserve"), "--start", "--ncs", "--ts-config", str(conf)]
        try:
            with open(self.workdir / "torchserve.out", "ab") as out:
                subprocess.run(
                    launcher, cwd=self.workdir, env=self.env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                    start_new_session=True, check=True, timeout=60,
                )  # fmt: skip
            self._wait_answering(timeout)
        except BaseException:
            self.stop()  # whatever went wrong (Ctrl-C and SIGTERM included), leave no process behind
            raise
        return self

    def _wait_answering(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pid() is None:
                raise ServerError(f"TorchServe exited during start; see {self.workdir / 'torchserve.out'}")
            if self.client.ping():
                time.sleep(1.0)  # a late bind failure (gRPC) stops the server just after its first answer
                if self.pid() is not None and self.client.ping():
                    return
            time.sleep(0.25)
        raise ServerError(f"TorchServe did not answer /ping in {timeout:.0f} s; see {self.workdir / 'logs'}")

    def stop(self, timeout: float = 60.0) -> None:
        """Stop our server and every process of its group; safe to call twice; a stale pid file is only removed.

        SIGINT and SIGTERM wait until it is done (a second Ctrl-C must not leave the server half-stopped)."""
        with _deferred_signals():
            self._stop(timeout)

    def _stop(self, timeout: float) -> None:
        pid = self.pid()
        if pid is None:
            self.clear_stale()
            return
        pgid = os.getpgid(pid)
        subprocess.run(
            [str(Path(sys.executable).parent / "torchserve"), "--stop"], cwd=self.workdir, env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.2)
        if _group_alive(pgid) and pgid not in (0, 1, os.getpgrp()):  # never our own group, never init's
            os.killpg(pgid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)

    def __enter__(self) -> TorchServe:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cmdline(pid: int) -> str | None:
    """A process's command line, or None if it is gone or unreadable."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def describe(pid: int) -> str:
    line = cmdline(pid)
    if line is None:
        return "no such process"
    return (line[:80] + "...") if len(line) > 80 else (line or "a kernel thread")


def is_our_server(pid: int, workdir: Path) -> bool:
    """Whether `pid` is a live TorchServe frontend working in `workdir` (its command line and its folder)."""
    line = cmdline(pid)
    if not line or SERVER_CLASS not in line or _state(pid) in (None, "Z"):
        return False
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")).resolve() == workdir.resolve()
    except OSError:
        return False


def find_servers(workdir: Path) -> list[int]:
    """Live TorchServe frontends working in `workdir`."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and is_our_server(int(p.name), workdir)]


def group_stats(pgid: int) -> list[list[str]]:
    """The /proc/PID/stat fields (after the command name) of every process in a process group."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                out.append(fields)
    return out


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds (user + system) of every live process in a process group."""
    tick = os.sysconf("SC_CLK_TCK")
    return sum((int(f[11]) + int(f[12])) / tick for f in group_stats(pgid))


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # Zombies count as gone: they hold no port or memory and are reaped by their parent.
    return any(f[0] != "Z" for f in group_stats(pgid))


@contextlib.contextmanager
def _deferred_signals() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends (then they are delivered)."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def exit_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise SystemExit (SIGINT raises KeyboardInterrupt), so every
    `finally` runs: what a CI timeout, `kill` or a closed terminal interrupts still stops what it started."""

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, leave) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
