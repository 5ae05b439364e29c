"""The litserve peer (`python bench/compare.py --peer litserve`): what a Python user writes to serve a text encoder
with LitServe instead of us. Its venv's python runs it (bench/peers/requirements/litserve-*.txt); the bench never
imports it, and it imports nothing of ours: litserve, sentence-transformers and torch only.

    python litserve_server.py --model-dir DIR --port 8000 --batch-size 16 --batch-timeout 0.01 \\
        --workers 2 --threads 1 --dtype float32

Each of `--workers` worker processes (LitServe's `workers_per_device` on its one CPU device) sets `--threads` torch
threads, loads `SentenceTransformer(model_dir)` (with `model_kwargs={"torch_dtype": torch.bfloat16}` for `--dtype
bfloat16`) and calls `encode()` once on each batch LitServe hands it: up to `--batch-size` requests, waiting at
most `--batch-timeout` seconds for a batch to fill. `encode()` pads a batch to its longest text. It answers through
LitServe's OpenAI embeddings spec: POST /v1/embeddings with {"model": ..., "input": "one text"} (the spec refuses a
list of texts while batching is on), and GET /health answers 200 once every worker is ready.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import litserve as ls
import numpy as np
import torch
from sentence_transformers import SentenceTransformer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class Encoder(ls.LitAPI):  # type: ignore[misc]  # litserve ships no type information
    """One worker's model: a SentenceTransformer in the dtype asked, `encode()` on each batch."""

    def __init__(self, model_dir: str, dtype: str, threads: int, max_batch_size: int, batch_timeout: float) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, spec=ls.OpenAIEmbeddingSpec())
        self.model_dir, self.dtype, self.threads = model_dir, dtype, threads

    def setup(self, device: str) -> None:
        torch.set_num_threads(self.threads)
        self.model = SentenceTransformer(
            self.model_dir, device=device, model_kwargs={"torch_dtype": DTYPES[self.dtype]}
        )

    def predict(self, inputs: str | list[str]) -> np.ndarray[Any, Any]:
        """The batch's embeddings, one row a text (a batch of one request arrives as its text alone)."""
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        out: np.ndarray[Any, Any] = self.model.encode(texts, batch_size=len(texts), show_progress_bar=False)
        return out


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=16, help="LitAPI max_batch_size")
    p.add_argument("--batch-timeout", type=float, default=0.01, help="LitAPI batch_timeout, seconds")
    p.add_argument("--workers", type=int, default=2, help="LitServer workers_per_device (one CPU device)")
    p.add_argument("--threads", type=int, default=1, help="torch threads in each worker")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--timeout", type=float, default=120, help="a request's time limit, seconds")
    p.add_argument("--api-servers", type=int, default=1, help="HTTP server processes")
    return p.parse_args(argv)


def server(args: argparse.Namespace) -> Any:
    """The LitServer the arguments describe (not running yet)."""
    api = Encoder(args.model_dir, args.dtype, args.threads, args.batch_size, args.batch_timeout)
    return ls.LitServer(api, accelerator="cpu", workers_per_device=args.workers, timeout=args.timeout)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    server(args).run(
        host="127.0.0.1",
        port=args.port,
        num_api_servers=args.api_servers,
        log_level="warning",
        generate_client_file=False,  # it would write client.py into the working folder
    )


if __name__ == "__main__":  # LitServe spawns its workers: they import this module without running the server
    main()
