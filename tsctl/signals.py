"""Signals sent and received safely: a process held by a pidfd and checked before it is signalled, and the
handling of SIGINT/SIGTERM/SIGHUP around work that must finish or must clean up."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

from . import identity


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
            state = identity.state(self.pid)
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


HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends (then each is raised again, once, in the order it came).

    Held where Python handles them, not by a thread's signal mask: the kernel hands a signal sent to the process to
    any thread that does not block it (OpenBLAS starts one in `python -m tsctl`), and Python runs every handler in
    the main thread, so a mask on the calling thread alone let a second Ctrl-C through. Off the main thread no
    handler can interrupt the block: it runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        if signum not in pending:
            pending.append(signum)

    previous = {s: signal.signal(s, hold) for s in HELD}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for signum in pending:
            signal.raise_signal(signum)


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
