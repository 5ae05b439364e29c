"""tsctl's signal deferral: a signal sent during a deferred block waits for its end, whichever thread of the process
the kernel hands it to (a second Ctrl-C during `tsctl stop` must not leave TorchServe running)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tsctl.signals import deferred_signals


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_waits_for_the_block_whichever_thread_receives_it(signum):
    """Another thread that blocks nothing (as OpenBLAS's does) is where the kernel sends a signal the main thread
    masks: the block still finishes before the signal acts."""
    done = threading.Event()
    bystander = threading.Thread(target=done.wait)
    bystander.start()
    steps = []
    try:
        with pytest.raises(KeyboardInterrupt):  # SIGINT's own; the suite's conftest turns SIGTERM into it too
            with deferred_signals():
                os.kill(os.getpid(), signum)
                os.kill(os.getpid(), signum)  # a second Ctrl-C: held too, and raised once
                for _ in range(20):
                    time.sleep(0.01)  # where a handler would run, were it not held
                steps.append("finished")
    finally:
        done.set()
        bystander.join()
    assert steps == ["finished"]


def test_handlers_are_restored_and_nothing_is_raised_without_a_signal():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with deferred_signals():
        pass
    assert {s: signal.getsignal(s) for s in before} == before


def test_off_the_main_thread_the_block_runs_as_it_is():
    ran = []

    def work():
        with deferred_signals():
            ran.append(threading.current_thread() is not threading.main_thread())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert ran == [True]
