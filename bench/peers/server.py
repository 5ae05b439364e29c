"""One running peer as a target (`PeerServer`): its own process group on a loopback port, stopped with its whole
group however the run ends; its answers spot-checked against our float32 reference (`spot_check`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from bench.inputs.job import Job
from bench.inputs.references import cosine, reference_embeddings
from bench.peers.kind import PeerKind, PeerSetup, PeerUnavailable
from tsctl import free_ports, group_cpu_seconds


class PeerServer:
    """One running peer as a target (`targets.Target`): its process group, URL and CPU use; started on entry,
    its whole group stopped on exit."""

    device = "cpu"
    SPOT_TEXTS = 8  # texts, spread over the load's lengths, its answers are checked on

    def __init__(self, kind: PeerKind, python: Path, model_dir: Path, setup: PeerSetup, logs: Path) -> None:
        self.kind, self.python, self.model_dir, self.setup = kind, python, model_dir, setup
        self.port = free_ports(1)[0]
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = logs / f"{kind.name}-bs{setup.batch_size}-{setup.dtype}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._cosine: float | None = None

    @property
    def url(self) -> str:
        return f"{self.base}{self.kind.route}"

    @property
    def engine(self) -> str:
        return self.kind.engine

    def command(self) -> list[str]:
        return self.kind.command(self.python, self.model_dir, self.port, self.setup)

    def bodies(self, job: Job) -> list[bytes]:
        return [self.kind.body(t) for t in job.load.workload.texts]

    def headers(self) -> dict[str, str]:
        return {}

    def counters(self) -> dict[str, float]:
        return {}

    def peak_rss_mb(self) -> float | None:
        return None

    def fidelity(self, job: Job) -> float | None:
        """The lowest cosine of its answers against our float32 batch-of-one reference, spot-checked once per
        start on `SPOT_TEXTS` of the first job's texts (in bfloat16: how far its precision moves the answers)."""
        if self._cosine is None:
            texts, tokens = job.load.workload.texts, job.load.tokens
            by_length = sorted(range(len(texts)), key=lambda i: tokens[i])
            last, n = len(by_length) - 1, self.SPOT_TEXTS
            picks = [texts[by_length[k * last // (n - 1)]] for k in range(n)]
            self._cosine = spot_check(self, picks, self.model_dir)
            print(
                f"  answers ({self.setup.dtype}): lowest cosine {self._cosine:.6f} against our float32 "
                f"batch-of-one reference ({n} texts)"
            )
        return self._cosine

    def start(self, timeout: float = 300.0) -> PeerServer:
        env = {**os.environ, **self.kind.env()}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=self.log_path.parent,
            )
        try:  # whatever stops the wait (Ctrl-C, SIGTERM, an exit, a time-out), the peer's group is ended
            self._wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout: float) -> None:
        assert self.proc is not None
        name, route = self.kind.name, self.kind.health_route
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PeerUnavailable(f"{name} exited with {self.proc.returncode}: {self._last_log_line()}")
            try:
                with urllib.request.urlopen(f"{self.base}{route}", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise PeerUnavailable(f"{name} did not answer {route} in {timeout:.0f} s; see {self.log_path}")

    def _last_log_line(self) -> str:
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return (lines[-1] if lines else "(no output)")[:200] + f" (log: {self.log_path})"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Each text's embedding, one request per text (the peer's answer to that text alone)."""
        out = []
        for text in texts:
            req = urllib.request.Request(
                self.url, data=self.kind.body(text), headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                out.append(self.kind.embedding(json.loads(r.read())))
        return out

    def cpu(self) -> float | None:
        return group_cpu_seconds(self.proc.pid) if self.proc and self.proc.poll() is None else None

    def stop(self, timeout: float = 20.0) -> None:
        """End the peer's whole process group: SIGTERM, then SIGKILL after `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # its own session: the group id is its pid
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass
        try:  # children that outlived the leader
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __enter__(self) -> PeerServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def spot_check(peer: PeerServer, texts: Sequence[str], model_dir: Path) -> float:
    """The lowest cosine between the peer's embedding and our batch-of-one reference over `texts`."""
    theirs = peer.embed(texts)
    ours = reference_embeddings(texts, model_dir)
    return min(cosine(a, b) for a, b in zip(theirs, ours, strict=True))
