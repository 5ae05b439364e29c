"""Peak worker memory for the worst delivered batch, per strategy: `python -m bench.probes.memory`.

Each case runs in a fresh process (the handler behind `tsctl.inprocess.LocalContext`, as a worker runs it) and reports
the growth of peak RSS over the loaded model: what one delivered batch costs in memory. (The peak RSS of a running
TorchServe's workers, the compare bench's `Memory:` line, is `bench.harness.worker_memory`.) `--engine onnxruntime` or
`openvino` runs the worker on the model's export, made once before the cases. The worker's responseTimeout is
`RESPONSE_TIMEOUT_S` (an hour): under TorchServe's default, 120 s, its deadline guard would answer a large request 503
after the passes that fit, and the case would measure those passes only; a case answered otherwise than 200 fails.

`--task` names the model kind: MiniLM (embedding), the bench's SPLADE (sparse) and cross-encoder (classification,
a request of query-text pairs), and folders built once before the cases with MiniLM's encoder and random heads
(multivector: a 128-wide ColBERT head saved by sentence-transformers' MultiVectorEncoder; bgem3: BGE-M3's heads,
`bench.probes.outputs.m3_folder`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bucketing.config import STRATEGY_RULES
from bucketing.model_kinds import MODEL_KINDS
from model_store.archives import SERVED, engine_model_dir

COLBERT_DIM = 128  # a ColBERT head's width (colbert-ir/colbertv2.0)
RESPONSE_TIMEOUT_S = 3600  # the worker's responseTimeout here: every pass of the largest request runs


def model_folder(task: str, scratch: Path) -> Path:
    """The model a kind is probed on (built into `scratch` when it is not one of the bench's)."""
    from bench.inputs import models
    from bench.probes.outputs import m3_folder
    from model_store.archives import minilm_dir

    made: dict[str, Callable[[], Path]] = {
        "sparse": lambda: models.model_dir(models.SPLADE),
        "classification": lambda: models.model_dir(models.CROSS_ENCODER),
        "multivector": lambda: colbert_folder(scratch / "colbert"),
        "bgem3": lambda: m3_folder(scratch / "m3", "minilm"),
    }
    return made.get(task, minilm_dir)()


def colbert_folder(target: Path) -> Path:
    """MiniLM's encoder with a random 128-wide head over its token embeddings, saved by sentence-transformers'
    MultiVectorEncoder (Transformer, Dense, MultiVectorMask, Normalize)."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    from model_store.archives import minilm_dir

    torch.manual_seed(0)
    transformer = Transformer(str(minilm_dir()), max_seq_length=SERVED.max_length)
    dense = Dense(
        transformer.get_embedding_dimension(),
        COLBERT_DIM,
        bias=False,
        activation_function=torch.nn.Identity(),
        module_input_name="token_embeddings",
        module_output_name="token_embeddings",
    )
    modules = [transformer, dense, MultiVectorMask(), Normalize(module_input_name="token_embeddings")]
    MultiVectorEncoder(modules=modules, device="cpu").save(str(target))
    return target


PAIRED = ("classification",)  # the kinds probed with query-text pairs (a cross-encoder's request)


def peak_rss_kb() -> int:
    """This process's peak RSS since it started (VmHWM): `ru_maxrss` is not, as Linux carries it across exec from
    the forked parent, so a case started by a large parent (one that exported a model) read the parent's RSS."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def request_body(task: str, texts: list[str]) -> dict[str, object]:
    """One request of `texts`: query-text pairs for a cross-encoder, else the texts."""
    return {"pairs": [["a short query", text] for text in texts]} if task in PAIRED else {"texts": texts}


def _case(args: argparse.Namespace, strategy: str, texts_per_request: int) -> dict[str, str | int]:
    """One case, in this process: the worker on `args.folder` (else the task's model), a warm-up request, then one
    delivered batch of `args.batch_size` requests of `texts_per_request` texts each."""
    from bucketing_handler import BucketingHandler
    from tsctl.inprocess import LocalContext

    requests, max_length = args.batch_size, args.max_length
    section = {
        "model_path": args.folder,
        "task": args.task,
        "engine": args.engine,
        "strategy": strategy,
        "max_length": max_length,
        "max_batch_tokens": args.max_batch_tokens,
        "max_texts_per_request": max(texts_per_request, 1),
        "cost": {"calibrate": False},
    }
    context = LocalContext(section, model_config={"responseTimeout": RESPONSE_TIMEOUT_S})
    handler = BucketingHandler()
    handler.initialize(context)
    text = " ".join(["word"] * (args.words or 2 * max_length))  # by default truncated to max_length tokens
    rows = [{"body": request_body(args.task, [text] * texts_per_request)} for _ in range(requests)]
    handler.handle([{"body": request_body(args.task, ["warm up"])}], context.with_requests(["application/json"]))
    before = peak_rss_kb()
    context.with_requests(["application/json"] * requests)
    answers = handler.handle(rows, context)
    after = peak_rss_kb()
    statuses = sorted({context.status.get(i, (200, ""))[0] for i in range(len(answers))})
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
        "statuses": statuses,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=16, help="requests TorchServe delivers at once")
    p.add_argument("--texts-per-request", type=int, default=32, help="texts per request in the worst case")
    p.add_argument("--max-length", type=int, default=SERVED.max_length)
    p.add_argument("--max-batch-tokens", type=int, default=SERVED.max_batch_tokens)
    p.add_argument("--task", default="embedding", choices=tuple(MODEL_KINDS), help="the model kind (see above)")
    p.add_argument("--words", type=int, default=None, help="words per text (default: twice max_length, truncated)")
    p.add_argument("--engine", default="torch", help="the worker's engine (onnxruntime, openvino: MiniLM's export)")
    p.add_argument(
        "--expect", type=int, default=200, help="the status the large request must get (413: what a refusal costs)"
    )
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)  # the engine's folder, exported once before the cases
    args = p.parse_args(argv)
    if args.case:
        strategy, tpr = args.case.split(":")
        case = _case(args, strategy, int(tpr))
        print(json.dumps(case))
        return 0
    with tempfile.TemporaryDirectory() as tmp:  # a model or export is made here, not in a case (its peak is not one)
        model = model_folder(args.task, Path(tmp))
        folder = engine_model_dir(model, args.engine, args.task, Path(tmp) / args.engine)
        table(args, folder)
    return 0


def table(args: argparse.Namespace, folder: Path) -> None:
    """Each case in a fresh process, a line each."""
    print(
        f"# {args.task} on {args.engine}, {args.batch_size} request(s) a batch, max_batch_tokens "
        f"{args.max_batch_tokens}"
    )
    print(f"{'strategy':10} {'texts':>6} {'sub-batches':>11} {'model MB':>9} {'batch +MB':>9} {'peak MB':>8} answers")
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
            expect = 200 if tpr == 1 else args.expect
            if set(r["statuses"]) != {expect}:
                raise SystemExit(
                    f"{strategy}, {r['texts']} texts: answered {r['statuses']}, not {expect}: nothing measured"
                )
            print(
                f"{r['strategy']:10} {r['texts']:6d} {r['sub_batches']:11d} {r['model_rss_mb']:9d} "
                f"{r['batch_peak_growth_mb']:9d} {r['peak_rss_mb']:8d} {','.join(map(str, r['statuses']))}"
            )


if __name__ == "__main__":
    sys.exit(main())
