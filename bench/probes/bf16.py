"""bfloat16 against float32 in process, on the bench's own texts: `python -m bench.probes.bf16 [--model M] [--texts N]`.

Prints the GEMM rate of one thread per dtype (the roofline's), the fidelity the worker states at start (sample
texts), the cosine of each of N long-tail texts (batch of one, spread over their lengths) against float32, and
the cost model calibrated on each engine with the passes it plans per batch of 16 long-tail requests. It runs on
any CPU (as `model_store.build --dtype bfloat16` does): where the CPU has no native bfloat16 (no amx_bf16 or
avx512_bf16), torch emulates it, the fidelity is the same products rounded the same way, and the times are not
AMX's (it says so).
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from bench.harness.roofline import gemm_flops_per_core
from bench.inputs import models
from bench.inputs.workloads import make_workload
from bucketing.config import HandlerConfig
from bucketing.engine_registry import DTYPE_KINDS, is_reduced
from bucketing.engines import Engine, precision
from bucketing.engines.torch_engine import DTYPES, TorchEngine, open_reduced
from bucketing.model.encoded import collate
from bucketing.model.head import ModelInfo, load_head
from bucketing.model.tokenizer import Tokenizer
from bucketing.planning.calibrate import fit_cost, measure
from bucketing.planning.planner import CostModel
from bucketing.serving.passes import make_planner

BATCH = 16  # requests per delivered batch (the bench's bs16)


def engine(folder: str, dtype: str, config: HandlerConfig) -> tuple[Engine, ModelInfo]:
    """The torch engine in `dtype` (bfloat16: its fidelity measured, never refused here)."""
    head, info = load_head("embedding", folder)
    if not is_reduced(dtype):
        return TorchEngine(head, "cpu", DTYPES[dtype], False, info.vocab_size), info
    reduced = dataclasses.replace(config, dtype=DTYPE_KINDS[dtype].name)
    return open_reduced(head, info, reduced, folder, "cpu", DTYPES[dtype]), info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="bert-base-random, or a model folder (default: MiniLM)")
    p.add_argument("--texts", type=int, default=64, help="long-tail texts compared, spread over their lengths")
    p.add_argument("--no-cost", action="store_true", help="skip calibrating the cost model (slow where emulated)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    native = precision.native_bf16(precision.cpu_info())
    print(f"CPU: {'native bfloat16 (' + native + ')' if native else 'no amx_bf16/avx512_bf16: bfloat16 is emulated'}")
    for dtype in precision.CPU_DTYPES:
        print(f"{dtype} GEMM: {gemm_flops_per_core(dtype=dtype) / 1e9:.1f} GFLOP/s, one thread")
    folder = str(models.model_dir(args.model))
    config = dataclasses.replace(HandlerConfig(), min_cosine=0.0, torchscript=False)
    tokenizer = Tokenizer(folder, config.max_length)
    texts = make_workload("longtail", 2000, seed=0).texts
    encoded = tokenizer.encode(list(texts))
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].ids))
    picks = [order[k * (len(order) - 1) // max(1, args.texts - 1)] for k in range(args.texts)]
    lengths = [len(e.ids) for e in encoded]
    outputs = {}
    for dtype in precision.CPU_DTYPES:
        run, _ = engine(folder, dtype, config)
        fidelity = getattr(run, "fidelity", None)
        if fidelity is not None:
            print(fidelity.describe())
        rows = []
        for i in picks:
            ids, mask = collate([encoded[i].ids], lengths[i], tokenizer.pad_id)
            rows.append(run(ids, mask)[0])
        outputs[dtype] = np.array(rows)

        if args.no_cost:
            continue

        def forward(rows: int, length: int, run: Engine = run) -> None:
            run(np.full((rows, length), tokenizer.pad_id + 1, dtype=np.int64), np.ones((rows, length), dtype=np.int64))

        cost = fit_cost(measure(forward, config.max_length), CostModel())
        plan = make_planner(config, cost)
        passes = [len(plan(lengths[i : i + BATCH]).sub_batches) for i in range(0, len(lengths), BATCH)]
        print(
            f"{dtype}: cost model {cost.overhead_us:.0f} us/pass + {cost.per_token_us:.1f} us/token + "
            f"{cost.per_token_sq_us:.3f} us/token x length; {np.mean(passes):.2f} passes per batch of {BATCH}"
        )
    cos = precision.cosines(outputs["float32"], outputs["bfloat16"])
    span = f"{min(lengths[i] for i in picks)}-{max(lengths[i] for i in picks)} tokens"
    print(
        f"{models.label(args.model)}: bfloat16 vs float32 on {len(picks)} long-tail texts ({span}, one at a time): "
        f"cosine min {cos.min():.6f} mean {cos.mean():.6f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
