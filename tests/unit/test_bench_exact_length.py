"""Exact-length grouping's worker processes end on every path: a worker that dies, one that hangs, an interrupt."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from bench.exact_length import ExactLengthError, run_workers


def timed(index: int, barrier, out) -> None:
    barrier.wait(timeout=30)
    out.put(0.01 * (index + 1))


def dies_before_the_barrier(index: int, barrier, out) -> None:
    if index == 0:
        os._exit(3)
    barrier.wait(timeout=300)  # would wait 300 s for the sibling that died, if nothing ended it
    out.put(1.0)


def hangs(index: int, barrier, out) -> None:
    time.sleep(300)


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


@pytest.fixture
def started(monkeypatch):
    """The pids of every worker process run_workers starts."""
    import multiprocessing.context as mpc

    pids: list[int] = []
    original = mpc.SpawnProcess.start

    def start(self):
        original(self)
        pids.append(self.pid)

    monkeypatch.setattr(mpc.SpawnProcess, "start", start)
    return pids


def test_results_come_back_one_per_worker(started):
    assert sorted(run_workers(timed, [(0,), (1,)], timeout=60)) == [0.01, 0.02]
    assert len(started) == 2 and alive(started) == []


def test_a_worker_that_dies_is_an_error_and_its_siblings_are_ended(started):
    t = time.monotonic()
    with pytest.raises(ExactLengthError, match="exact-length worker 0 exited with 3 before its result"):
        run_workers(dies_before_the_barrier, [(0,), (1,)], timeout=120)
    assert time.monotonic() - t < 60 and len(started) == 2 and alive(started) == []


def test_workers_that_hang_are_ended_at_the_timeout(started):
    with pytest.raises(ExactLengthError, match="no result within 3 s"):
        run_workers(hangs, [(0,), (1,)], timeout=3)
    assert alive(started) == []


def test_an_interrupt_ends_every_worker(started):
    timer = threading.Timer(3.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_workers(hangs, [(0,), (1,)], timeout=120)
    finally:
        timer.cancel()
    assert len(started) == 2 and alive(started) == []
