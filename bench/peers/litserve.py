"""LitServe, a peer: what a Python user writes instead of us (`servers/litserve_server.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.peers.kind import PEER_DTYPES, PeerKind, PeerSetup

SERVERS = Path(__file__).resolve().parent / "servers"  # server scripts a peer's venv python runs


@dataclass(frozen=True)
class LitServe(PeerKind):
    """What a Python user writes instead of us: a LitServe server (`servers/litserve_server.py`) whose API
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
