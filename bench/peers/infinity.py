"""infinity (`infinity_emb v2`), a peer: one process, torch's threads on every core, its own batching."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bench.peers.kind import PEER_DTYPES, PeerKind, PeerSetup


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
