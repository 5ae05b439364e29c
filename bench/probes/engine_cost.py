"""What a forward pass costs on each engine, in process: the fixed cost of a pass and the rate on real prose.

`python -m bench.probes.engine_cost [--threads 1] [--repeat 10] [--rounds 5] [--engines torch,onnxruntime,openvino]
[--model bert-base-random]`: MiniLM (the shipped model, max_length 256; or a bench model) opened as a worker
opens it (`load_engine`, start-up checks included) on each engine in float32, and in bfloat16 where the engine runs
it on this CPU (refused otherwise: the refusal line is printed); then, best of `--rounds` x `--repeat` (the engines
measured in turn each round), the fixed cost of one pass of 1 x 8 tokens, and the tokens a second on `TEXTS` (real
prose) sorted by length and run in sub-batches of 4, each padded to its own longest (as the bucketed planner pads).
Prints a markdown table. Short on purpose (about a minute): the machine may be shared.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from bench.inputs import models
from bench.inputs.engines import engine_kinds, engine_names, reference
from bench.probes.tokenize_cost import best_of
from bucketing.config import ConfigError, HandlerConfig
from bucketing.engines import Engine, load_engine, precision
from bucketing.model.encoded import collate
from bucketing.model.head import EngineError
from bucketing.model.tokenizer import Tokenizer
from model_store.archives import SERVED, engine_model_dir, minilm_dir

# Real prose: the probe set's prose, and each pair of its sentences joined (longer texts): 12 texts, 3 passes of 4.
TEXTS = precision.PROSE + tuple(f"{a} {b}" for a, b in zip(precision.PROSE[::2], precision.PROSE[1::2]))
ROWS = 4  # texts a sub-batch
FIXED = (1, 8)  # rows x tokens of the pass whose time is the fixed cost


def passes(tokenizer: Tokenizer, texts: tuple[str, ...]) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """The texts sorted by length in sub-batches of `ROWS`, each padded to its longest; and their real tokens."""
    rows = sorted((e.ids for e in tokenizer.encode(list(texts))), key=len)
    groups = [rows[s : s + ROWS] for s in range(0, len(rows), ROWS)]
    batches = [collate(group, max(map(len, group)), tokenizer.pad_id) for group in groups]
    return batches, sum(len(r) for r in rows)


def timed(
    run: Engine, fixed: tuple[np.ndarray, np.ndarray], batches: list[tuple[np.ndarray, np.ndarray]], repeat: int
) -> tuple[float, float]:
    """Seconds of the fixed pass, and of all the sorted passes, each best of `repeat`."""
    run(*fixed)  # once untimed: first-call costs are not a pass's
    return best_of(lambda: run(*fixed), repeat), best_of(lambda: [run(i, m) for i, m in batches], repeat)


class Opened(NamedTuple):
    """An engine opened as a worker opens it, and the model folder it was opened from (a handler opens it again)."""

    engine: str
    dtype: str
    run: Engine
    folder: str


def open_engines(
    engines: list[str], threads: int, source: Path, tmp: Path
) -> tuple[list[Opened], list[tuple[str, str, str]]]:
    """Each engine in each dtype it runs on this CPU, opened over `source` (the graph engines over one export in
    `tmp`); and each refused (engine, dtype) with the first line of its refusal."""
    opened: list[Opened] = []
    refused: list[tuple[str, str, str]] = []
    folders: dict[tuple[str, ...], Path] = {}  # by the files an engine reads: one export for the graph engines
    for engine in engines:
        kind = engine_kinds()[engine]
        if kind.files and kind.files not in folders:
            graph = tmp / ("graph" if not folders else f"graph-{len(folders)}")
            folders[kind.files] = engine_model_dir(source, engine, "embedding", graph)
        folder = str(folders[kind.files] if kind.files else source)
        for dtype in (d for d in kind.dtypes if d in precision.CPU_DTYPES):
            config = HandlerConfig(engine=kind.name, dtype=dtype, torch_threads=threads)
            try:
                with torch.inference_mode():
                    opened.append(Opened(engine, dtype, load_engine(config, folder)[0], folder))
            except (ConfigError, EngineError) as e:
                refused.append((engine, dtype, str(e).splitlines()[0]))
    return opened, refused


def cpu_name() -> str:
    for line in precision.cpu_info().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=10, help="timed runs a round, per engine")
    parser.add_argument("--rounds", type=int, default=5, help="rounds over the engines in turn; the best kept")
    parser.add_argument("--engines", default=",".join(engine_names()), help=f"comma list of {','.join(engine_names())}")
    parser.add_argument(
        "--model", default=None, help="a bench model (bert-base-random: BERT-base's geometry) instead of MiniLM"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    source = models.model_dir(args.model) if args.model else minilm_dir()
    tokenizer = Tokenizer(str(source), SERVED.max_length, lower_case=True)
    batches, tokens = passes(tokenizer, TEXTS)
    ids8, mask8 = collate([tokenizer.encode([TEXTS[0]])[0].ids[: FIXED[1]]] * FIXED[0], FIXED[1], tokenizer.pad_id)
    flags = precision.cpu_flags(precision.cpu_info())
    amx = "AMX" if "amx_bf16" in flags else "no AMX"
    print(f"# {cpu_name()} ({amx}; native bf16: {precision.native_bf16(precision.cpu_info()) or 'none'})")
    print(f"# model: {args.model or 'all-MiniLM-L6-v2'}")
    print(
        f"# {args.threads} thread(s); {len(TEXTS)} prose texts, {tokens} tokens, {len(batches)} sorted passes of {ROWS}"
    )
    print()
    print("| engine | dtype | fixed cost of a 1x8 pass (ms) | tokens/s, sorted passes of 4 | start-up check |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        opened, refused = open_engines(args.engines.split(","), args.threads, source, Path(tmp))
        for engine, dtype, why in refused:
            print(f"| {engine} | {dtype} | refused | refused | {why} |")
        best = [(float("inf"), float("inf"))] * len(opened)
        for _ in range(args.rounds):  # engines in turn, so that a load on a shared machine falls on each alike
            for i, (_, _, run, _) in enumerate(opened):
                fixed, whole = timed(run, (ids8, mask8), batches, args.repeat)
                best[i] = (min(best[i][0], fixed), min(best[i][1], whole))
    for (engine, dtype, run, _), (fixed, whole) in zip(opened, best):
        check = run.fidelity.describe() if run.fidelity is not None else f"within 1e-5 of {' '.join(reference())}"
        if (engine, dtype) == reference():
            check = "the reference"
        print(f"| {engine} | {dtype} | {fixed * 1e3:.2f} | {tokens / whole:,.0f} | {check} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
