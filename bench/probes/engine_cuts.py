"""Named engine experiments: what each cut of an engine's own settings saves, its before and after measured in turn
(`python -m bench.probes.pass_cost --cuts`): ONNX Runtime's spinning threads, OpenVINO's copies in and out of
`infer`, torch's bfloat16 weights reordered every pass. Each names its engine on purpose: an experiment on that
engine's internals, not a figure every engine has (those are `pass_cost`'s, over the handler's registry)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.probes.pass_timing import CLOCKS, longtail_passes, plain
from bench.probes.tokenize_cost import best_of
from bucketing.engines import precision
from bucketing.model.tokenizer import Tokenizer
from bucketing.planning.calibrate import SHAPES, fit_cost
from bucketing.planning.planner import CostModel
from model_store.archives import engine_model_dir, minilm_dir


def run_cuts(rounds: int, repeat: int, tokenizer: Tokenizer) -> None:
    """MiniLM's graph exported once, then each cut on it (`cuts`)."""
    with tempfile.TemporaryDirectory() as tmp:
        graph = engine_model_dir(minilm_dir(), "onnxruntime", "embedding", Path(tmp) / "graph")
        cuts(graph, rounds, repeat, tokenizer)


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
