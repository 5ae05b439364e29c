"""Compare batching configurations on a real TorchServe: `python bench/compare.py [--suite NAME | flags]`.

Each configuration is registered through the management API, warmed up, loaded through the inference API,
measured (client latencies, the handler's Prometheus counters, server CPU) and unregistered. Results go to
bench/results/<timestamp>/ after every configuration: results.csv, results.json, then report.md and SVG plots.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import itertools
import json
import os
import platform
import shlex
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from bench import load, models, offline, plots, report, stats
from bench.workloads import WORKLOADS, Workload, make_workload
from bucketing.config import ENGINES, STRATEGIES
from model_store import archives
from model_store.archives import ROOT
from tsctl import Client, Endpoints, TorchServe, exit_on_signals, free_ports, group_cpu_seconds

SUITES = Path(__file__).resolve().parent / "suites.yaml"
WARMUP_S = 3.0
MAX_REQUESTS = 20000  # per configuration: the load is bounded in count as well as time


@dataclass(frozen=True)
class Plan:
    """What a run does: configurations, and whether to add the bound and the offline sweep."""

    name: str
    description: str
    configs: tuple[stats.Config, ...]
    bound: bool
    sweep: dict[str, list[Any]] | None


CONFIG_FIELDS = {f.name for f in fields(stats.Config)}


def expand(
    defaults: dict[str, Any], configs: Sequence[dict[str, Any]], matrix: dict[str, list[Any]]
) -> list[stats.Config]:
    """Configurations from a list and/or every combination of a matrix, over defaults; unknown keys refused."""
    out = []
    items = [dict(c) for c in configs]
    if matrix:
        keys = list(matrix)
        items += [dict(zip(keys, combo)) for combo in itertools.product(*(matrix[k] for k in keys))]
    for item in items:
        merged = {**defaults, **item}
        unknown = sorted(set(merged) - CONFIG_FIELDS)
        if unknown:
            raise SystemExit(
                f"unknown configuration key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(CONFIG_FIELDS))}"
            )
        if merged.get("strategy") not in STRATEGIES:
            raise SystemExit(f"strategy: got {merged.get('strategy')!r}; allowed: {' | '.join(STRATEGIES)}")
        if merged.get("engine") not in (None, *ENGINES):
            raise SystemExit(f"engine: got {merged.get('engine')!r}; allowed: {' | '.join(ENGINES)}")
        if merged.get("workload", "longtail") not in WORKLOADS:
            raise SystemExit(f"workload: got {merged.get('workload')!r}; allowed: {' | '.join(WORKLOADS)}")
        if merged.get("mode", "closed") == "open" and not merged.get("rate"):
            raise SystemExit("an open-loop configuration needs a rate (req/s)")
        out.append(stats.Config(**merged))
    return out


def load_suite(name: str, path: Path = SUITES) -> Plan:
    suites = yaml.safe_load(path.read_text())
    if name not in suites:
        raise SystemExit(f"--suite: no suite {name!r} in {path.name}; suites: {', '.join(suites)}")
    s = suites[name]
    configs = expand(s.get("defaults", {}), s.get("configs", []), s.get("matrix", {}))
    return Plan(name, s.get("description", ""), tuple(configs), bool(s.get("bound", False)), s.get("sweep"))


def _csv_list(text: str | None, cast: type) -> list[Any] | None:
    return [cast(x) for x in text.split(",") if x.strip()] if text else None


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The suite (default `default`), with flags overriding its defaults; matrix flags replace its configs."""
    matrix = {
        "strategy": _csv_list(args.strategies, str),
        "batch_size": _csv_list(args.batch_sizes, int),
        "max_batch_delay": _csv_list(args.delays, int),
        "rate": _csv_list(args.rates, float),
        "short_frac": _csv_list(args.short_fracs, float),
    }
    matrix = {k: v for k, v in matrix.items() if v}
    overrides = {
        k: v
        for k, v in {
            "workload": args.workload,
            "duration": args.duration,
            "mode": args.mode,
            "concurrency": args.concurrency,
            "workers": args.workers,
            "threads": args.threads,
            "model": str(args.model_dir) if args.model_dir else None,
        }.items()
        if v is not None
    }
    base = load_suite(args.suite or "default")
    engines = _csv_list(args.engines, str)
    if matrix:
        defaults = {"strategy": "bucketed", "batch_size": 16, **overrides}
        if "rate" in matrix and "mode" not in overrides:
            defaults["mode"] = "open"
        plan = Plan("custom", "configurations from flags", tuple(expand(defaults, [], matrix)), args.bound,
                    base.sweep if args.suite else None)  # fmt: skip
    else:
        configs = tuple(replace(c, **overrides) for c in base.configs)
        plan = Plan(base.name, base.description, configs, base.bound or args.bound, base.sweep)
    if engines:  # every configuration on each engine (an axis over a suite or a matrix)
        bad = sorted(set(engines) - set(ENGINES))
        if bad:
            raise SystemExit(f"--engines: got {', '.join(bad)}; allowed: {' | '.join(ENGINES)}")
        plan = replace(plan, configs=tuple(replace(c, engine=e) for c in plan.configs for e in engines))
    return plan


class ResultsWriter:
    """results.csv and results.json, rewritten whole (atomically) after every configuration."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.rows: list[dict[str, object]] = []

    def add(self, summary: stats.Summary) -> None:
        self.rows.append(summary.as_json())
        self._write("results.json", json.dumps(self.rows, indent=1))
        with tempfile.NamedTemporaryFile("w", dir=self.folder, delete=False, newline="") as f:
            writer = csv.DictWriter(f, fieldnames=stats.CSV_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(self.rows)
        os.chmod(f.name, 0o644)
        os.replace(f.name, self.folder / "results.csv")

    def _write(self, name: str, text: str) -> None:
        tmp = self.folder / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.folder / name)


class Bench:
    """One run: a TorchServe to talk to, the workloads' bodies and token counts, and the results folder."""

    def __init__(self, client: Client, server: TorchServe | None, out: Path, seed: int, progress: bool) -> None:
        self.client, self.server, self.out, self.seed, self.progress = client, server, out, seed, progress
        self._workloads: dict[tuple[str, float, str | None], tuple[Workload, list[bytes], list[int]]] = {}
        self.bounds: dict[tuple[Any, ...], dict[str, Any]] = {}

    def bound(self, config: stats.Config) -> float:
        """The padding-free bound of this workload and worker layout (real tokens/s), measured once per run."""
        engine = config.engine or archives.default_engine()
        key = (config.workload_label, config.workers, config.threads, engine, config.model)
        if key not in self.bounds:
            from bench.bound import padding_free_bound

            w, _, _ = self.workload(config)
            print(f"padding-free bound: {w.label}, {config.workers} processes x {config.threads} thread, {engine} ...")
            folder = str(models.model_dir(config.model))
            b = padding_free_bound(w.texts[:800], folder, config.workers, config.threads, engine=engine)
            label = Path(config.model).name if config.model else "all-MiniLM-L6-v2"
            self.bounds[key] = {"workload": config.workload_label, "model": label, **b}
            print(f"  {b['tokens_per_s']:.0f} real tokens/s")
            (self.out / "bound.json").write_text(json.dumps(list(self.bounds.values()), indent=1))
        return self.bounds[key]["tokens_per_s"]

    def workload(self, config: stats.Config) -> tuple[Workload, list[bytes], list[int]]:
        key = (config.workload, config.short_frac if config.workload == "mixed" else 0.0, config.model)
        if key not in self._workloads:
            from bucketing.tokenizer import Tokenizer

            tokenizer = Tokenizer(str(models.model_dir(config.model)), 256)  # token counts in the model's own terms
            w = make_workload(config.workload, 2000, self.seed, short_frac=config.short_frac)
            bodies = [json.dumps({"text": t}).encode() for t in w.texts]
            tokens = [len(e.ids) for e in tokenizer.encode(w.texts)]
            self._workloads[key] = (w, bodies, tokens)
        return self._workloads[key]

    def archive(self, config: stats.Config) -> str:
        prefix = models.prefix(config.model, config.engine)
        name = archives.name(config.strategy, config.threads, prefix)
        if self.server:
            store = Path(self.server.properties["model_store"])
            build_archives(store, config.threads, [config.strategy], config.engine, config.model)
        return f"{name}.mar"  # a server of someone else's must have it in its model store

    def device(self, model: str) -> str:
        """Where the model's workers run, as TorchServe's describe API says (`gpu` per worker)."""
        reply = self.client.call("management", "GET", f"/models/{model}")
        workers = reply.json()[0].get("workers", []) if reply.status == 200 else []
        return "gpu" if any(w.get("gpu") for w in workers) else "cpu" if workers else "unknown"

    def cpu(self) -> float | None:
        pid = self.server.pid() if self.server else None
        return group_cpu_seconds(os.getpgid(pid)) if pid else None

    def run_load(
        self, config: stats.Config, url: str, bodies: list[bytes], duration: float, label: str
    ) -> load.LoadResult:
        bar = load.Progress(label, duration, self.progress)

        def headers() -> dict[str, str]:
            return self.client.keys.headers("inference")

        if config.mode == "open":
            coro = load.open_loop(url, bodies, headers, config.rate or 1.0, duration, MAX_REQUESTS, self.seed, bar)
        else:
            coro = load.closed_loop(url, bodies, headers, config.concurrency, duration, MAX_REQUESTS, bar)
        return asyncio.run(coro)

    def measure(self, config: stats.Config, bound_tps: float | None) -> stats.Summary:
        _, bodies, tokens = self.workload(config)
        model = (
            f"bench-{config.strategy}-bs{config.batch_size}-d{config.max_batch_delay}-{config.workers}x{config.threads}"
            + (f"-{config.engine}" if config.engine else "")
            + (f"-{models.prefix(config.model, None)}" if config.model else "")
        )
        self.client.unregister(model)
        self.client.register(self.archive(config), model, config.batch_size, config.max_batch_delay, config.workers)
        try:
            device = self.device(model)
            url = f"{self.client.endpoints.inference}/predictions/{model}"
            warm = replace(
                config, mode="closed", concurrency=min(config.concurrency, 2 * config.batch_size * config.workers)
            )
            self.run_load(warm, url, bodies[::-1], WARMUP_S, f"{config.name} warm-up")
            before, cpu0 = stats.parse_prometheus(self.client.metrics(), model), self.cpu()
            result = self.run_load(config, url, bodies, config.duration, config.name)
            after, cpu1 = stats.parse_prometheus(self.client.metrics(), model), self.cpu()
        finally:
            self.client.unregister(model)
        samples = [(s.latency_ms, s.status, tokens[s.body_index]) for s in result.samples]
        return stats.summarize(
            config,
            samples,
            result.wall_s,
            stats.handler_delta(before, after),
            result.client_cpu_s,
            (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
            bound_tps,
            engine=config.engine or archives.default_engine(),
            device=device,
        )


def build_archives(
    store: Path,
    threads: int = 1,
    strategies: Sequence[str] = STRATEGIES,
    engine: str | None = None,
    model: str | None = None,
) -> None:
    """Build the archives that are missing or older than their sources (the one staleness rule)."""
    from model_store import build

    extra = ["--name", models.prefix(model, engine)] + (["--engine", engine] if engine else [])
    if model is not None:
        extra += ["--model-dir", str(models.model_dir(model))]
    argv = ["--out", str(store), "--strategies", ",".join(strategies), "--threads", str(threads), "--if-stale"]
    if build.main([*argv, *extra]) != 0:
        raise SystemExit("building the archives failed (see above)")


def length_histogram(
    tokens: Sequence[int], edges: Sequence[int] = (0, 8, 16, 32, 64, 128, 192, 256)
) -> list[tuple[int, int, int]]:
    return [(lo + 1, hi, sum(lo < t <= hi for t in tokens)) for lo, hi in itertools.pairwise(edges)]


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
    p.add_argument("--workload", choices=WORKLOADS)
    p.add_argument("--mode", choices=("closed", "open"))
    p.add_argument("--duration", type=float, help="seconds of measured load per configuration")
    p.add_argument("--concurrency", type=int, help="closed-loop clients")
    p.add_argument("--workers", type=int)
    p.add_argument("--threads", type=int, help="threads per worker")
    p.add_argument("--engines", help="comma list of torch,onnxruntime (a configuration axis)")
    p.add_argument("--model-dir", type=Path, help="bench your own encoder folder (embedding) instead of MiniLM")
    p.add_argument("--bound", action="store_true", help="also measure the padding-free bound")
    p.add_argument("--offline", action="store_true", help="only the offline padded-token sweep (no server)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="results parent folder")
    p.add_argument("--inference-url", help="use a running TorchServe (with the two URLs below)")
    p.add_argument("--management-url")
    p.add_argument("--metrics-url")
    p.add_argument("--token-file", type=Path, help="that server's key_file.json (omit if its auth is off)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def run_offline(plan: Plan, out: Path) -> list[dict[str, object]]:
    from bucketing.planner import CostModel

    sweep = plan.sweep or {"short_fracs": [0.1, 0.3, 0.5, 0.7, 0.9], "batch_sizes": [8, 16, 32]}
    rows = offline.sweep(sweep["short_fracs"], sweep["batch_sizes"], CostModel())
    with open(out / "offline.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return rows


def run_header(argv: Sequence[str] | None, plan: Plan) -> dict[str, str]:
    """What the report says about the run: date, machine, the command that reproduces it, the suite."""
    command = "python bench/compare.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    return {
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "command": f"`{command.strip()}`",
        "suite": f"{plan.name}: {plan.description}".strip(),
    }


def open_target(args: argparse.Namespace, plan: Plan, stamp: str) -> tuple[Client, TorchServe | None]:
    """A client for the server given by URLs, or a TorchServe of our own (not started yet; archives fresh)."""
    if args.inference_url:
        if not (args.management_url and args.metrics_url):
            raise SystemExit("--inference-url needs --management-url and --metrics-url too")
        return Client(Endpoints(args.inference_url, args.management_url, args.metrics_url), args.token_file), None
    store = archives.STORE
    build_archives(store, 1, sorted({c.strategy for c in plan.configs}))
    server = TorchServe(ROOT / ".tmp" / f"bench-{stamp}", Endpoints.on_ports(*free_ports(3)), model_store=store)
    return server.client, server  # started by the caller, inside its cleanup


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_suites:
        for name, s in yaml.safe_load(SUITES.read_text()).items():
            print(f"{name:12} {s.get('description', '')}")
        return 0
    plan = plan_from_args(args)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out / stamp
    out.mkdir(parents=True, exist_ok=True)
    header = run_header(argv, plan)
    print(f"Results: {out}")
    sweep_rows = run_offline(plan, out) if plan.sweep or args.offline else []
    if args.offline:
        print(report.offline_table(sweep_rows))
        made = [p for p in [plots.short_frac_sweep(sweep_rows, out)] if p]
        md = report.render_markdown("Offline padding comparison", header, [], [], {}, sweep_rows, [], made)
        (out / "report.md").write_text(md)
        return 0

    with exit_on_signals():  # SIGTERM/SIGHUP stop our server like Ctrl-C does
        return measure_all(args, plan, stamp, out, header, sweep_rows)


def measure_all(
    args: argparse.Namespace, plan: Plan, stamp: str, out: Path, header: dict[str, str], sweep_rows: list[Any]
) -> int:
    """Measure every configuration, writing results after each; the server we started is stopped however it ends."""
    summaries: list[stats.Summary] = []
    histograms: dict[str, list[tuple[int, int, int]]] = {}
    writer = ResultsWriter(out)
    client, server = open_target(args, plan, stamp)
    bench = Bench(client, server, out, args.seed, not args.no_progress and sys.stderr.isatty())
    interrupted = False
    try:
        if server:
            print(f"starting TorchServe on {server.endpoints.inference} (token auth on)")
            server.start()  # stops what it launched if interrupted
        for i, config in enumerate(plan.configs, 1):
            bound_tps = bench.bound(config) if plan.bound else None
            print(f"\n[{i}/{len(plan.configs)}] {config.name} on {config.workload_label}")
            summary = bench.measure(config, bound_tps)
            summaries.append(summary)
            writer.add(summary)
            print(report.render_block(summary))
            histograms.setdefault(config.workload_label, length_histogram(bench.workload(config)[2]))
    except (KeyboardInterrupt, SystemExit):
        interrupted = True
        print("\ninterrupted: results so far are kept", file=sys.stderr)
    finally:
        if server:
            server.stop()
    cmps = stats.comparisons(summaries)
    print("\n" + "\n".join(report.render_comparison(c) for c in cmps) if cmps else "")
    made = plots.all_plots(summaries, sweep_rows, out)
    md = report.render_markdown(
        "Batching comparison", header, summaries, cmps, histograms, sweep_rows, list(bench.bounds.values()), made
    )
    (out / "report.md").write_text(md)
    print(f"\nreport: {out / 'report.md'}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
