"""The ONNX export's attention, SDPA against eager, through TorchServe: `python -m bench.probes.attention_export`.

Builds MiniLM's bucketed onnxruntime archive twice into a folder under .tmp/, its graph exported from SDPA
attention (transformers' default) and from eager attention (no IsNaN/Where mask subgraph; what ships,
`onnx_engine.ONNX_ATTENTION`). Each must pass the handler's 1e-5
start-up check against torch to register. Both are then loaded closed loop on one TorchServe in interleaved
rounds, and the script prints each round's req/s and the eager/SDPA ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from bench.harness import load
from bench.inputs.workloads import make_workload
from bucketing.engines import onnx_engine as engines
from model_store import build
from model_store.archives import ROOT
from tsctl import Endpoints, TorchServe

NAMES = ("minilm-sdpa", "minilm-eager")


@contextmanager
def export_attention(attention: str) -> Iterator[None]:
    """Archives built while this lasts export their ONNX graph from this attention implementation."""
    shipped = engines.ONNX_ATTENTION
    engines.ONNX_ATTENTION = attention
    try:
        yield
    finally:
        engines.ONNX_ATTENTION = shipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=12.0, help="seconds of load per archive and round")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    folder = ROOT / ".tmp" / "attention-export"
    shutil.rmtree(folder, ignore_errors=True)
    store = folder / "store"
    for name, attention in zip(NAMES, ("sdpa", "eager")):
        with export_attention(attention):
            build.build_archives(store, build.ArchiveSpec(strategies=("bucketed",), engine="onnxruntime", prefix=name))
    bodies = [json.dumps({"text": t}).encode() for t in make_workload("longtail", 2000, 0).texts]
    server = TorchServe(folder / "ts", Endpoints.free(), model_store=store)
    server.start()
    try:
        for name in NAMES:
            server.client.register(f"{name}-bucketed.mar", name, args.batch_size, 10, 2)
        rates: dict[str, list[float]] = {name: [] for name in NAMES}
        for round_ in range(args.rounds):
            for name in NAMES if round_ % 2 == 0 else NAMES[::-1]:
                url = f"{server.endpoints.inference}/predictions/{name}"

                def headers() -> dict[str, str]:
                    return server.client.keys.headers("inference")

                quiet = load.Progress(name, args.duration, False)
                asyncio.run(load.closed_loop(url, bodies[::-1], headers, 32, 3.0, 20000, quiet))  # warm-up
                result = asyncio.run(load.closed_loop(url, bodies, headers, 32, args.duration, 20000, quiet))
                rates[name].append(sum(s.status == 200 for s in result.samples) / result.wall_s)
                print(f"round {round_ + 1} {name}: {rates[name][-1]:.1f} req/s", flush=True)
        ratios = [e / s for s, e in zip(rates[NAMES[0]], rates[NAMES[1]])]
        print("eager / sdpa per round: " + " ".join(f"{r:.3f}" for r in ratios))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
