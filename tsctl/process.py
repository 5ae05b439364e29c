"""Start and stop one TorchServe process tree, and nothing else.

A process is our server only if it is what only our TorchServe is: a live `java` executable whose arguments hold
the main class `org.pytorch.serve.ModelServer` and `-f <our config.properties>`, working in our folder. A pid
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

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .client import Client, Endpoints, ServerError, free_ports, port_in_use, read_properties

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROPERTIES = ROOT / "config" / "config.properties"
DEFAULT_STORE = ROOT / "model_store"
GRPC_PORTS = {"grpc_inference_port": "7070", "grpc_management_port": "7071"}
SERVER_CLASS = "org.pytorch.serve.ModelServer"
WORKER_SCRIPT = "ts/model_service_worker.py"
PID_FILE_BYTES = 64  # a pid file is one number; anything larger is not TorchServe's
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


def argv(pid: int) -> list[str] | None:
    """A process's arguments, or None if it is gone or unreadable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]] if raw else []


def _exe_name(pid: int) -> str | None:
    """The file name of the executable a process runs (what it is, whatever its argv[0] says)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name
    except OSError:
        return None


def _cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")).resolve()
    except OSError:
        return None


def is_our_server(pid: int, workdir: Path, config_file: Path | None = None) -> bool:
    """Whether `pid` is a live TorchServe frontend of ours: the `java` executable running the main class
    `org.pytorch.serve.ModelServer` with `-f <config_file>` (the server's config.properties), in `workdir`."""
    args = argv(pid)
    if not args or SERVER_CLASS not in args or _exe_name(pid) != "java" or _state(pid) in (None, "Z"):
        return False
    conf = str((config_file or workdir / "config.properties").resolve())
    tail = args[args.index(SERVER_CLASS) + 1 :]
    if not any(a == "-f" and i + 1 < len(tail) and tail[i + 1] == conf for i, a in enumerate(tail)):
        return False
    return _cwd(pid) == workdir.resolve()


def is_worker_of(pid: int, frontend: int) -> bool:
    """Whether `pid` is a live TorchServe worker started by the frontend `frontend` (its child, running
    `ts/model_service_worker.py`)."""
    args = argv(pid) or []
    return bool(args) and _ppid(pid) == frontend and any(a.endswith(WORKER_SCRIPT) for a in args[:4])


def find_servers(workdir: Path, config_file: Path | None = None) -> list[int]:
    """Live TorchServe frontends of ours (`is_our_server`) working in `workdir`."""
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and is_our_server(int(p.name), workdir, config_file)
    ]


def children(pid: int) -> list[int]:
    """The live children of `pid`."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _ppid(int(proc.name)) == pid:
            out.append(int(proc.name))
    return out


class Checked:
    """A process held by a pidfd and checked after the fd was opened: signals reach that process or none."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd = pid, fd

    @classmethod
    def open(cls, pid: int, check: Callable[[int], bool]) -> Checked | None:
        """The process `pid` if `check(pid)` holds once it is held (None otherwise: gone, or not what we expect)."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return None
        if not check(pid):
            os.close(fd)
            return None
        return cls(pid, fd)

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.fd, signum)

    def wait(self, timeout: float) -> bool:
        """Whether the process ended (or became a zombie) within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            state = _state(self.pid)
            if state in (None, "Z") or not self.alive():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def alive(self) -> bool:
        try:
            signal.pidfd_send_signal(self.fd, 0)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_small_file(path: Path, limit: int, what: str) -> str | None:
    """A small regular file's text (None if absent), read without following a symlink and without blocking: a
    FIFO, a folder, a device, a symlink or a file over `limit` bytes is a ServerError naming it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        kind = "a symlink" if path.is_symlink() else "a folder" if path.is_dir() else e.strerror
        raise ServerError(f"{path} is {kind}, not a {what}: remove it (`rm -r {path}`) and retry") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else f"not a regular file (mode {stat.filemode(info.st_mode)})"
        raise ServerError(f"{path} is {kind}, not a {what}: remove it (`rm -r {path}`) and retry")
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ServerError(f"{path} holds over {limit} bytes, not a {what}: remove it and retry")
    return data.decode(errors="replace")


def refuse_symlinks(folder: Path, names: Sequence[str]) -> None:
    """A ServerError if any of `names` in `folder` is a symlink (TorchServe or we would write through it)."""
    for name in names:
        if (folder / name).is_symlink():
            raise ServerError(
                f"{folder / name} is a symlink; the server's folder must hold its own files, not "
                "links out of it: remove it and retry"
            )


def open_own(path: Path, flags: int) -> int:
    """A file descriptor for writing a file of the server's own folder, never through a symlink."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | flags, 0o600)
    except OSError as e:
        raise ServerError(
            f"cannot write {path} ({e.strerror}); it must be a regular file of the server's folder, not a symlink"
        ) from None


def write_own(path: Path, data: bytes) -> None:
    with os.fdopen(open_own(path, os.O_TRUNC), "wb") as f:
        f.write(data)


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


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def _ppid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


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
