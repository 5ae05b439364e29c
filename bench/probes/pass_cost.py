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
  its per-token rate, and the planner's passes a batch of 16 long-tail requests (`bench.inputs.workloads`, 64 batches);
- per delivered batch: 16 short prose requests through the handler in process (`BucketingHandler.handle`): the
  handler call, the engine calls within it, and what is outside them: parsing, tokenizing, planning, collating and
  feeding the passes, and rendering and encoding the answers.

Native frames inside the engine call are not measured here: `perf record -g` on a loop of fixed passes does that
(README, "Engines").
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from bench.inputs.workloads import make_workload
from bench.probes.engine_cost import Opened, cpu_name, open_engines
from bench.probes.tokenize_cost import best_of
from bucketing.config import ENGINES
from bucketing.engines import Engine, precision
from bucketing.model.tokenizer import Tokenizer, collate
from bucketing.planning.calibrate import SHAPES, fit_cost
from bucketing.planning.planner import CostModel, plan_bucketed
from model_store.archives import SERVED, engine_model_dir, minilm_dir

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
TOKEN = 2000  # an ordinary word piece of MiniLM's vocabulary, for the timed passes
BATCH = 16  # requests a delivered batch
LONGTAIL_BATCHES = 64


def plain(rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((rows, length), TOKEN, dtype=np.int64), np.ones((rows, length), dtype=np.int64)


@contextmanager
def stubbed(run: Any, rows: int) -> Iterator[None]:
    """The engine with its native call replaced by one that returns a ready output of `rows` rows: what is left of
    a call is our wrapper's (graph feed, tensor conversion, output copy)."""
    out = np.zeros((rows, 384), dtype=np.float32)
    saved: dict[str, Any] = {}
    if run.name == "onnxruntime":

        class Session:
            def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
                return [out]

        saved["session"] = run.session
        run.session = Session()
    elif run.name == "openvino":

        class Tensor:
            data = out

        class Request:
            def infer(self, feed: dict[str, np.ndarray], **_: Any) -> None:
                return None

            def get_tensor(self, port: Any) -> Tensor:
                return Tensor()

        saved["request"] = run.request
        run.request = Request()
    else:
        tensor = torch.from_numpy(out)
        saved["traced"] = run.traced
        run.traced = lambda *_: tensor
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(run, name, value)


class Spent:
    """Clock time spent in wrapped callables, by name (a bench-only patch of an object's attributes)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        inner = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self.clock()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + self.clock() - start

        setattr(owner, attribute, timed)

    def engine(self, run: Engine) -> Engine:
        """`run` with its calls timed as `engine` (its other attributes its own)."""
        spent = self

        class Timed:
            def __getattr__(self, name: str) -> Any:
                return getattr(run, name)

            def __call__(self, *args: Any) -> Any:
                start = spent.clock()
                try:
                    return run(*args)
                finally:
                    spent.seconds["engine"] = spent.seconds.get("engine", 0.0) + spent.clock() - start

        return cast(Engine, Timed())


def pass_figures(run: Engine, repeat: int, clock: Callable[[], float]) -> dict[str, float]:
    """Seconds of a 1x1 and a 1x8 pass, of the 1x8 call with the native call stubbed, and of its collate; and the
    calibration shapes' times (microseconds, by shape)."""
    one, eight = plain(1, 1), plain(1, 8)
    run(*eight)  # first calls are not a pass's
    out = {"1x1": best_of(lambda: run(*one), repeat, clock), "1x8": best_of(lambda: run(*eight), repeat, clock)}
    with stubbed(run, 1):
        out["ours"] = best_of(lambda: run(*eight), repeat * 20, clock)
    row = [TOKEN] * 8
    out["collate"] = best_of(lambda: collate([row], 8, 0), repeat * 20, clock)
    for rows, length in SHAPES:
        arrays = plain(rows, length)
        out[f"{rows}x{length}"] = best_of(partial(run, *arrays), max(2, repeat // 4), clock)
    return out


def longtail_passes(cost: CostModel, tokenizer: Tokenizer) -> float:
    """The planner's passes a batch of 16 long-tail requests, over `LONGTAIL_BATCHES` batches."""
    texts = make_workload("longtail", BATCH * LONGTAIL_BATCHES, seed=0).texts
    lengths = [len(e.ids) for e in tokenizer.encode(list(texts))]
    passes = [
        len(plan_bucketed(lengths[s : s + BATCH], cost, SERVED.max_batch_tokens).sub_batches)
        for s in range(0, len(lengths), BATCH)
    ]
    return sum(passes) / len(passes)


@dataclass
class Served:
    """A handler in process on one engine, its stages timed (`Spent`)."""

    handler: Any
    context: Any
    spent: Spent


def serve_on(opened: Opened, threads: int, cost: CostModel, clock: Callable[[], float]) -> Served:
    """A handler on the engine and dtype of `opened` (opened again, as a worker opens it), planning with `cost`."""
    from bucketing_handler import BucketingHandler
    from tsctl.inprocess import LocalContext

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
    context = LocalContext(section, model_name="minilm")
    handler = BucketingHandler()
    handler.initialize(context)
    spent = Spent(clock)
    pipe = handler.pipeline
    task: Any = handler.task
    task.engine = spent.engine(task.engine)  # the task calls its engine: the timed one stands in for it
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


def cuts(folder: Path, rounds: int, repeat: int, tokenizer: Tokenizer) -> None:
    """What each cut saves, its before and after measured in turn each round in this process (best of each): ONNX
    Runtime's spinning threads on 2 threads (on one thread there is no pool), OpenVINO's copies in and out of
    `infer`, and torch's bfloat16 weights reordered every pass (where the CPU runs bfloat16); a 1x8 and a larger pass
    on both clocks, and the cost model fitted to the calibration shapes (cpu clock) with the planner's passes a
    long-tail batch of 16."""
    import onnxruntime as ort
    import openvino as ov

    from bucketing.engines import torch_engine
    from bucketing.engines.onnx_engine import SPIN_OFF
    from bucketing.engines.openvino_engine import PRECISIONS, SHARED, OvEngine
    from bucketing.model.head import load_head

    Pass = Callable[[tuple[int, int]], Callable[[], object]]  # a shape -> one pass of it

    def on_ort(spin: bool) -> Pass:
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = 2, 1, 3
        for pool in () if spin else SPIN_OFF:
            options.add_session_config_entry(pool, "0")
        session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])

        def make(shape: tuple[int, int]) -> Callable[[], object]:
            ids, mask = plain(*shape)
            feed = {"input_ids": ids, "attention_mask": mask, "pool_mask": mask}
            return lambda: session.run(["output"], feed)

        return make

    def on_ov(dtype: str, shared: bool) -> Pass:
        engine = OvEngine(folder / "model.onnx", 1, dtype)  # its own request: one given shared arrays stays so
        port = engine.compiled.output("output")
        flags = SHARED if shared else {}

        def make(shape: tuple[int, int]) -> Callable[[], object]:
            ids, mask = plain(*shape)
            feed = {"input_ids": ids, "attention_mask": mask, "pool_mask": mask}

            def run() -> object:
                engine.request.infer(feed, **flags)
                return np.array(engine.request.get_tensor(port).data, dtype=np.float32)

            return run

        return make

    def on_torch(packed: bool) -> Pass:
        head, info = load_head("embedding", str(minilm_dir()))
        pack = torch_engine.pack_linears
        if not packed:  # bench only: the engine as it was, torch's own bfloat16 linear
            setattr(torch_engine, "pack_linears", lambda engine, vocab_size: 0)  # noqa: B010
        try:
            engine = torch_engine.TorchEngine(head, "cpu", torch.bfloat16, True, info.vocab_size)
        finally:
            setattr(torch_engine, "pack_linears", pack)  # noqa: B010
        assert bool(engine.packed) == packed

        def make(shape: tuple[int, int]) -> Callable[[], object]:
            ids, mask = plain(*shape)
            return lambda: engine(ids, mask)

        return make

    pairs: dict[str, tuple[Pass, Pass, tuple[int, int]]] = {
        "onnxruntime float32, 2 threads: spinning on -> off": (on_ort(True), on_ort(False), (4, 32))
    }
    native = precision.native_bf16(precision.cpu_info()) and "BF16" in ov.Core().get_property(
        "CPU", "OPTIMIZATION_CAPABILITIES"
    )
    if precision.native_bf16(precision.cpu_info()):
        pairs["torch bfloat16, 1 thread: torch's linear -> prepacked"] = (on_torch(False), on_torch(True), (16, 128))
    for dtype in PRECISIONS if native else ("float32",):
        pairs[f"openvino {dtype}, 1 thread: infer copies -> shared"] = (
            on_ov(dtype, False),
            on_ov(dtype, True),
            (16, 128),
        )
    shapes = {label: [(1, 8), big, *SHAPES] for label, (_, _, big) in pairs.items()}
    best: dict[tuple[str, int, tuple[int, int], str], float] = {}
    for _ in range(rounds):  # each pair's before and after in turn, shape by shape
        for label, (before, after, big) in pairs.items():
            for shape in shapes[label]:
                for k, make in enumerate((before, after)):
                    run = make(shape)
                    run()
                    n = repeat if shape[0] * shape[1] <= 64 else max(2, repeat // 4)
                    for name, clock in CLOCKS.items():
                        if name == "cpu" or shape in ((1, 8), big):
                            got = best_of(run, n, clock)
                            key = (label, k, shape, name)
                            best[key] = min(got, best.get(key, got))
    print()
    print("| cut | pass | before cpu (ms) | after cpu (ms) | after/before cpu | before wall (ms) | after wall (ms) |")
    print("|---|---|---|---|---|---|---|")
    for label, (_, _, big) in pairs.items():
        for shape in ((1, 8), big):
            cpu = [best[label, k, shape, "cpu"] * 1e3 for k in (0, 1)]
            wall = [best[label, k, shape, "wall"] * 1e3 for k in (0, 1)]
            print(
                f"| {label} | {shape[0]}x{shape[1]} | {cpu[0]:.2f} | {cpu[1]:.2f} | {cpu[1] / cpu[0]:.3f} "
                f"| {wall[0]:.2f} | {wall[1]:.2f} |"
            )
    print()
    print("| cut | fitted overhead a pass, before -> after (ms) | per token (us) | passes a long-tail batch of 16 |")
    print("|---|---|---|---|")
    for label in pairs:
        fitted = [
            fit_cost([(r, n, best[label, k, (r, n), "cpu"] * 1e6) for r, n in SHAPES], CostModel()) for k in (0, 1)
        ]
        passes = [longtail_passes(cost, tokenizer) for cost in fitted]
        print(
            f"| {label} | {fitted[0].overhead_us / 1e3:.2f} -> {fitted[1].overhead_us / 1e3:.2f} "
            f"| {fitted[0].per_token_us:.0f} -> {fitted[1].per_token_us:.0f} | {passes[0]:.2f} -> {passes[1]:.2f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20, help="timed runs a round, per engine")
    parser.add_argument("--rounds", type=int, default=5, help="rounds over the engines in turn; the best kept")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma list of {','.join(ENGINES)}")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu")
    parser.add_argument("--cuts", action="store_true", help="only each cut's before and after, measured in turn")
    args = parser.parse_args(argv)
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    tokenizer = Tokenizer(str(minilm_dir()), SERVED.max_length, lower_case=True)
    if args.cuts:
        with tempfile.TemporaryDirectory() as tmp:
            graph = engine_model_dir(minilm_dir(), "onnxruntime", "embedding", Path(tmp) / "graph")
            cuts(graph, args.rounds, args.repeat, tokenizer)
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
            f"| {o.engine} | {o.dtype} | {b['1x1'] * 1e3:.2f} | {b['1x8'] * 1e3:.2f} | {b['ours'] * 1e6:.1f} "
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
