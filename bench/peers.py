"""Real peers measured in the same run as our handler: `--peer infinity`, `--peer litserve`.

`PEERS` is the registry of peer kinds (`PeerKind`): each owns how it is installed (its pinned requirements, in
stages: torch first, so the local CPU wheel is the one kept), its command line, its layout, the precisions it runs,
the route it answers and the body it takes. A peer runs in its own venv, as its own process group on a loopback
port, and is stopped with its whole group however the run ends. Both kinds answer OpenAI-style embeddings; the
bench sends them the same texts and load as our handler, and checks their answers against our float32 reference.
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
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from bucketing.engines import precision
from model_store.archives import ROOT, SERVED
from tsctl import free_ports, group_cpu_seconds

from .configuration import Configuration
from .job import Job

PEER_ROOT = ROOT / ".tmp" / "peers"
REQUIREMENTS = Path(__file__).resolve().parent / "peer-requirements"
SERVERS = Path(__file__).resolve().parent / "peer_servers"  # server scripts a peer's venv python runs
PEER_DTYPES = ("float32", "bfloat16")  # what a peer may be asked to run on the CPU (bfloat16 where native)


class PeerUnavailable(RuntimeError):
    """The peer cannot run here; the message says why in one line (the run goes on without it)."""


@dataclass(frozen=True)
class PeerSetup:
    """What one start of a peer is given: its batching, precision and layout. Loads that share them share a
    start."""

    batch_size: int
    dtype: str = "float32"
    workers: int = 1  # processes that run the model
    threads: int = 1  # torch threads in each
    batch_delay_ms: int = 10  # how long a batch may wait to fill, where the peer has such a setting

    @classmethod
    def of(cls, config: Configuration) -> PeerSetup:
        return cls(config.batch_size, config.dtype or "float32", config.workers, config.threads, config.max_batch_delay)


@dataclass(frozen=True)
class PeerKind:
    """One kind of peer: how it is installed, started, asked and read. A kind's own class says its command line
    (`command`) and its layout (`layout`); the rest has defaults an OpenAI-style embeddings server meets."""

    name: str
    stages: tuple[str, ...]  # requirement files under bench/peer-requirements/, installed in this order
    served_name: str = "minilm"
    route: str = "/embeddings"  # where the embeddings are posted
    health_route: str = "/health"  # answers 200 once the peer can serve
    dtypes: tuple[str, ...] = ("float32",)  # the precisions it can be started in
    engine: str = "torch"  # what runs its model (the report's `engine`)
    batching: str = ""  # how it batches, for the report's block

    def command(self, python: Path, model_dir: Path, port: int, setup: PeerSetup) -> list[str]:
        """The server's command line."""
        raise NotImplementedError(f"{self.name}: no command line")

    def layout(self, workers: int, threads: int) -> tuple[int, int]:
        """Its processes and threads, given our configuration's workers and threads (the same cores)."""
        return workers, threads

    def env(self) -> dict[str, str]:
        """Environment added to ours: offline (the model is a local folder), no usage reports."""
        return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    def body(self, text: str) -> bytes:
        """One text as a request body (OpenAI's embeddings body)."""
        return json.dumps({"model": self.served_name, "input": text}).encode()

    def embedding(self, answer: Any) -> list[float]:
        """The embedding in its answer to one text (OpenAI's embeddings answer)."""
        return [float(x) for x in answer["data"][0]["embedding"]]

    def refused(self, dtype: str, cpuinfo: str, flag: str = "--peer-dtypes") -> str | None:
        """Why it cannot run `dtype` here, in one line that names the `flag` that asked (None: it can): a dtype
        it lacks, or bfloat16 on a CPU that does not multiply it natively."""
        if dtype not in self.dtypes:
            return f"{flag} {dtype}: {self.name} runs {', '.join(self.dtypes)}"
        if dtype == "bfloat16" and precision.native_bf16(cpuinfo) is None:
            return (
                f"{flag} {dtype}: this CPU has no native bfloat16 (neither amx_bf16 nor avx512_bf16 in "
                f"/proc/cpuinfo): {self.name} would emulate it, slower than float32"
            )
        return None

    def config(self, ours: Configuration, dtype: str) -> Configuration:
        """The configuration it is measured in on one of our loads: our batch size, delay and load, its layout
        on the same cores, `dtype` (None for float32, as ours)."""
        workers, threads = self.layout(ours.workers, ours.threads)
        return replace(
            ours,
            strategy=self.name,
            peer=self.name,
            engine=None,
            schedule=None,
            dtype=None if dtype == "float32" else dtype,
            workers=workers,
            threads=threads,
            label="",
        )


@dataclass(frozen=True)
class Infinity(PeerKind):
    """infinity (`infinity_emb v2`): one process, torch's threads on every core, its own batching."""

    name: str = "infinity"
    stages: tuple[str, ...] = ("infinity-1-torch.txt", "infinity-2-server.txt")
    dtypes: tuple[str, ...] = PEER_DTYPES
    batching: str = "its own queue, batches of up to the batch size, no delay setting"

    def command(self, python: Path, model_dir: Path, port: int, setup: PeerSetup) -> list[str]:
        """infinity_emb v2: torch engine on the CPU, our batch size, the dtype asked (`--dtype bfloat16` loads
        the model in bfloat16; float32 is its CPU default, said explicitly)."""
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
            "--dtype",
            setup.dtype,
            "--batch-size",
            str(setup.batch_size),
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

    def layout(self, workers: int, threads: int) -> tuple[int, int]:
        return 1, os.cpu_count() or 1  # one process; torch's threads default to every core

    def env(self) -> dict[str, str]:
        return {**super().env(), "INFINITY_ANONYMOUS_USAGE_STATS": "0"}


@dataclass(frozen=True)
class LitServe(PeerKind):
    """What a Python user writes instead of us: a LitServe server (`peer_servers/litserve_server.py`) whose API
    loads `SentenceTransformer(model_dir)` and calls `encode()` on each batch LitServe forms, behind LitServe's
    OpenAI embeddings spec. Our layout: as many worker processes as our workers, each with our threads."""

    name: str = "litserve"
    stages: tuple[str, ...] = ("litserve-1-torch.txt", "litserve-2-server.txt")
    route: str = "/v1/embeddings"  # OpenAIEmbeddingSpec's route
    dtypes: tuple[str, ...] = PEER_DTYPES
    batching: str = "LitServe's dynamic batching (max_batch_size, batch_timeout), then one encode() a batch"
    timeout_s: int = 120  # a request's time limit (TorchServe's responseTimeout in our config)
    api_servers: int = 1  # HTTP server processes (ours: one TorchServe frontend)

    def command(self, python: Path, model_dir: Path, port: int, setup: PeerSetup) -> list[str]:
        return [
            str(python),
            str(SERVERS / "litserve_server.py"),
            "--model-dir",
            str(model_dir),
            "--port",
            str(port),
            "--batch-size",
            str(setup.batch_size),
            "--batch-timeout",
            f"{setup.batch_delay_ms / 1000:g}",
            "--workers",
            str(setup.workers),
            "--threads",
            str(setup.threads),
            "--dtype",
            setup.dtype,
            "--timeout",
            str(self.timeout_s),
            "--api-servers",
            str(self.api_servers),
        ]


PEERS: dict[str, PeerKind] = {kind.name: kind for kind in (Infinity(), LitServe())}


def peer_configs(configs: Sequence[Configuration], peer: str, dtypes: Sequence[str] = ()) -> list[Configuration]:
    """The peer on each distinct load of the plan, in each of `dtypes` (none given: each load's own dtype, so a
    peer row has ours of the same precision beside it)."""
    kind = PEERS[peer]
    loads = [kind.config(c, dtype) for c in configs if c.peer is None for dtype in (dtypes or [c.dtype or "float32"])]
    return list(dict.fromkeys(loads))


def venv(kind: PeerKind, root: Path = PEER_ROOT, progress: bool = True) -> Path:
    """The peer's venv python, created and installed on first use (a stamp records the requirements it has)."""
    folder = root / kind.name
    python = folder / "bin" / "python"
    wanted = "\n".join((REQUIREMENTS / s).read_text() for s in kind.stages)
    stamp = folder / ".installed"
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    print(f"{kind.name}: creating its venv in {folder} (first use; a few minutes) ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True, capture_output=True)
        for i, stage in enumerate(kind.stages, 1):
            print(f"  [{i}/{len(kind.stages)}] pip install -r bench/peer-requirements/{stage}", flush=True)
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS / stage)],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                last = [ln for ln in done.stderr.strip().splitlines() if ln.strip()][-1:] or ["(no message)"]
                raise PeerUnavailable(f"{kind.name}: installing {stage} failed: {last[0][:200]}")
    except (OSError, subprocess.CalledProcessError) as e:
        raise PeerUnavailable(f"{kind.name}: cannot create its venv: {e}") from None
    stamp.write_text(wanted)
    return python


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
