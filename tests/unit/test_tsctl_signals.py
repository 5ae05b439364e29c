"""tsctl's signal deferral: a signal sent during a deferred block waits for its end, whichever thread of the process
the kernel hands it to (a second Ctrl-C during `tsctl stop` must not leave TorchServe running).

Each case runs in a fresh interpreter, as `python -m tsctl` does: it signals its own process, and the suite's process
holds threads and signal handlers of whatever other tests loaded (a full run segfaulted there, not in tsctl)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import os, signal, threading, time
from tsctl.signals import deferred_signals
"""


def run(body: str) -> str:
    """`body` run by a fresh Python (after PRELUDE); what it printed; it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_a_signal_waits_for_the_block_whichever_thread_receives_it(signum):
    """Another thread that blocks nothing (as OpenBLAS's does) is where the kernel sends a signal the main thread
    masks: the block still finishes before the signal acts, and a second signal is raised once."""
    out = run(
        f"""
        signum = signal.{signum}
        raised = []
        signal.signal(signal.SIGTERM, lambda s, f: raised.append(s))  # as Ctrl-C's KeyboardInterrupt, counted
        signal.signal(signal.SIGINT, lambda s, f: raised.append(s))
        done = threading.Event()
        bystander = threading.Thread(target=done.wait)
        bystander.start()
        steps = []
        with deferred_signals():
            os.kill(os.getpid(), signum)
            os.kill(os.getpid(), signum)  # a second Ctrl-C: held too, and raised once
            for _ in range(20):
                time.sleep(0.01)  # where a handler would run, were it not held
            steps.append(("finished", len(raised)))
        time.sleep(0.05)
        done.set()
        bystander.join()
        print(steps, raised == [signum])
        """
    )
    assert out.strip() == "[('finished', 0)] True"


def test_handlers_are_restored_and_nothing_is_raised_without_a_signal():
    out = run(
        """
        held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        before = {s: signal.getsignal(s) for s in held}
        with deferred_signals():
            pass
        print({s: signal.getsignal(s) for s in held} == before)
        """
    )
    assert out.strip() == "True"


def test_off_the_main_thread_the_block_runs_as_it_is():
    out = run(
        """
        ran = []

        def work():
            with deferred_signals():
                ran.append(threading.current_thread() is not threading.main_thread())

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        print(ran)
        """
    )
    assert out.strip() == "[True]"
