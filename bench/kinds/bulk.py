"""`bulk` (`--suite bulk`): bulk requests on each configuration of the plan. Its figures, per configuration:

- **bulk texts/s**: one request of `--bulk-texts` texts (2,048 by default, OpenAI's limit) of the workload, alone;
- **split texts/s**: the same texts as requests of `--split-texts` (32), `concurrency` clients (closed loop);
- **small p99 alone**: single-text requests of the workload, `--small-clients` clients for `duration` seconds;
- **small p99 during bulk**: the same single-text load while one bulk request runs (it starts first; the small
  load stops before the bulk request is expected to end, so every small request shares the server with it).

Each configuration runs on its host (`--hosts torchserve,standalone`: on each in turn, a row each), the token-budget
check per host: e.g. `--bulk-texts 512 --small-clients 32`.

The two ratios (bulk / split texts/s, during / alone p99) are the report's section, and `bulk.json` in the run's
folder. Every load is bounded in count and time; the bulk request's texts are the workload's, repeated if fewer.

Where the bulk requests go (`--bulk-layouts`, or the suite's `options: {bulk_layouts: [...]}`): `same`, the
configuration's own registration; or `WxT`, a second registration of the same settings with W workers of T threads
each, registered beside the first (TorchServe answers a delivered batch as a whole, so a bulk request on a 1-thread
worker runs on one core; a bulk registration of 1 worker x 2 threads gives it both). The split and small requests
always go to the configuration's own registration.
"""

from __future__ import annotations

import json
import re
import threading
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace

from bench.harness import report, stats
from bench.harness.load import LoadResult
from bench.harness.measure import WARMUP_S, Load
from bench.harness.options import Options, flag
from bench.harness.run_plan import RunPlan
from bench.harness.targets import Target
from bench.inputs.configuration import TORCHSERVE, Configuration
from bench.inputs.job import Job
from bench.inputs.workloads import NOT_EMBEDDINGS
from bench.kinds.context import RunContext

NAME = "bulk"
SAME = "same"  # a bulk layout: the configuration's own registration
TITLE = "Bulk requests"
WORKLOADS: tuple[str, ...] = ()  # it measures the bench's workloads, none of its own
BULK_TIMEOUT_S = 600.0  # a bulk request's load: one request, bounded in time as well
START_S = 0.3  # the small load starts this long after the bulk request is sent
DURING_SHARE = 0.8  # the small load during the bulk request lasts this share of the bulk request's time alone


@dataclass(frozen=True)
class BulkFlags:
    """bulk's own flags (`options.flag` declarations, as the bench's in `options.Options`)."""

    bulk_texts: int = flag(2048, "--suite bulk: texts of the one bulk request (1 to 4096)")
    split_texts: int = flag(32, "--suite bulk: texts per request when the bulk texts are sent split")
    small_clients: int = flag(4, "--suite bulk: closed-loop clients of single-text requests (alone, during bulk)")
    bulk_layouts: str | None = flag(
        None,
        "--suite bulk: comma list of where the bulk requests go: same (the configuration's own registration) or "
        "WxT (a second registration of the same settings, W workers x T threads, e.g. 1x2); default: the "
        f"suite's, else {SAME}",
    )


FLAGS = BulkFlags
LAYOUT = re.compile(r"([1-9][0-9]*)x([1-9][0-9]*)")


def layouts(flags: BulkFlags, plan: RunPlan) -> tuple[str, ...]:
    """The bulk layouts to run, as given (the flag, else the suite's options, else `same`), each checked."""
    given = flags.bulk_layouts.split(",") if flags.bulk_layouts else plan.options.get("bulk_layouts", [SAME])
    chosen = tuple(str(g).strip() for g in given)
    for layout in chosen:
        if layout != SAME and not LAYOUT.fullmatch(layout):
            raise SystemExit(f"--bulk-layouts: got {layout!r}; allowed: {SAME}, or WxT such as 1x2")
    return chosen


def bulk_config(config: Configuration, layout: str) -> Configuration:
    """The configuration the bulk requests go to: `config` itself, or its settings with the layout's W x T."""
    match = LAYOUT.fullmatch(layout)
    if match is None:
        return config
    return replace(config, workers=int(match[1]), threads=int(match[2]))


def pairs(configs: tuple[Configuration, ...], chosen: tuple[str, ...]) -> list[tuple[Configuration, Configuration]]:
    """Each configuration with each layout's bulk configuration, a pair measured once (a layout equal to the
    configuration's own is `same`)."""
    out: list[tuple[Configuration, Configuration]] = []
    for config in configs:
        for layout in chosen:
            pair = (config, bulk_config(config, layout))
            if pair not in out:
                out.append(pair)
    return out


@dataclass(frozen=True)
class BulkRow:
    """One configuration's figures."""

    config: str
    host: str  # what served our worker (`hosts.HOSTS`)
    bulk_to: str  # where the bulk requests went: same, or the second registration's WxT
    texts: int
    bulk_s: float
    bulk_texts_per_s: float
    split_requests: int
    split_texts_per_s: float
    texts_per_s_ratio: float
    small_p99_alone_ms: float
    small_p99_during_ms: float
    p99_ratio: float
    small_requests_during: int
    bulk_during_s: float
    errors: int


def check(options: Options, plan: RunPlan) -> None:
    """No peer, no capacity search, embeddings workloads only; flags within their ranges."""
    flags = options.of(BulkFlags)
    layouts(flags, plan)
    if options.peer:
        raise SystemExit("--peer: not with --suite bulk (it measures our configurations, on their hosts)")
    if options.p99_ms is not None:
        raise SystemExit("--p99-ms: not with --suite bulk (it reports the p99 of single-text requests itself)")
    for c in plan.configs:
        if c.workload in NOT_EMBEDDINGS:
            raise SystemExit(f"--workload {c.workload}: not with --suite bulk (it sends embedding texts)")
    if not 1 <= flags.bulk_texts <= 4096:
        raise SystemExit(f"--bulk-texts: got {flags.bulk_texts}; allowed: 1 to 4096")
    if not 1 <= flags.split_texts <= flags.bulk_texts:
        raise SystemExit(f"--split-texts: got {flags.split_texts}; allowed: 1 to --bulk-texts ({flags.bulk_texts})")
    if flags.small_clients < 1:
        raise SystemExit(f"--small-clients: got {flags.small_clients}; allowed: 1 or more")


def refuse(options: Options) -> None:
    """bulk's flags are refused where another kind runs."""
    given = [name for name, value in asdict(options.of(BulkFlags)).items() if value != getattr(BulkFlags(), name)]
    if given:
        raise SystemExit(f"--{given[0].replace('_', '-')}: only with --suite bulk")


def bulk_texts(job: Job, count: int) -> list[str]:
    """`count` texts of the job's workload, in its order, repeated when it has fewer."""
    texts = job.load.workload.texts
    return [texts[i % len(texts)] for i in range(count)]


def bodies(texts: list[str], per_request: int) -> list[bytes]:
    """Our JSON bodies of `per_request` texts each (the last one fewer)."""
    return [json.dumps({"texts": texts[i : i + per_request]}).encode() for i in range(0, len(texts), per_request)]


def run(ctx: RunContext) -> list[str]:
    """Each configuration (with each bulk layout) on its own model: its figures, then the report section."""
    flags = ctx.options.of(BulkFlags)
    rows: list[BulkRow] = []
    todo = pairs(ctx.plan.configs, layouts(flags, ctx.plan))
    for i, (config, to) in enumerate(todo, 1):
        job = ctx.resolver.job(config, check=False)
        where = "" if to == config else f" to a second registration of {to.workers}x{to.threads}"
        print(f"\n[{i}/{len(todo)}] {config.name}: bulk requests of {flags.bulk_texts} texts{where}")
        with ExitStack() as stack:
            target = stack.enter_context(ctx.target(job))
            bulk_target = target if to == config else stack.enter_context(ctx.target(ctx.resolver.job(to, check=False)))
            to_label = SAME if to == config else f"{to.workers}x{to.threads}"
            rows.append(measure(ctx, job, target, flags, bulk_target, to_label))
        print(line(rows[-1]))
        (ctx.out / "bulk.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return [section(rows)]


def measure(
    ctx: RunContext, job: Job, target: Target, flags: BulkFlags, bulk_target: Target | None = None, bulk_to: str = SAME
) -> BulkRow:
    """Warm up, then the four loads of the module docstring, in that order; the bulk requests to `bulk_target`
    (default: `target`), whose layout `bulk_to` names."""
    send, config = ctx.measurer.send, job.config
    texts = bulk_texts(job, flags.bulk_texts)
    bulk, split, small = bodies(texts, flags.bulk_texts), bodies(texts, flags.split_texts), target.bodies(job)
    to = bulk_target or target

    def load(what: list[bytes], clients: int, duration: float, label: str, count: int | None = None) -> LoadResult:
        at = to if what is bulk else target
        spec = Load(at.url, what, at.headers, "closed", clients, 1.0, duration, label)
        return send(spec if count is None else replace(spec, max_requests=count))

    load(bulk, 1, BULK_TIMEOUT_S, f"{config.name} bulk warm-up", count=1)
    load(small, flags.small_clients, WARMUP_S, f"{config.name} small warm-up")
    alone = load(bulk, 1, BULK_TIMEOUT_S, f"{config.name} bulk", count=1)
    split_result = load(split, config.concurrency, BULK_TIMEOUT_S, f"{config.name} split", count=len(split))
    small_alone = load(small, flags.small_clients, config.duration, f"{config.name} small alone")
    bulk_s = alone.samples[0].latency_ms / 1000.0 if alone.samples else alone.wall_s

    during: dict[str, LoadResult] = {}
    thread = threading.Thread(
        target=lambda: during.update(bulk=load(bulk, 1, BULK_TIMEOUT_S, f"{config.name} bulk (during)", count=1))
    )
    thread.start()
    thread.join(START_S)
    small_during = load(small, flags.small_clients, max(DURING_SHARE * bulk_s - START_S, 0.5), f"{config.name} small")
    thread.join()
    bulk_during = during["bulk"]

    def p99(result: LoadResult) -> float:
        return stats.percentile([s.latency_ms for s in result.samples if s.status == 200], 99)

    results = (alone, split_result, small_alone, small_during, bulk_during)
    errors = sum(s.status != 200 for r in results for s in r.samples)
    bulk_tps = len(texts) / bulk_s if bulk_s else 0.0
    split_tps = len(texts) / split_result.wall_s if split_result.wall_s else 0.0
    p99_alone, p99_during = p99(small_alone), p99(small_during)
    return BulkRow(
        config=config.name,
        host=config.host,
        bulk_to=bulk_to,
        texts=len(texts),
        bulk_s=round(bulk_s, 3),
        bulk_texts_per_s=round(bulk_tps, 1),
        split_requests=len(split),
        split_texts_per_s=round(split_tps, 1),
        texts_per_s_ratio=round(bulk_tps / split_tps, 3) if split_tps else 0.0,
        small_p99_alone_ms=round(p99_alone, 1),
        small_p99_during_ms=round(p99_during, 1),
        p99_ratio=round(p99_during / p99_alone, 2) if p99_alone else 0.0,
        small_requests_during=len(small_during.samples),
        bulk_during_s=round(bulk_during.samples[0].latency_ms / 1000.0 if bulk_during.samples else 0.0, 3),
        errors=errors,
    )


def line(row: BulkRow) -> str:
    return (
        f"  bulk {row.bulk_texts_per_s:g} texts/s, split {row.split_texts_per_s:g} texts/s "
        f"({row.texts_per_s_ratio:g}x); small p99 {row.small_p99_alone_ms:g} ms alone, "
        f"{row.small_p99_during_ms:g} ms during bulk ({row.p99_ratio:g}x); {row.errors} errors"
    )


COLUMNS: tuple[tuple[str, str], ...] = (
    ("config", "config"),
    ("host", "host"),
    ("bulk_to", "bulk requests to"),
    ("bulk_s", "bulk request s"),
    ("bulk_texts_per_s", "bulk texts/s"),
    ("split_texts_per_s", "split texts/s"),
    ("texts_per_s_ratio", "bulk / split"),
    ("small_p99_alone_ms", "small p99 alone ms"),
    ("small_p99_during_ms", "small p99 during bulk ms"),
    ("p99_ratio", "during / alone"),
    ("small_requests_during", "small requests during"),
    ("bulk_during_s", "bulk request s (during)"),
    ("errors", "errors"),
)


def section(rows: list[BulkRow]) -> str:
    """The report's section: one row per configuration (and host, `--hosts`)."""
    texts = rows[0].texts if rows else 0
    split = rows[0].split_requests if rows else 0
    head = (
        f"## Bulk requests\n\nOne request of {texts} texts against the same texts as {split} requests; the p99 of "
        "single-text requests alone and while one bulk request runs (`bench/kinds/bulk.py`).\n\n"
    )
    hosts = {r.host for r in rows} != {TORCHSERVE}  # the host column where another host ran
    columns = [(k, h) for k, h in COLUMNS if k != "host" or hosts]
    cells = [[asdict(r)[k] for k, _ in columns] for r in rows]
    return head + report.table([h for _, h in columns], cells) + "\n"
