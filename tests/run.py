"""`make test`: the end-to-end tests in the foreground, the unit and handler tests beside them at the lowest priority.

The end-to-end tests wait on servers about a third of the time and some of them measure a server's capacity; the
unit and handler tests are pure CPU and time nothing. So the second run is `nice`d: it takes what the first leaves
idle and never competes with a server the first is timing. Its output is kept and printed after the first's; the
exit status is the first failure's (0 when both passed). Arguments go to both runs (`python -m tests.run -x`).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
E2E = ["tests/e2e"]
BESIDE = ["tests/unit", "tests/handler"]
NICE = 19


def pytest(paths: Sequence[str], extra: Sequence[str], durations: int) -> list[str]:
    return [sys.executable, "-m", "pytest", *paths, f"--durations={durations}", *extra]


def main(argv: Sequence[str] | None = None) -> int:
    extra = list(sys.argv[1:] if argv is None else argv)
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        """SIGTERM: to each run (each stops its servers and ends). A ^C reaches them from the terminal itself."""
        if signum == signal.SIGTERM:
            for child in children:
                if child.poll() is None:
                    child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    statuses: list[int] = []
    with tempfile.TemporaryDirectory(prefix="bucketing-tests-") as scratch:
        log_path = Path(scratch) / "unit-and-handler.log"
        try:
            with open(log_path, "wb") as log:
                children.append(
                    subprocess.Popen(
                        ["nice", "-n", str(NICE), *pytest(BESIDE, extra, 10)],
                        cwd=ROOT,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )
            print(f"tests/unit and tests/handler run beside at nice {NICE}; their output follows", flush=True)
            children.insert(0, subprocess.Popen(pytest(E2E, extra, 25), cwd=ROOT))
            statuses = [child.wait() for child in children]
        finally:
            for child in children:  # only on an exception of our own: end what is left, then reap it
                if child.poll() is None:
                    child.terminate()
                    try:
                        child.wait(30)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait()
            for s, handler in previous.items():
                signal.signal(s, handler)
        print(f"\n======== tests/unit and tests/handler (exit {statuses[1]}) ========", flush=True)
        sys.stdout.buffer.write(log_path.read_bytes())
        sys.stdout.flush()
    return next((s for s in statuses if s != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
