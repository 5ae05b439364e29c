"""Where a pass and a delivered batch spend their time, per engine and dtype, in process: our Python around the
engine call, the engine call, and what the planner makes of the fitted cost.

`python -m bench.probes.pass_cost [--threads 1] [--repeat 20] [--rounds 5] [--engines torch,onnxruntime,openvino]
[--clock cpu|wall]`: MiniLM (the shipped model, max_length 256) opened as a worker opens it (`load_engine`, start-up
checks included) on each engine in float32, and in bfloat16 where the engine runs it on this CPU. Best of
`--rounds` x `--repeat`, the engines in turn each round, on `--clock` (default `cpu`: the process's CPU time, which
another process taking the cores does not inflate; `wall` for latency on a quiet machine):

- per pass: a 1x1 and a 1x8 pass (the whole engine call as the task makes it); `ours`: the same 1x8 call with the
  engine's native call stubbed out (what our wrapper spends: graph feed, tensor conversion, output copy), and
  `collate` (the padded ids and mask of the 1x8 pass); the cost model fitted (`calibrate.fit_cost`) to the
  worker's calibration shapes timed on this clock: its fixed cost a pass (`overhead`) against what 8 tokens cost at
  its per-token rate, and the planner's passes a batch of 16 long-tail requests (`workloads`, 64 batches);
- per delivered batch: 16 short prose requests through the handler in process (`BucketingHandler.handle`): the
  handler call, the engine calls within it, and what is outside them: parsing, tokenizing, planning, collating and
  feeding the passes, and rendering and encoding the answers.

Native frames inside the engine call are not measured here: `perf record -g` on a loop of fixed passes does that
(README, "Engines").
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench.inputs.engines import engine_names
from bench.probes.engine_cost import Opened, cpu_name, open_engines
from bench.probes.engine_cuts import run_cuts
from bench.probes.pass_timing import BATCH, CLOCKS, TOKEN, Spent, longtail_passes, plain, stubbed, timed_handler
from bench.probes.tokenize_cost import best_of
from bucketing.engines import Engine, precision
from bucketing.model.encoded import collate
from bucketing.model.tokenizer import Tokenizer
from bucketing.planning.calibrate import SHAPES, fit_cost
from bucketing.planning.planner import CostModel
from model_store.archives import SERVED, minilm_dir


def pass_figures(run: Engine, repeat: int, clock: Callable[[], float]) -> dict[str, float]:
    """Seconds of a 1x1 and a 1x8 pass, of the 1x8 call with the native call stubbed, and of its collate; and the
    calibration shapes' times (microseconds, by shape)."""
    one, eight = plain(1, 1), plain(1, 8)
    run(*eight)  # first calls are not a pass's
    out = {"1x1": best_of(lambda: run(*one), repeat, clock), "1x8": best_of(lambda: run(*eight), repeat, clock)}
    with stubbed(run, 1) as native_stubbed:
        if native_stubbed:  # else no figure: the call is the whole call
            out["ours"] = best_of(lambda: run(*eight), repeat * 20, clock)
    row = [TOKEN] * 8
    out["collate"] = best_of(lambda: collate([row], 8, 0), repeat * 20, clock)
    for rows, length in SHAPES:
        arrays = plain(rows, length)
        out[f"{rows}x{length}"] = best_of(partial(run, *arrays), max(2, repeat // 4), clock)
    return out


@dataclass
class Served:
    """A handler in process on one engine, its stages timed (`Spent`)."""

    handler: Any
    context: Any
    spent: Spent


def serve_on(opened: Opened, threads: int, cost: CostModel, clock: Callable[[], float]) -> Served:
    """A handler on the engine and dtype of `opened` (opened again, as a worker opens it), planning with `cost`."""
    section = {
        "model_path": opened.folder,
        "engine": opened.engine,
        "dtype": opened.dtype,
        "torch_threads": threads,
        "cost": {
            "calibrate": False,
            "forward_overhead_us": cost.overhead_us,
            "per_token_us": cost.per_token_us,
            "per_token_sq_us": cost.per_token_sq_us,
        },
    }
    handler, context, spent = timed_handler(section, "minilm", clock)
    pipe = handler.pipeline
    spent.wrap(pipe, "tokenize", "tokenize")
    spent.wrap(pipe, "plan", "plan")
    spent.wrap(pipe, "run", "run")
    spent.wrap(pipe, "reply", "answers")
    return Served(handler, context, spent)


def batch_figures(served: Served, repeat: int) -> dict[str, float]:
    """Seconds of a delivered batch of 16 short prose requests through the handler, by stage (best call)."""
    from bucketing import protocols

    handler, context, spent = served.handler, served.context, served.spent
    rows = [{"body": {"text": text}} for text in (precision.PROSE * 2)[:BATCH]]
    parse = protocols.parse  # the pipeline calls it as `protocols.parse`
    spent.wrap(protocols, "parse", "parse")
    best: dict[str, float] = {}
    try:
        for k in range(repeat + 2):
            spent.seconds = {}
            context.with_requests(["application/json"] * len(rows))
            start = spent.clock()
            handler.handle(rows, context)
            total = spent.clock() - start
            if k >= 2 and (not best or total < best["handler"]):
                best = {"handler": total, **spent.seconds}
    finally:
        setattr(protocols, "parse", parse)  # noqa: B010 - restored as it was
    passes = handler.pipeline.plan([len(e.ids) for e in handler.tokenizer.encode([r["body"]["text"] for r in rows])])
    best["passes"] = len(passes.sub_batches)
    return best


def ours(best: dict[str, float]) -> str:
    """Our wrapper's part of a 1x8 call (us), or n/a where the engine's native call could not be stubbed."""
    return f"{best['ours'] * 1e6:.1f}" if "ours" in best else "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20, help="timed runs a round, per engine")
    parser.add_argument("--rounds", type=int, default=5, help="rounds over the engines in turn; the best kept")
    parser.add_argument("--engines", default=",".join(engine_names()), help=f"comma list of {','.join(engine_names())}")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu")
    parser.add_argument("--cuts", action="store_true", help="only each cut's before and after, measured in turn")
    args = parser.parse_args(argv)
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    tokenizer = Tokenizer(str(minilm_dir()), SERVED.max_length, lower_case=True)
    if args.cuts:
        run_cuts(args.rounds, args.repeat, tokenizer)
        return 0
    info = precision.cpu_info()
    print(f"# {cpu_name()} (native bf16: {precision.native_bf16(info) or 'none'}); {args.threads} thread(s)")
    print(f"# clock: {args.clock}; best of {args.rounds} rounds x {args.repeat}, engines in turn each round")
    with tempfile.TemporaryDirectory() as tmp:
        opened, refused = open_engines(args.engines.split(","), args.threads, minilm_dir(), Path(tmp))
        for engine, dtype, why in refused:
            print(f"# {engine} {dtype}: refused ({why})")
        best: list[dict[str, float]] = [{} for _ in opened]
        batches: list[dict[str, float]] = [{} for _ in opened]
        for _ in range(args.rounds):  # engines in turn, so that a load on a shared machine falls on each alike
            for i, o in enumerate(opened):
                with torch.inference_mode():
                    got = pass_figures(o.run, args.repeat, clock)
                best[i] = {k: min(v, best[i].get(k, v)) for k, v in got.items()}
        fitted = [fit_cost([(r, n, b[f"{r}x{n}"] * 1e6) for r, n in SHAPES], CostModel()) for b in best]
        served = [serve_on(o, args.threads, cost, clock) for o, cost in zip(opened, fitted)]
        for _ in range(args.rounds):
            for i, one in enumerate(served):
                got = batch_figures(one, args.repeat)
                if not batches[i] or got["handler"] < batches[i]["handler"]:
                    batches[i] = got
    print()
    print(
        "| engine | dtype | 1x1 pass (ms) | 1x8 pass (ms) | ours in a 1x8 call (us) | collate 1x8 (us) "
        "| fitted overhead a pass (ms) | 8 tokens at the fitted rate (ms) | per token (us) "
        "| passes a long-tail batch of 16 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for o, b, cost in zip(opened, best, fitted):
        print(
            f"| {o.engine} | {o.dtype} | {b['1x1'] * 1e3:.2f} | {b['1x8'] * 1e3:.2f} | {ours(b)} "
            f"| {b['collate'] * 1e6:.1f} | {cost.overhead_us / 1e3:.2f} | {cost.row_us(8) / 1e3:.2f} "
            f"| {cost.per_token_us:.0f} | {longtail_passes(cost, tokenizer):.2f} |"
        )
    print()
    print(f"A delivered batch of {BATCH} short prose requests through the handler (ms; best call):")
    print()
    print(
        "| engine | dtype | handler call | engine calls | outside them | parse | tokenize | plan "
        "| collate, feed (passes less engine) | answers | rest (metrics, replies) | passes |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for o, s in zip(opened, batches):
        outside = s["handler"] - s["engine"]
        passes_rest = s["run"] - s["engine"] - s["plan"]
        rest = s["handler"] - s["parse"] - s["tokenize"] - s["run"] - s["answers"]
        cells = [s["handler"], s["engine"], outside, s["parse"], s["tokenize"], s["plan"], passes_rest, s["answers"]]
        print(
            f"| {o.engine} | {o.dtype} | "
            + " | ".join(f"{v * 1e3:.2f}" for v in cells)
            + f" | {rest * 1e3:.2f} | {s['passes']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
