"""Real peers measured in the same run as our handler: `--peer infinity`.

A peer runs in its own venv (created on first use from its pinned requirements, in stages: torch first, so the
local CPU wheel is the one kept), as its own process group on a loopback port, and is stopped with its whole
group however the run ends. It answers OpenAI-style `/embeddings`; the bench sends it the same texts and load.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib as urllib  # exported: the peer tests patch urllib.request.urlopen through this module
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from model_store.archives import ROOT, SERVED
from tsctl import free_ports, group_cpu_seconds

from .job import Job

PEER_ROOT = ROOT / ".tmp" / "peers"
REQUIREMENTS = Path(__file__).resolve().parent / "peer-requirements"


class PeerUnavailable(RuntimeError):
    """The peer cannot run here; the message says why in one line (the run goes on without it)."""


@dataclass(frozen=True)
class PeerSpec:
    """How to install and start one peer."""

    name: str
    stages: tuple[str, ...]  # requirement files under bench/peer-requirements/, installed in this order
    served_name: str = "minilm"

    def command(self, python: Path, model_dir: Path, port: int, batch_size: int) -> list[str]:
        """The server's command line (infinity_emb v2: torch engine on the CPU, our batch size)."""
        return [
            str(python.parent / "infinity_emb"),
            "v2",
            "--model-id",
            str(model_dir),
            "--served-model-name",
            self.served_name,
            "--engine",
            "torch",
            "--device",
            "cpu",
            "--batch-size",
            str(batch_size),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--url-prefix",
            "",
            "--no-model-warmup",  # the bench warms every server up the same way
            "--log-level",
            "warning",  # no log line per request
        ]

    def body(self, text: str) -> bytes:
        return json.dumps({"model": self.served_name, "input": text}).encode()


PEERS = {"infinity": PeerSpec("infinity", ("infinity-1-torch.txt", "infinity-2-server.txt"))}


def venv(spec: PeerSpec, root: Path = PEER_ROOT, progress: bool = True) -> Path:
    """The peer's venv python, created and installed on first use (a stamp records the requirements it has)."""
    folder = root / spec.name
    python = folder / "bin" / "python"
    wanted = "\n".join((REQUIREMENTS / s).read_text() for s in spec.stages)
    stamp = folder / ".installed"
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    print(f"{spec.name}: creating its venv in {folder} (first use; a few minutes) ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True, capture_output=True)
        for i, stage in enumerate(spec.stages, 1):
            print(f"  [{i}/{len(spec.stages)}] pip install -r bench/peer-requirements/{stage}", flush=True)
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS / stage)],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                last = [ln for ln in done.stderr.strip().splitlines() if ln.strip()][-1:] or ["(no message)"]
                raise PeerUnavailable(f"{spec.name}: installing {stage} failed: {last[0][:200]}")
    except (OSError, subprocess.CalledProcessError) as e:
        raise PeerUnavailable(f"{spec.name}: cannot create its venv: {e}") from None
    stamp.write_text(wanted)
    return python


class PeerServer:
    """One running peer as a target (`targets.Target`): its process group, URL and CPU use; started on entry,
    its whole group stopped on exit."""

    engine = "torch"
    device = "cpu"
    SPOT_TEXTS = 8  # texts, spread over the load's lengths, its answers are checked on

    def __init__(self, spec: PeerSpec, python: Path, model_dir: Path, batch_size: int, logs: Path) -> None:
        self.spec, self.python, self.model_dir, self.batch_size = spec, python, model_dir, batch_size
        self.port = free_ports(1)[0]
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = logs / f"{spec.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._cosine: float | None = None

    @property
    def url(self) -> str:
        return f"{self.base}/embeddings"

    def bodies(self, job: Job) -> list[bytes]:
        return [self.spec.body(t) for t in job.load.workload.texts]

    def headers(self) -> dict[str, str]:
        return {}

    def counters(self) -> dict[str, float]:
        return {}

    def peak_rss_mb(self) -> float | None:
        return None

    def fidelity(self, job: Job) -> float | None:
        """The lowest cosine of its answers against our batch-of-one reference, spot-checked once per start on
        `SPOT_TEXTS` of the first job's texts."""
        if self._cosine is None:
            texts, tokens = job.load.workload.texts, job.load.tokens
            by_length = sorted(range(len(texts)), key=lambda i: tokens[i])
            last, n = len(by_length) - 1, self.SPOT_TEXTS
            picks = [texts[by_length[k * last // (n - 1)]] for k in range(n)]
            self._cosine = spot_check(self, picks, self.model_dir)
            print(f"  answers: lowest cosine {self._cosine:.6f} against our batch-of-one reference ({n} texts)")
        return self._cosine

    def start(self, timeout: float = 300.0) -> PeerServer:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.spec.command(self.python, self.model_dir, self.port, self.batch_size),
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PeerUnavailable(f"{self.spec.name} exited with {self.proc.returncode}: {self._last_log_line()}")
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise PeerUnavailable(f"{self.spec.name} did not answer /health in {timeout:.0f} s; see {self.log_path}")

    def _last_log_line(self) -> str:
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return (lines[-1] if lines else "(no output)")[:200] + f" (log: {self.log_path})"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Each text's embedding, one request per text (the peer's answer to that text alone)."""
        out = []
        for text in texts:
            req = urllib.request.Request(
                self.url, data=self.spec.body(text), headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                out.append(json.loads(r.read())["data"][0]["embedding"])
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


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = sum(x * x for x in a) ** 0.5
    nb = sum(y * y for y in b) ** 0.5
    return dot / (na * nb) if na and nb else 0.0


def reference_embeddings(
    texts: Sequence[str], model_dir: Path, max_length: int = SERVED.max_length
) -> list[list[float]]:
    """Our handler's answer to each text served alone (torch engine, batch of one), in this process."""
    from bucketing import worker
    from bucketing.config import HandlerConfig
    from bucketing.kinds.task import Rows
    from bucketing.model.tokenizer import collate

    config = HandlerConfig(engine="torch", torchscript=False, max_length=max_length)
    model = worker.load(config, str(model_dir))  # the handler's task and tokenizer, as a worker opens them
    task, tokenizer = model.task, model.tokenizer
    out = []
    for encoded in tokenizer.encode(list(texts)):
        ids, mask = collate([encoded.ids], len(encoded.ids), 0)
        out.append([float(x) for x in task.forward(Rows(ids, mask))[0]])
    return out


def spot_check(peer: PeerServer, texts: Sequence[str], model_dir: Path) -> float:
    """The lowest cosine between the peer's embedding and our batch-of-one reference over `texts`."""
    theirs = peer.embed(texts)
    ours = reference_embeddings(texts, model_dir)
    return min(cosine(a, b) for a, b in zip(theirs, ours, strict=True))
