"""What a long document costs under each way of answering it: truncate, chunk (windows pooled into one vector) and
late chunking (one pass, one vector per sentence), in process, on the real MiniLM.

`python -m bench.probes.long_texts [--docs 8] [--min-tokens 1000] [--max-tokens 8000] [--engine onnxruntime]`: `--docs`
documents of sentences (`workloads.text_of`), token counts spread evenly from `--min-tokens` to `--max-tokens`,
sent as one request per mode to a worker (`Pipeline.serve`, what a handler call runs; best of `--repeat`); prints a
markdown table: documents/s, the tokens the model ran per document, passes, vectors answered, and the time against
truncate's. MiniLM reads 256 tokens: late chunking answers the sentences of each document's first 256 tokens only
(it is for long-context models); chunk reads the whole document (up to `max_chunks` windows: 8,128 tokens).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench.inputs.workloads import text_of

MODES: dict[str, dict[str, Any]] = {
    "truncate": {"on_overflow": "truncate"},
    "chunk": {"on_overflow": "chunk"},
    "late (sentences)": {"chunking": "late", "spans": "sentences"},
}


@dataclass(frozen=True)
class Row:
    mode: str
    seconds: float
    docs: int
    tokens: int  # rows x real tokens the model ran
    passes: int
    vectors: int

    def cells(self, baseline: float) -> list[str]:
        return [
            self.mode,
            f"{self.docs / self.seconds:.2f}",
            f"{self.tokens / self.docs:,.0f}",
            str(self.passes),
            str(self.vectors),
            f"{self.seconds / baseline:.2f}x",
        ]


def documents(count: int, low: int, high: int, seed: int = 0) -> list[str]:
    """`count` documents of `low` to `high` tokens (MiniLM's), evenly spread."""
    rng = random.Random(seed)
    step = (high - low) / max(count - 1, 1)
    return [text_of(int(low + k * step), rng) for k in range(count)]


def measure(pipeline: Any, docs: list[str], mode: str, repeat: int) -> Row:
    """The best of `repeat` worker calls answering all documents in one request of this mode."""
    from bucketing.protocols.base import Meta

    best, answer, stats = float("inf"), None, None
    for _ in range(repeat):
        start = time.perf_counter()
        row = {"body": {"texts": docs, **MODES[mode]}}
        (reply,), figures = pipeline.serve([row], [Meta("application/json")], "minilm")
        elapsed = time.perf_counter() - start
        if reply.status != 200:
            raise SystemExit(f"{mode}: {reply.body[:300]!r}")
        if elapsed < best:
            best, answer, stats = elapsed, json.loads(reply.body), figures
    assert answer is not None and stats is not None
    vectors = sum(len(a["chunks"]) if isinstance(a.get("chunks"), list) else 1 for a in answer)
    return Row(mode, best, len(docs), stats.real_tokens, stats.sub_batches, vectors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--min-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=8000)
    parser.add_argument("--engine", default="onnxruntime", choices=("torch", "onnxruntime"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    import tempfile
    from pathlib import Path

    from bucketing_handler import BucketingHandler
    from model_store.archives import engine_model_dir, minilm_dir
    from tsctl.inprocess import LocalContext

    with tempfile.TemporaryDirectory() as tmp:
        folder = engine_model_dir(minilm_dir(), args.engine, "embedding", Path(tmp) / "model")
        context = LocalContext({"model_path": str(folder), "engine": args.engine}, model_name="minilm")
        handler = BucketingHandler()
        handler.initialize(context)
        docs = documents(args.docs, args.min_tokens, args.max_tokens)
        rows = [measure(handler.pipeline, docs, mode, args.repeat) for mode in MODES]
    lines = [
        "| mode | documents/s | tokens run per document | passes | vectors | time vs truncate |",
        "|---|---:|---:|---:|---:|---:|",
        *("| " + " | ".join(row.cells(rows[0].seconds)) + " |" for row in rows),
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
