"""Which process is which, read from /proc: a TorchServe frontend of ours, its workers, a process group's members.

A process is our server only if it is what only our TorchServe is: a live `java` executable whose arguments hold
the main class `org.pytorch.serve.ModelServer` and `-f <our config.properties>`, working in our folder.
"""

from __future__ import annotations

import os
from pathlib import Path

SERVER_CLASS = "org.pytorch.serve.ModelServer"
WORKER_SCRIPT = "ts/model_service_worker.py"


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


def exe_name(pid: int) -> str | None:
    """The file name of the executable a process runs (what it is, whatever its argv[0] says)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name
    except OSError:
        return None


def cwd_of(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")).resolve()
    except OSError:
        return None


def is_our_server(pid: int, workdir: Path, config_file: Path | None = None) -> bool:
    """Whether `pid` is a live TorchServe frontend of ours: the `java` executable running the main class
    `org.pytorch.serve.ModelServer` with `-f <config_file>` (the server's config.properties), in `workdir`."""
    args = argv(pid)
    if not args or SERVER_CLASS not in args or exe_name(pid) != "java" or state(pid) in (None, "Z"):
        return False
    conf = str((config_file or workdir / "config.properties").resolve())
    tail = args[args.index(SERVER_CLASS) + 1 :]
    if not any(a == "-f" and i + 1 < len(tail) and tail[i + 1] == conf for i, a in enumerate(tail)):
        return False
    return cwd_of(pid) == workdir.resolve()


def is_worker_of(pid: int, frontend: int) -> bool:
    """Whether `pid` is a live TorchServe worker started by the frontend `frontend` (its child, running
    `ts/model_service_worker.py`)."""
    args = argv(pid) or []
    return bool(args) and ppid(pid) == frontend and any(a.endswith(WORKER_SCRIPT) for a in args[:4])


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
        if proc.name.isdigit() and ppid(int(proc.name)) == pid:
            out.append(int(proc.name))
    return out


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


def stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def state(pid: int) -> str | None:
    fields = stat_fields(pid)
    return fields[0] if fields else None


def ppid(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[1]) if fields else None


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # Zombies count as gone: they hold no port or memory and are reaped by their parent.
    return any(f[0] != "Z" for f in group_stats(pgid))
