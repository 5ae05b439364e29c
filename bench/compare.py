"""Compare batching configurations on a real TorchServe: `python bench/compare.py [--suite NAME | flags]`.

Each configuration is registered through the management API, warmed up, loaded through the inference API,
measured (client latencies, the handler's Prometheus counters, server CPU) and unregistered. Results go to
bench/results/<timestamp>/ after every configuration: results.csv, results.json, then report.md and SVG plots.

This module is the command line (parse, check, run); the run plan is `run_plan`, a run kind's loop is in `kinds/`
(`matrix`, `tune`), each configuration becomes a job in `jobs`, a job is measured by `measure` on a target of
`targets` (a TorchServe model) or `peers`, and the results and report inputs are `results`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import capacity, models, peers, report, traffic
from bench.capacity import STEP_REQUESTS, CapacitySettings
from bench.jobs import Resolver
from bench.kinds import KINDS, RunContext
from bench.measure import Measurer, send_http
from bench.results import ReportInputs, ResultsWriter, run_header, run_offline
from bench.run_plan import SUITES, RunPlan, peer_configs, plan_from_args, suites
from bench.stats import Summary
from bench.targets import TorchServeSite, build_archives
from bench.workloads import BENCH_WORKLOADS, DOCS_PER_REQUEST, NOT_EMBEDDINGS, Workload
from bucketing.engines import precision
from bucketing.kinds import KINDS as MODEL_KINDS
from model_store import archives
from model_store.archives import ROOT
from tsctl import Client, Endpoints, TorchServe, exit_on_signals

__all__ = ["STEP_REQUESTS", "CapacitySettings", "check_args", "main", "parse_args", "peer_configs", "plan_from_args"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--suite", help=f"named suite from {SUITES.name} (default: default)")
    p.add_argument("--list-suites", action="store_true", help="print the suites and exit")
    p.add_argument("--strategies", help="comma list of bucketed,dynamic,static (makes a matrix with the flags below)")
    p.add_argument("--batch-sizes", help="comma list, e.g. 1,4,8,16,32")
    p.add_argument("--delays", help="comma list of max_batch_delay in ms")
    p.add_argument("--rates", help="comma list of open-loop rates (req/s); implies --mode open")
    p.add_argument("--short-fracs", help="comma list for the mixed workload")
    p.add_argument("--workload", choices=BENCH_WORKLOADS)
    p.add_argument(
        "--docs-per-request",
        type=int,
        default=DOCS_PER_REQUEST,
        help="--workload rerank: documents per request, each scored with the query",
    )
    p.add_argument("--texts", type=Path, help="your own traffic: .txt (a text a line), .jsonl or .csv")
    p.add_argument("--text-field", default="text", help="the JSON field or CSV column holding the text")
    p.add_argument("--sample", type=int, help="send N texts drawn from --texts (seeded by --seed)")
    p.add_argument("--p99-ms", type=float, help="also find each configuration's capacity: req/s with p99 <= this")
    p.add_argument(
        "--capacity-steps",
        type=int,
        help=f"open-loop steps per capacity search, at most (default {capacity.MAX_STEPS})",
    )
    p.add_argument("--step-s", type=float, help=f"seconds per capacity step, at least (default {capacity.STEP_S:g})")
    p.add_argument("--budget-min", type=float, default=15.0, help="--suite tune: minutes for the whole suite")
    p.add_argument(
        "--min-cosine",
        type=float,
        help="--suite tune: also consider bfloat16 (where the CPU multiplies it natively), eligible only when its "
        "answers' cosine min against float32 on the run's texts reaches this floor (e.g. 0.999)",
    )
    p.add_argument("--peer", choices=sorted(peers.PEERS), help="also measure this server on the same texts and load")
    p.add_argument("--mode", choices=("closed", "open"))
    p.add_argument("--duration", type=float, help="seconds of measured load per configuration")
    p.add_argument("--concurrency", type=int, help="closed-loop clients")
    p.add_argument("--workers", type=int)
    p.add_argument("--threads", type=int, help="threads per worker")
    p.add_argument("--engines", help="comma list of torch,onnxruntime (a configuration axis)")
    p.add_argument("--schedules", help="comma list of batch,continuous (handler.schedule; a configuration axis)")
    p.add_argument(
        "--dtypes",
        help="comma list of float32,bfloat16 (handler.dtype; a configuration axis; bfloat16 runs on torch, where the "
        "CPU multiplies it natively)",
    )
    p.add_argument("--model-dir", type=Path, help="bench your own encoder folder (embedding) instead of MiniLM")
    p.add_argument(
        "--bound",
        action="store_true",
        help="also measure exact-length grouping in process (a reference rate, not a bound)",
    )
    p.add_argument("--offline", action="store_true", help="only the offline padded-token sweep (no server)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="results parent folder")
    p.add_argument("--inference-url", help="use a running TorchServe (with the two URLs below)")
    p.add_argument("--management-url")
    p.add_argument("--metrics-url")
    p.add_argument("--token-file", type=Path, help="that server's key_file.json (omit if its auth is off)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def user_texts(args: argparse.Namespace) -> Workload | None:
    """The --texts workload, or None; a bad file ends the run with its one-line error."""
    if args.texts is None:
        if args.sample is not None:
            raise SystemExit("--sample needs --texts")
        return None
    try:
        return traffic.load_texts(args.texts, args.text_field, args.sample, args.seed)
    except traffic.TextsError as e:
        raise SystemExit(f"--texts: {e}") from None


def check_args(args: argparse.Namespace, plan: RunPlan) -> CapacitySettings | None:
    """Flag combinations and ranges (one-line errors): the run kind's own first; the capacity settings when
    --p99-ms is given (the kind's options supply the step defaults)."""
    if plan.kind not in KINDS:
        raise SystemExit(f"kind: got {plan.kind!r}; allowed: {' | '.join(KINDS)}")
    KINDS[plan.kind].check(args, plan)
    for c in plan.configs:
        if c.workload in NOT_EMBEDDINGS and (args.peer or plan.bound):
            raise SystemExit(
                f"--workload {c.workload}: not with --peer, --suite tune or --bound (they measure embeddings)"
            )
        refusal = MODEL_KINDS[models.task(c.workload)].refused(c.engine or "torch", c.dtype or "float32", "--dtypes")
        if refusal is not None:
            raise SystemExit(f"--workload {c.workload}: {refusal}")
    if args.docs_per_request < 1:
        raise SystemExit(f"--docs-per-request: got {args.docs_per_request}; allowed: 1 or more")
    reduced = sorted({c.dtype for c in plan.configs if c.dtype and c.dtype != "float32"})
    if reduced and not args.inference_url and precision.native_bf16(precision.cpu_info()) is None:
        raise SystemExit(
            f"--dtypes {','.join(reduced)}: this CPU has no native bfloat16 (neither amx_bf16 nor avx512_bf16 in "
            "/proc/cpuinfo): its workers would refuse to start; `python -m bench.bf16` measures the fidelity here"
        )
    if args.p99_ms is None:
        return None
    if args.p99_ms <= 0:
        raise SystemExit(f"--p99-ms: got {args.p99_ms:g}; allowed: a positive number of milliseconds")
    if (args.capacity_steps is not None and args.capacity_steps < 1) or (args.step_s is not None and args.step_s <= 0):
        raise SystemExit("--capacity-steps and --step-s: allowed: 1 or more, and a positive number of seconds")
    if args.budget_min <= 0:
        raise SystemExit(f"--budget-min: got {args.budget_min:g}; allowed: a positive number of minutes")
    options = plan.options
    steps = (
        args.capacity_steps if args.capacity_steps is not None else options.get("capacity_steps", capacity.MAX_STEPS)
    )
    return CapacitySettings(args.p99_ms, steps, args.step_s or options.get("step_s", capacity.STEP_S))


def open_target(args: argparse.Namespace, plan: RunPlan, stamp: str) -> tuple[Client, TorchServe | None]:
    """A client for the server given by URLs, or a TorchServe of our own (not started yet; archives fresh)."""
    if args.inference_url:
        if not (args.management_url and args.metrics_url):
            raise SystemExit("--inference-url needs --management-url and --metrics-url too")
        return Client(Endpoints(args.inference_url, args.management_url, args.metrics_url), args.token_file), None
    store = archives.STORE
    build_archives(store, 1, sorted({c.strategy for c in plan.configs}))
    server = TorchServe(ROOT / ".tmp" / f"bench-{stamp}", Endpoints.free(), model_store=store)
    return server.client, server  # started by the caller, inside its cleanup


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_suites:
        for name, s in suites().items():
            print(f"{name:12} {s.get('description', '')}")
        return 0
    texts = user_texts(args)
    plan = plan_from_args(args)
    settings = check_args(args, plan)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out / stamp
    out.mkdir(parents=True, exist_ok=True)
    note = ""
    if texts is not None:
        note = f"{args.texts.name}: {len(texts.texts)} texts" + (
            f" (a sample of {args.sample}, seed {args.seed})" if args.sample else f" (seed {args.seed} order)"
        )
    header = run_header(argv, plan, note, settings)
    print(f"Results: {out}")
    sweep_rows = run_offline(plan, out) if plan.sweep or args.offline else []
    if args.offline:
        print(report.offline_table(sweep_rows))
        ReportInputs("Offline padding comparison", header, offline_rows=sweep_rows).write(out)
        return 0
    inputs = ReportInputs(KINDS[plan.kind].TITLE, header, offline_rows=sweep_rows)
    with exit_on_signals():  # SIGTERM/SIGHUP stop our servers like Ctrl-C does
        client, server = open_target(args, plan, stamp)
        site = TorchServeSite(client, server)
        progress = not args.no_progress and sys.stderr.isatty()
        ctx = RunContext(
            plan=plan,
            resolver=Resolver(out, args.seed, texts, args.docs_per_request),
            target=site.model,
            measurer=Measurer(send_http(args.seed, progress), settings),
            inputs=inputs,
            record=lambda summary: None,  # set by measure_all
            out=out,
            t0=time.monotonic(),
            settings=settings,
            site=site,
            peer=args.peer,
            budget_min=args.budget_min,
            min_cosine=args.min_cosine,
            progress=progress,
        )
        return measure_all(ctx, server)


def measure_all(ctx: RunContext, server: TorchServe | None = None) -> int:
    """Run the plan's kind, writing results after each configuration; the server we started (`server`) is
    stopped however it ends, and the report is written from what was measured."""
    t0, out, inputs = ctx.t0, ctx.out, ctx.inputs
    writer = ResultsWriter(out)
    interrupted = False

    def record(summary: Summary) -> None:
        inputs.summaries.append(summary)
        writer.add(summary)
        print(report.render_block(summary))

    ctx.record = record
    try:
        if server:
            print(f"starting TorchServe on {server.endpoints.inference} (token auth on)")
            server.start()  # stops what it launched if interrupted
        KINDS[ctx.plan.kind].run(ctx)
    except (KeyboardInterrupt, SystemExit) as e:
        interrupted = True
        why = f"{e.code}\n" if isinstance(e, SystemExit) and isinstance(e.code, str) else ""  # its one line
        print(f"\n{why}interrupted: results so far are kept", file=sys.stderr)
    finally:
        if server:
            server.stop()
    inputs.sent, inputs.bounds = ctx.measurer.sent, ctx.resolver.exact_length_rates
    cmps = inputs.write(out)
    print("\n" + "\n".join(report.render_comparison(c) for c in cmps) if cmps else "")
    print(f"\nreport: {out / 'report.md'}  ({time.monotonic() - t0:.0f} s)")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
