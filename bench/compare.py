"""Compare batching configurations on a real TorchServe: `python bench/compare.py [--suite NAME | flags]`.

Each configuration is registered through the management API, warmed up, loaded through the inference API,
measured (client latencies, the handler's Prometheus counters, server CPU) and unregistered. Results go to
bench/results/<timestamp>/ after every configuration: results.csv, results.json, then report.md and SVG plots.

This module is the command line (parse, check, run), the top floor of the bench (bench/__init__.py): the only
module that reads the harness, the run kinds' registry (`kinds.RUN_KINDS`) and the hosts' (`hosts.HOSTS`) together.
The flags are parsed once into `harness.options.Options` (each run kind's own and the hosts' beside the bench's),
the run plan is `harness.run_plan` crossed with `--hosts` (`hosts.across`), a run kind's loop, flags, checks, own
workloads and report sections are its module in `kinds/` (`matrix`, `tune`, `bulk`, `long`), each configuration
becomes a job in `harness.jobs`, a job is measured by `harness.measure` on a target of its host (`hosts/`: a
TorchServe model, a standalone server) or of `peers/`, and the results and report inputs are `harness.results`.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

from bench import hosts
from bench.harness import capacity, report
from bench.harness import options as harness_options
from bench.harness.capacity import STEP_REQUESTS, CapacitySettings
from bench.harness.jobs import Resolver
from bench.harness.measure import Measurer, send_http
from bench.harness.options import Options
from bench.harness.options import parse as parse_options
from bench.harness.results import ReportInputs, ResultsWriter, run_header, run_offline
from bench.harness.run_plan import RunPlan, suites
from bench.harness.stats import Summary
from bench.harness.targets import TorchServeSite, build_archives
from bench.hosts import HostFlags, HostRun
from bench.inputs import models, traffic
from bench.inputs.configuration import TORCHSERVE
from bench.inputs.workloads import NOT_EMBEDDINGS, Workload
from bench.kinds import RUN_KINDS, RunContext
from bench.peers import PEERS, peer_configs
from bucketing.engine_registry import is_reduced
from bucketing.engines import precision
from bucketing.model_kinds import MODEL_KINDS
from model_store import archives
from model_store.archives import ROOT
from tsctl import Client, Endpoints, TorchServe, exit_on_signals

__all__ = [
    "STEP_REQUESTS",
    "CapacitySettings",
    "Options",
    "check_args",
    "main",
    "parse_args",
    "peer_configs",
    "plan_from_args",
]


def parse_args(argv: Sequence[str] | None) -> Options:
    """The flags, parsed once: the bench's, each run kind's own and the hosts' (`options`)."""
    kind_flags = [kind.FLAGS for kind in RUN_KINDS.values() if kind.FLAGS is not None]
    return parse_options(argv, __doc__.splitlines()[0], [*kind_flags, hosts.FLAGS])


def owners() -> dict[str, str]:
    """Each workload a run kind alone measures (its WORKLOADS), with that kind's name (its suite's too)."""
    return {workload: name for name, kind in RUN_KINDS.items() for workload in kind.WORKLOADS}


def plan_from_args(options: Options) -> RunPlan:
    """The run plan from the flags (`options.plan_from_args`), a workload a run kind owns running its suite; each
    configuration on each host of `--hosts` in turn (`hosts.across`)."""
    plan = harness_options.plan_from_args(options, owners())
    return replace(plan, configs=hosts.across(plan.configs, options.of(HostFlags).hosts))


def user_texts(options: Options) -> Workload | None:
    """The --texts workload, or None; a bad file ends the run with its one-line error."""
    if options.texts is None:
        if options.sample is not None:
            raise SystemExit("--sample needs --texts")
        return None
    try:
        return traffic.load_texts(options.texts, options.text_field, options.sample, options.seed)
    except traffic.TextsError as e:
        raise SystemExit(f"--texts: {e}") from None


def check_args(options: Options, plan: RunPlan) -> CapacitySettings | None:
    """Flag combinations and ranges (one-line errors): the run kind's own first (its check, then each other kind's
    refusal of its own flags); the capacity settings when --p99-ms is given (the suite's kind options supply the
    step defaults)."""
    if plan.kind not in RUN_KINDS:
        raise SystemExit(f"kind: got {plan.kind!r}; allowed: {' | '.join(RUN_KINDS)}")
    hosts.check(plan.configs)
    RUN_KINDS[plan.kind].check(options, plan)
    for name, kind in RUN_KINDS.items():
        if name != plan.kind:
            kind.refuse(options)
    owner = owners()
    for c in plan.configs:
        if c.workload in owner and plan.kind != owner[c.workload]:
            raise SystemExit(
                f"--workload {c.workload}: measured by its own kind (--suite {owner[c.workload]}); not with kind "
                f"{plan.kind}"
            )
        if c.workload in NOT_EMBEDDINGS and (options.peer or plan.bound):
            raise SystemExit(
                f"--workload {c.workload}: not with --peer, --suite tune or --bound (they measure embeddings)"
            )
        refusal = MODEL_KINDS[models.task(c.workload)].refused(c.engine or "torch", c.dtype or "float32", "--dtypes")
        if refusal is not None:
            raise SystemExit(f"--workload {c.workload}: {refusal}")
    if options.docs_per_request < 1:
        raise SystemExit(f"--docs-per-request: got {options.docs_per_request}; allowed: 1 or more")
    reduced = sorted({c.dtype for c in plan.configs if c.dtype is not None and is_reduced(c.dtype)})
    if reduced and not options.inference_url and precision.native_bf16(precision.cpu_info()) is None:
        raise SystemExit(
            f"--dtypes {','.join(reduced)}: this CPU has no native bfloat16 (neither amx_bf16 nor avx512_bf16 in "
            "/proc/cpuinfo): its workers would refuse to start; `python -m bench.probes.bf16` measures the fidelity "
            "here"
        )
    check_peer(options, plan)
    p99_ms, steps, step_s = options.p99_ms, options.capacity_steps, options.step_s
    if p99_ms is None:
        return None
    if p99_ms <= 0:
        raise SystemExit(f"--p99-ms: got {p99_ms:g}; allowed: a positive number of milliseconds")
    if (steps is not None and steps < 1) or (step_s is not None and step_s <= 0):
        raise SystemExit("--capacity-steps and --step-s: allowed: 1 or more, and a positive number of seconds")
    if options.budget_min <= 0:
        raise SystemExit(f"--budget-min: got {options.budget_min:g}; allowed: a positive number of minutes")
    suite = plan.options
    steps = steps if steps is not None else suite.get("capacity_steps", capacity.MAX_STEPS)
    return CapacitySettings(p99_ms, steps, step_s or suite.get("step_s", capacity.STEP_S))


def check_peer(options: Options, plan: RunPlan) -> None:
    """`--peer-dtypes` needs a peer, and each dtype the peer would run must be one it runs here: its kind says why
    not in one line (bfloat16 only where this CPU multiplies it natively: the peer runs on this machine, whatever
    server --inference-url names)."""
    if options.peer_dtype_list and not options.peer:
        raise SystemExit("--peer-dtypes: needs --peer")
    if not options.peer:
        return
    cpuinfo = precision.cpu_info()
    flag = "--peer-dtypes" if options.peer_dtype_list else "--dtypes"  # without --peer-dtypes, the peer follows ours
    for c in peer_configs(plan.configs, options.peer, options.peer_dtype_list):
        refusal = PEERS[options.peer].refused(c.dtype or "float32", cpuinfo, flag)
        if refusal is not None:
            raise SystemExit(refusal)


def open_target(options: Options, plan: RunPlan, stamp: str) -> tuple[Client, TorchServe | None]:
    """A client for the server given by URLs, or a TorchServe of our own (not started yet; archives fresh)."""
    if options.inference_url:
        management, metrics = options.management_url, options.metrics_url
        if not (management and metrics):
            raise SystemExit("--inference-url needs --management-url and --metrics-url too")
        return Client(Endpoints(options.inference_url, management, metrics), options.token_file), None
    store = archives.STORE
    build_archives(store, 1, sorted({c.strategy for c in plan.configs}))
    server = TorchServe(ROOT / ".tmp" / f"bench-{stamp}", Endpoints.free(), model_store=store)
    return server.client, server  # started by the caller, inside its cleanup


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    if options.list_suites:
        for name, s in suites().items():
            print(f"{name:12} {s.get('description', '')}")
        return 0
    texts = user_texts(options)
    plan = plan_from_args(options)
    settings = check_args(options, plan)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = options.out / stamp
    out.mkdir(parents=True, exist_ok=True)
    note = ""
    if texts is not None and options.texts is not None:
        seed, sample = options.seed, options.sample
        note = f"{options.texts.name}: {len(texts.texts)} texts" + (
            f" (a sample of {sample}, seed {seed})" if sample else f" (seed {seed} order)"
        )
    header = run_header(argv, plan, note, settings)
    print(f"Results: {out}")
    sweep_rows = run_offline(plan, out) if plan.sweep or options.offline else []
    if options.offline:
        print(report.offline_table(sweep_rows))
        ReportInputs("Offline padding comparison", header, offline_rows=sweep_rows).write(out)
        return 0
    inputs = ReportInputs(RUN_KINDS[plan.kind].TITLE, header, offline_rows=sweep_rows)
    with exit_on_signals():  # SIGTERM/SIGHUP stop our servers like Ctrl-C does
        client, server = open_target(options, plan, stamp)
        site = TorchServeSite(client, server)
        run = HostRun(site, archives.STORE, ROOT / ".tmp" / f"bench-{stamp}-hosts")
        progress = not options.no_progress and sys.stderr.isatty()
        ctx = RunContext(
            plan=plan,
            resolver=Resolver(out, options.seed, texts, options.docs_per_request),
            target=hosts.targets(run),
            measurer=Measurer(send_http(options.seed, progress), settings),
            inputs=inputs,
            record=lambda summary: None,  # set by measure_all
            out=out,
            t0=time.monotonic(),
            settings=settings,
            site=site,
            options=options,
            progress=progress,
        )
        on_torchserve = any(c.host == TORCHSERVE for c in plan.configs)  # else no TorchServe is started
        return measure_all(ctx, server if on_torchserve else None)


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
        inputs.extra += RUN_KINDS[ctx.plan.kind].run(ctx)  # its report sections
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
