"""Peak worker memory for the worst delivered batch, per strategy: `python -m bench.probes.memory`.

Each case runs in a fresh process (the handler behind `tsctl.inprocess.LocalContext`, as a worker runs it) and reports
the growth of peak RSS over the loaded model: what one delivered batch costs in memory. (The peak RSS of a running
TorchServe's workers, the compare bench's `Memory:` line, is `bench.harness.worker_memory`.) `--engine onnxruntime` or
`openvino` runs the worker on the model's export, made once before the cases.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from bucketing.config import STRATEGY_RULES
from model_store.archives import SERVED, engine_model_dir


def model_folder(task: str) -> Path:
    """MiniLM for a dense kind, else the bench's SPLADE model."""
    from bench.inputs import models
    from bucketing.model_kinds import MODEL_KINDS
    from model_store.archives import minilm_dir

    return minilm_dir() if MODEL_KINDS[task].dense_vector else models.model_dir(models.SPLADE)


def _case(args: argparse.Namespace, strategy: str, texts_per_request: int) -> dict[str, str | int]:
    """One case, in this process: the worker on `args.folder` (else the task's model), a warm-up request, then one
    delivered batch of `args.batch_size` requests of `texts_per_request` texts each."""
    from bucketing_handler import BucketingHandler
    from tsctl.inprocess import LocalContext

    requests, max_length = args.batch_size, args.max_length
    section = {
        "model_path": args.folder or str(model_folder(args.task)),
        "task": args.task,
        "engine": args.engine,
        "strategy": strategy,
        "max_length": max_length,
        "max_batch_tokens": args.max_batch_tokens,
        "max_texts_per_request": max(texts_per_request, 1),
        "cost": {"calibrate": False},
    }
    context = LocalContext(section)
    handler = BucketingHandler()
    handler.initialize(context)
    text = " ".join(["word"] * (args.words or 2 * max_length))  # by default truncated to max_length tokens
    rows = [{"body": {"texts": [text] * texts_per_request}} for _ in range(requests)]
    handler.handle([{"body": {"text": "warm up"}}], context.with_requests(["application/json"]))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    context.with_requests(["application/json"] * requests)
    handler.handle(rows, context)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    totals = context.metrics.totals()
    return {
        "strategy": strategy,
        "task": args.task,
        "engine": args.engine,
        "texts": requests * texts_per_request,
        "max_length": max_length,
        "sub_batches": int(totals["bucket_sub_batches_total"] - 1),
        "model_rss_mb": round(before / 1024),
        "batch_peak_growth_mb": round((after - before) / 1024),
        "peak_rss_mb": round(after / 1024),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=16, help="requests TorchServe delivers at once")
    p.add_argument("--texts-per-request", type=int, default=32, help="texts per request in the worst case")
    p.add_argument("--max-length", type=int, default=SERVED.max_length)
    p.add_argument("--max-batch-tokens", type=int, default=SERVED.max_batch_tokens)
    p.add_argument(
        "--task", default="embedding", choices=("embedding", "sparse"), help="MiniLM, or the bench's SPLADE model"
    )
    p.add_argument("--words", type=int, default=None, help="words per text (default: twice max_length, truncated)")
    p.add_argument("--engine", default="torch", help="the worker's engine (onnxruntime, openvino: MiniLM's export)")
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)  # the engine's folder, exported once before the cases
    args = p.parse_args(argv)
    if args.case:
        strategy, tpr = args.case.split(":")
        case = _case(args, strategy, int(tpr))
        print(json.dumps(case))
        return 0
    with tempfile.TemporaryDirectory() as tmp:  # an engine's export is made here, not in a case (its peak is not one)
        folder = engine_model_dir(model_folder(args.task), args.engine, args.task, Path(tmp) / args.engine)
        table(args, folder)
    return 0


def table(args: argparse.Namespace, folder: Path) -> None:
    """Each case in a fresh process, a line each."""
    print(
        f"# {args.task} on {args.engine}, {args.batch_size} request(s) a batch, max_batch_tokens "
        f"{args.max_batch_tokens}"
    )
    print(f"{'strategy':10} {'texts':>6} {'sub-batches':>11} {'model MB':>9} {'batch +MB':>9} {'peak MB':>8}")
    for tpr in (1, args.texts_per_request):
        for strategy in (s for s, rule in STRATEGY_RULES.items() if not rule.pads_to_max_length):
            cmd = [
                sys.executable,
                "-m",
                "bench.probes.memory",
                "--case",
                f"{strategy}:{tpr}",
                "--batch-size",
                str(args.batch_size),
                "--max-length",
                str(args.max_length),
                "--max-batch-tokens",
                str(args.max_batch_tokens),
                "--task",
                args.task,
                "--engine",
                args.engine,
                "--folder",
                str(folder),
                *(["--words", str(args.words)] if args.words else []),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()
            r = json.loads(out[-1])
            print(
                f"{r['strategy']:10} {r['texts']:6d} {r['sub_batches']:11d} {r['model_rss_mb']:9d} "
                f"{r['batch_peak_growth_mb']:9d} {r['peak_rss_mb']:8d}"
            )


if __name__ == "__main__":
    sys.exit(main())
