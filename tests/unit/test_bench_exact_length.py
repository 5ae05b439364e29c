"""Exact-length grouping's worker processes end on every path: a worker that dies, one that hangs, an interrupt."""

from __future__ import annotations

import os
import signal
import time

import pytest

from bench.harness.exact_length import ExactLengthError, run_workers


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


# A bench run interrupted (Ctrl-C): run in a process of its own, as the bench runs, so what this test process has
# loaded (native libraries' threads and signal handlers from other tests) is not in it.
INTERRUPTED = """
import multiprocessing.context as mpc, sys
from bench.harness.exact_length import run_workers
from tests.unit.test_bench_exact_length import hangs
original = mpc.SpawnProcess.start
def start(self):
    original(self)
    print(self.pid, flush=True)
mpc.SpawnProcess.start = start
try:
    run_workers(hangs, [(0,), (1,)], timeout=120)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(0)
sys.exit(1)
"""


def test_an_interrupt_ends_every_worker():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root / 'handler'}{os.pathsep}{root}"}
    child = subprocess.Popen([sys.executable, "-c", INTERRUPTED], cwd=root, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        pids = [int(child.stdout.readline()) for _ in range(2)]
        time.sleep(1.0)
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0 and "interrupted" in out
    assert alive(pids) == []
