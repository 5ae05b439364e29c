"""What a peer kind is (`PeerKind`): how it is installed (its pinned requirements, in stages: torch first, so the
local CPU wheel is the one kept; `venv`), its command line, its layout, the precisions it runs, the route it answers
and the body it takes; and what one start of a peer is given (`PeerSetup`)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.inputs.configuration import TORCHSERVE, Configuration
from bucketing.engine_registry import is_reduced
from bucketing.engines import precision
from model_store.archives import ROOT

PEER_ROOT = ROOT / ".tmp" / "peers"
REQUIREMENTS = Path(__file__).resolve().parent / "requirements"
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
    stages: tuple[str, ...]  # requirement files under bench/peers/requirements/, installed in this order
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
        if is_reduced(dtype) and precision.native_bf16(cpuinfo) is None:
            return (
                f"{flag} {dtype}: this CPU has no native bfloat16 (neither amx_bf16 nor avx512_bf16 in "
                f"/proc/cpuinfo): {self.name} would emulate it, slower than float32"
            )
        return None

    def config(self, ours: Configuration, dtype: str) -> Configuration:
        """The configuration it is measured in on one of our loads: our batch size, delay and load, its layout
        on the same cores, `dtype` (None for float32, as ours); the same whichever host ours ran on."""
        workers, threads = self.layout(ours.workers, ours.threads)
        return replace(
            ours,
            strategy=self.name,
            peer=self.name,
            engine=None,
            schedule=None,
            dtype=dtype if is_reduced(dtype) else None,
            workers=workers,
            threads=threads,
            host=TORCHSERVE,  # its own server, whichever host ours ran on: one peer row per load
            label="",
        )


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
            print(f"  [{i}/{len(kind.stages)}] pip install -r bench/peers/requirements/{stage}", flush=True)
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
