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
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from bench import capacity, load, models, offline, peers, plots, report, stats, traffic, tune
from bench.workloads import BENCH_WORKLOADS, DOCS_PER_REQUEST, RERANK, Workload, make_workload, rerank_requests
from bucketing.config import ENGINES, STRATEGIES
from bucketing.protocols import cohere_rerank
from model_store import archives
from model_store.archives import ROOT
from tsctl import (
    Client,
    Endpoints,
    ServerError,
    TorchServe,
    exit_on_signals,
    group_cpu_seconds,
    read_properties,
)
from tsctl.process import DEFAULT_PROPERTIES

SUITES = Path(__file__).resolve().parent / "suites.yaml"
WARMUP_S = 3.0
MAX_REQUESTS = 20000  # per configuration: the load is bounded in count as well as time
STEP_REQUESTS = 500  # a capacity step lasts long enough for this many arrivals (its p99 is the 5th worst)
START_SHARE = 0.5  # the capacity search starts at this share of the closed-loop throughput (measured: 0.3-0.75)
TUNED_NAME = "minilm-tuned"


@dataclass(frozen=True)
class Plan:
    """What a run does: configurations, and whether to add the bound and the offline sweep."""

    name: str
    description: str
    configs: tuple[stats.Config, ...]
    bound: bool
    sweep: dict[str, list[Any]] | None
    tune: dict[str, Any] | None = None  # the tune suite's search space (`--suite tune`)


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
        workload = str(merged.get("workload", "longtail"))
        if workload not in BENCH_WORKLOADS and not workload.startswith(traffic.PREFIX):
            raise SystemExit(f"workload: got {merged.get('workload')!r}; allowed: {' | '.join(BENCH_WORKLOADS)}")
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
    return Plan(
        name, s.get("description", ""), tuple(configs), bool(s.get("bound", False)), s.get("sweep"), s.get("tune")
    )


def _csv_list(text: str | None, cast: type) -> list[Any] | None:
    return [cast(x) for x in text.split(",") if x.strip()] if text else None


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The suite (default `default`), with flags overriding its defaults; matrix flags replace its configs."""
    flags = {
        "strategy": _csv_list(args.strategies, str),
        "batch_size": _csv_list(args.batch_sizes, int),
        "max_batch_delay": _csv_list(args.delays, int),
        "rate": _csv_list(args.rates, float),
        "short_frac": _csv_list(args.short_fracs, float),
    }
    matrix: dict[str, list[Any]] = {k: v for k, v in flags.items() if v}
    overrides = {
        k: v
        for k, v in {
            "duration": args.duration,
            "mode": args.mode,
            "concurrency": args.concurrency,
            "workers": args.workers,
            "threads": args.threads,
            "model": str(args.model_dir)
            if args.model_dir
            else models.CROSS_ENCODER
            if args.workload == RERANK
            else None,
            "workload": traffic.workload_name(args.texts) if args.texts else args.workload,
        }.items()
        if v is not None
    }
    base = load_suite(args.suite or "default")
    engines = _csv_list(args.engines, str)
    if matrix:
        defaults = {"strategy": "bucketed", "batch_size": 16, **overrides}
        if "rate" in matrix and "mode" not in overrides:
            defaults["mode"] = "open"
        plan = Plan(
            "custom",
            "configurations from flags",
            tuple(expand(defaults, [], matrix)),
            args.bound,
            base.sweep if args.suite else None,
        )
    else:
        configs = tuple(replace(c, **overrides) for c in base.configs)
        plan = Plan(base.name, base.description, configs, base.bound or args.bound, base.sweep, base.tune)
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


@dataclass(frozen=True)
class Target:
    """Where one configuration's load goes, and how to read the server it measures."""

    url: str
    bodies: list[bytes]
    headers: Callable[[], dict[str, str]]
    cpu: Callable[[], float | None]
    counters: Callable[[], dict[str, float]]  # the handler's counters ({} for a peer)
    engine: str
    device: str


@dataclass(frozen=True)
class CapacitySettings:
    """`--p99-ms` and how long the search may take per configuration."""

    target_ms: float
    max_steps: int = 6
    step_s: float = 10.0


class Bench:
    """One run: a TorchServe to talk to, the workloads' bodies and token counts, and the results folder."""

    def __init__(
        self,
        client: Client,
        server: TorchServe | None,
        out: Path,
        seed: int,
        progress: bool,
        texts: Workload | None = None,
        capacity: CapacitySettings | None = None,
        docs_per_request: int = DOCS_PER_REQUEST,
    ) -> None:
        self.client, self.server, self.out, self.seed, self.progress = client, server, out, seed, progress
        self.texts, self.capacity_settings, self.docs_per_request = texts, capacity, docs_per_request
        self._workloads: dict[tuple[str, float, str | None], tuple[Workload, list[bytes], list[int]]] = {}
        self.bounds: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.sent: dict[str, list[int]] = {}  # per workload: token counts of every measured request sent
        self.pair_tokens: list[list[int]] = []  # the rerank workload: each body's pair token counts

    def count_sent(self, config: stats.Config, result: load.LoadResult) -> None:
        """Token counts of what was sent, for the report's histogram: each text (each pair of a rerank request)."""
        tokens = self.workload(config)[2]
        sent = self.sent.setdefault(config.workload_label, [])
        if config.workload == RERANK:
            sent.extend(n for s in result.samples for n in self.pair_tokens[s.body_index])
        else:
            sent.extend(tokens[s.body_index] for s in result.samples)

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
        """The texts of a configuration's workload (the user's file for `file:`), their bodies and token counts."""
        key = (config.workload, config.short_frac if config.workload == "mixed" else 0.0, config.model)
        if key not in self._workloads:
            from bucketing.tokenizer import Tokenizer

            tokenizer = Tokenizer(str(models.model_dir(config.model)), 256)  # token counts in the model's own terms
            if config.workload == RERANK:
                self._workloads[key] = self.rerank_workload(tokenizer)
                return self._workloads[key]
            if config.workload.startswith(traffic.PREFIX):
                if self.texts is None or self.texts.name != config.workload:
                    raise SystemExit(f"workload {config.workload}: give the file with --texts")
                w = self.texts
            else:
                w = make_workload(config.workload, 2000, self.seed, short_frac=config.short_frac)
            bodies = [json.dumps({"text": t}).encode() for t in w.texts]
            tokens = [len(e.ids) for e in tokenizer.encode(w.texts)]  # as served: cut at max_length
            self._workloads[key] = (w, bodies, tokens)
        return self._workloads[key]

    def rerank_workload(self, tokenizer: Any) -> tuple[Workload, list[bytes], list[int]]:
        """Cohere-style rerank bodies (a query, `docs_per_request` documents) and each request's pair tokens."""
        requests = rerank_requests(2000 // self.docs_per_request + 1, self.docs_per_request, self.seed)
        documents = tuple(d for _, docs in requests for d in docs)
        w = Workload(RERANK, documents, tuple(0 for _ in documents), self.seed)
        bodies = [json.dumps({"query": q, "documents": list(docs)}).encode() for q, docs in requests]
        self.pair_tokens = [
            [len(e.ids) for e in tokenizer.encode_pairs([(q, d) for d in docs])] for q, docs in requests
        ]
        return w, bodies, [sum(pairs) for pairs in self.pair_tokens]

    def archive(self, config: stats.Config) -> str:
        prefix = models.prefix(config.model, config.engine)
        name = archives.name(config.strategy, config.threads, prefix)
        if self.server:
            store = Path(self.server.properties["model_store"])
            build_archives(
                store, config.threads, [config.strategy], config.engine, config.model, models.task(config.workload)
            )
        return f"{name}.mar"  # a server of someone else's must have it in its model store

    def device(self, model: str) -> str:
        """Where the model's workers run, as TorchServe's describe API says (`gpu` per worker)."""
        reply = self.client.call("management", "GET", f"/models/{model}")
        workers = reply.json()[0].get("workers", []) if reply.status == 200 else []
        return "gpu" if any(w.get("gpu") for w in workers) else "cpu" if workers else "unknown"

    def cpu(self) -> float | None:
        pid = self.server.pid() if self.server else None
        return group_cpu_seconds(os.getpgid(pid)) if pid else None

    def run_load(self, config: stats.Config, target: Target, duration: float, label: str) -> load.LoadResult:
        bar = load.Progress(label, duration, self.progress)
        if config.mode == "open":
            coro = load.open_loop(
                target.url, target.bodies, target.headers, config.rate or 1.0, duration, MAX_REQUESTS, self.seed, bar
            )
        else:
            coro = load.closed_loop(
                target.url, target.bodies, target.headers, config.concurrency, duration, MAX_REQUESTS, bar
            )
        return asyncio.run(coro)

    def torchserve_target(self, config: stats.Config, model: str) -> Target:
        """The load target of a model registered on our TorchServe."""
        return Target(
            url=f"{self.client.endpoints.inference}/predictions/{model}"
            + (f"/1.0/{cohere_rerank.PATH}" if config.workload == RERANK else ""),
            bodies=self.workload(config)[1],
            headers=lambda: self.client.keys.headers("inference"),
            cpu=self.cpu,
            counters=lambda: stats.parse_prometheus(self.client.metrics(), model),
            engine=config.engine or archives.default_engine(),
            device=self.device(model),
        )

    def measure(self, config: stats.Config, bound_tps: float | None) -> stats.Summary:
        """Register the configuration, measure it, unregister it."""
        model = (
            f"bench-{config.strategy}-bs{config.batch_size}-d{config.max_batch_delay}-{config.workers}x{config.threads}"
            + (f"-{config.engine}" if config.engine else "")
            + (f"-{models.prefix(config.model, None)}" if config.model else "")
        )
        self.client.unregister(model)
        self.client.register(self.archive(config), model, config.batch_size, config.max_batch_delay, config.workers)
        try:
            return self.measure_target(config, self.torchserve_target(config, model), bound_tps)
        finally:
            self.client.unregister(model)

    def measure_target(self, config: stats.Config, target: Target, bound_tps: float | None) -> stats.Summary:
        """Warm up, load, read the figures; then the capacity search when a p99 target was given."""
        tokens = self.workload(config)[2]
        clients = min(config.concurrency, 2 * config.batch_size * config.workers)
        warm = replace(config, mode="closed", concurrency=clients)
        self.run_load(warm, replace(target, bodies=target.bodies[::-1]), WARMUP_S, f"{config.name} warm-up")
        before, cpu0 = target.counters(), target.cpu()
        result = self.run_load(config, target, config.duration, config.name)
        after, cpu1 = target.counters(), target.cpu()
        self.count_sent(config, result)
        samples = [(s.latency_ms, s.status, tokens[s.body_index]) for s in result.samples]
        summary = stats.summarize(
            config,
            samples,
            result.wall_s,
            stats.handler_delta(before, after),
            result.client_cpu_s,
            (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
            bound_tps,
            engine=target.engine,
            device=target.device,
        )
        if self.capacity_settings:
            start = (config.rate or 1.0) if config.mode == "open" else START_SHARE * summary.rps
            summary = replace(summary, capacity=self.search_capacity(config, target, start))
        return summary

    def search_capacity(self, config: stats.Config, target: Target, start: float) -> capacity.Capacity:
        """The highest open-loop rate within the p99 target (each step's requests are reported)."""
        settings = self.capacity_settings
        assert settings is not None

        def step(rate: float) -> capacity.Step:
            duration = capacity.step_duration(rate, settings.step_s, STEP_REQUESTS, 3 * settings.step_s)
            opened = replace(config, mode="open", rate=rate)
            r = self.run_load(opened, target, duration, f"{config.name} @{rate:g}/s")
            self.count_sent(config, r)
            ok = [s.latency_ms for s in r.samples if s.status == 200]
            result = capacity.Step(rate, len(r.samples), len(ok), stats.percentile(ok, 99), r.wall_s)
            verdict = "within" if result.passes(settings.target_ms) else "over"
            print(
                f"  capacity step {rate:g} req/s: {result.requests} requests, p99 {result.p99_ms:.0f} ms, "
                f"{result.errors} errors: {verdict} {settings.target_ms:g} ms"
            )
            return result

        return capacity.search(step, max(start, capacity.MIN_RATE), settings.target_ms, settings.max_steps)

    def measure_peer(
        self, spec: peers.PeerSpec, configs: Sequence[stats.Config], record: Callable[[stats.Summary], None]
    ) -> None:
        """Start the peer once per batch size, spot-check its answers, measure it on each configuration's load."""
        python = peers.venv(spec, progress=self.progress)
        for batch_size in dict.fromkeys(c.batch_size for c in configs):
            group = [c for c in configs if c.batch_size == batch_size]
            folder = models.model_dir(group[0].model)
            print(f"\nstarting {spec.name} (batch size {batch_size}) ...")
            with peers.PeerServer(spec, python, folder, batch_size, self.out / "logs") as server:
                w, _, tokens = self.workload(group[0])
                by_length = sorted(range(len(w.texts)), key=lambda i: tokens[i])
                picks = [w.texts[by_length[k * (len(by_length) - 1) // 7]] for k in range(8)]  # shortest to longest
                cos = peers.spot_check(server, picks, folder)
                print(f"  answers: lowest cosine {cos:.6f} against our batch-of-one reference (8 texts)")
                for config in group:
                    target = Target(
                        url=server.url,
                        bodies=[spec.body(t) for t in self.workload(config)[0].texts],
                        headers=dict,
                        cpu=server.cpu,
                        counters=dict,
                        engine="torch",
                        device="cpu",
                    )
                    print(f"\n{config.name} on {config.workload_label}")
                    record(replace(self.measure_target(config, target, None), min_cosine=cos))


def build_archives(
    store: Path,
    threads: int = 1,
    strategies: Sequence[str] = STRATEGIES,
    engine: str | None = None,
    model: str | None = None,
    task: str = "embedding",
) -> None:
    """Build the archives that are missing or older than their sources (the one staleness rule)."""
    from model_store import build

    extra = ["--name", models.prefix(model, engine)] + (["--engine", engine] if engine else [])
    if model is not None:
        extra += ["--model-dir", str(models.model_dir(model)), "--task", task]
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
    p.add_argument("--capacity-steps", type=int, help="open-loop steps per capacity search, at most (default 6)")
    p.add_argument("--step-s", type=float, help="seconds per capacity step, at least (default 10)")
    p.add_argument("--budget-min", type=float, default=15.0, help="--suite tune: minutes for the whole suite")
    p.add_argument("--peer", choices=sorted(peers.PEERS), help="also measure this server on the same texts and load")
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
    server = TorchServe(ROOT / ".tmp" / f"bench-{stamp}", Endpoints.free(), model_store=store)
    return server.client, server  # started by the caller, inside its cleanup


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


def check_args(args: argparse.Namespace, plan: Plan) -> CapacitySettings | None:
    """Flag combinations and ranges (one-line errors); the capacity settings when --p99-ms is given."""
    if plan.tune and not args.p99_ms:
        raise SystemExit("--suite tune needs --p99-ms: the p99 latency target (ms) to tune for")
    if plan.tune and args.peer:
        raise SystemExit("--peer: not with --suite tune (measure the peer next to the tuned settings in a second run)")
    if any(c.workload == RERANK for c in plan.configs) and (args.peer or plan.tune or plan.bound):
        raise SystemExit("--workload rerank: not with --peer, --suite tune or --bound (they measure embeddings)")
    if args.docs_per_request < 1:
        raise SystemExit(f"--docs-per-request: got {args.docs_per_request}; allowed: 1 or more")
    if args.p99_ms is None:
        return None
    if args.p99_ms <= 0:
        raise SystemExit(f"--p99-ms: got {args.p99_ms:g}; allowed: a positive number of milliseconds")
    if (args.capacity_steps is not None and args.capacity_steps < 1) or (args.step_s is not None and args.step_s <= 0):
        raise SystemExit("--capacity-steps and --step-s: allowed: 1 or more, and a positive number of seconds")
    if args.budget_min <= 0:
        raise SystemExit(f"--budget-min: got {args.budget_min:g}; allowed: a positive number of minutes")
    tuned = plan.tune or {}
    steps = args.capacity_steps if args.capacity_steps is not None else tuned.get("capacity_steps", 6)
    return CapacitySettings(args.p99_ms, steps, args.step_s or tuned.get("step_s", 10.0))


def peer_configs(configs: Sequence[stats.Config], peer: str) -> list[stats.Config]:
    """The peer on each distinct load of the plan (its own single process, using every core)."""
    loads = [
        replace(c, strategy=peer, peer=peer, engine=None, workers=1, threads=os.cpu_count() or 1, label="")
        for c in configs
        if c.peer is None
    ]
    return list(dict.fromkeys(loads))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_suites:
        for name, s in yaml.safe_load(SUITES.read_text()).items():
            print(f"{name:12} {s.get('description', '')}")
        return 0
    texts = user_texts(args)
    plan = plan_from_args(args)
    settings = check_args(args, plan)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out / stamp
    out.mkdir(parents=True, exist_ok=True)
    header = run_header(argv, plan)
    if texts is not None:
        header["texts"] = f"{args.texts.name}: {len(texts.texts)} texts" + (
            f" (a sample of {args.sample}, seed {args.seed})" if args.sample else f" (seed {args.seed} order)"
        )
    if settings:
        header["p99 target"] = (
            f"{settings.target_ms:g} ms (capacity: at most {settings.max_steps} open-loop steps, each at least "
            f"{settings.step_s:g} s and long enough for {STEP_REQUESTS} arrivals, at most {3 * settings.step_s:g} s)"
        )
    print(f"Results: {out}")
    sweep_rows = run_offline(plan, out) if plan.sweep or args.offline else []
    if args.offline:
        print(report.offline_table(sweep_rows))
        made = [p for p in [plots.short_frac_sweep(sweep_rows, out)] if p]
        md = report.render_markdown("Offline padding comparison", header, [], [], {}, sweep_rows, [], made)
        (out / "report.md").write_text(md)
        return 0

    with exit_on_signals():  # SIGTERM/SIGHUP stop our servers like Ctrl-C does
        return measure_all(args, plan, stamp, out, header, sweep_rows, texts, settings)


def measure_all(
    args: argparse.Namespace,
    plan: Plan,
    stamp: str,
    out: Path,
    header: dict[str, str],
    sweep_rows: list[Any],
    texts: Workload | None = None,
    settings: CapacitySettings | None = None,
) -> int:
    """Measure every configuration, writing results after each; the servers we started are stopped however it ends."""
    t0 = time.monotonic()
    summaries: list[stats.Summary] = []
    extra: list[str] = []
    writer = ResultsWriter(out)
    client, server = open_target(args, plan, stamp)
    bench = Bench(
        client,
        server,
        out,
        args.seed,
        not args.no_progress and sys.stderr.isatty(),
        texts,
        settings,
        args.docs_per_request,
    )
    interrupted = False

    def record(summary: stats.Summary) -> None:
        summaries.append(summary)
        writer.add(summary)
        print(report.render_block(summary))

    try:
        if server:
            print(f"starting TorchServe on {server.endpoints.inference} (token auth on)")
            server.start()  # stops what it launched if interrupted
        if plan.tune:
            result = run_tune(bench, plan, args, record, t0, out)
            extra.append(report.tune_section(result))
        else:
            for i, config in enumerate(plan.configs, 1):
                bound_tps = bench.bound(config) if plan.bound else None
                print(f"\n[{i}/{len(plan.configs)}] {config.name} on {config.workload_label}")
                record(bench.measure(config, bound_tps))
            if args.peer:
                try:
                    bench.measure_peer(peers.PEERS[args.peer], peer_configs(plan.configs, args.peer), record)
                except peers.PeerUnavailable as e:
                    print(f"\npeer skipped: {e}", file=sys.stderr)
                    header["peer"] = f"{args.peer} skipped: {e}"
    except (KeyboardInterrupt, SystemExit):
        interrupted = True
        print("\ninterrupted: results so far are kept", file=sys.stderr)
    finally:
        if server:
            server.stop()
    cmps = stats.comparisons(summaries)
    print("\n" + "\n".join(report.render_comparison(c) for c in cmps) if cmps else "")
    made = plots.all_plots(summaries, sweep_rows, out)
    histograms = {label: length_histogram(tokens) for label, tokens in bench.sent.items()}
    title = "Tuning" if plan.tune else "Batching comparison"
    md = report.render_markdown(
        title, header, summaries, cmps, histograms, sweep_rows, list(bench.bounds.values()), made, extra
    )
    (out / "report.md").write_text(md)
    print(f"\nreport: {out / 'report.md'}  ({time.monotonic() - t0:.0f} s)")
    return 130 if interrupted else 0


def run_tune(
    bench: Bench, plan: Plan, args: argparse.Namespace, record: Callable[[stats.Summary], None], t0: float, out: Path
) -> tune.TuneResult:
    """Rank candidates offline, measure what fits the budget (delays around the best), recommend, re-measure."""
    from bench.bound import calibrated_cost

    space, settings = plan.tune or {}, bench.capacity_settings
    assert settings is not None
    base = plan.configs[0]
    budget = tune.Budget(args.budget_min * 60)
    engine = base.engine or archives.default_engine()
    print(f"\ntune: calibrating the cost model on {engine}, one thread ...")
    cost = calibrated_cost(str(models.model_dir(base.model)), engine)
    print(f"  {cost}")
    ranked = tune.candidates(
        base,
        bench.workload(base)[2],
        cost,
        settings.target_ms,
        os.cpu_count() or 1,
        batch_sizes=space.get("batch_sizes", tune.BATCH_SIZES),
    )
    kept = [c for c in ranked if not c.pruned]
    print(
        f"\ntune: {len(ranked)} candidates, {len(kept)} kept by the offline estimates, "
        f"{len(ranked) - len(kept)} pruned; budget {args.budget_min:g} min"
    )
    queue = tune.first_round(ranked)
    delays_after = len({c.config.strategy for c in kept}) + 2
    default_cost = 25 + WARMUP_S + base.duration + settings.max_steps * settings.step_s * 1.3
    measured: list[stats.Summary] = []
    skipped: list[tuple[stats.Config, str]] = []
    delays_done = False
    while queue or (not delays_done and measured):
        if not delays_done and measured and (len(measured) >= delays_after or not queue):
            best = tune.rank(measured)[0].config
            queue = tune.delay_variants(best, space.get("delays", tune.DELAYS)) + queue
            delays_done = True
            continue
        config = queue.pop(0)
        elapsed = time.monotonic() - t0
        if not budget.fits(elapsed, default_cost, reserve_s=budget.expected(default_cost) + 60):
            skipped.append((config, f"budget (about {budget.expected(default_cost):.0f} s each)"))
            continue
        print(f"\n[tune {len(measured) + 1}] {config.name} on {config.workload_label} ({elapsed / 60:.1f} min used)")
        started = time.monotonic()
        try:
            summary = bench.measure(config, None)
        except ServerError as e:
            skipped.append((config, f"failed: {str(e)[:120]}"))
            continue
        finally:
            budget.costs.append(time.monotonic() - started)
        measured.append(summary)
        record(summary)
    if not measured:
        raise SystemExit("tune: nothing was measured (see above)")
    return recommend(bench, measured, skipped, ranked, record, t0, out, args.budget_min * 60)


def recommend(
    bench: Bench,
    measured: list[stats.Summary],
    skipped: list[tuple[stats.Config, str]],
    ranked: list[tune.Candidate],
    record: Callable[[stats.Summary], None],
    t0: float,
    out: Path,
    budget_s: float,
) -> tune.TuneResult:
    """Write the winner's model-config YAML and the commands that deploy it; measure it again from that YAML."""
    from model_store import build

    settings = bench.capacity_settings
    assert settings is not None
    winner = tune.rank(measured)[0]
    cfg = tune.model_config(winner.config, archives.model_config(winner.config.strategy))
    yaml_path = out / "tuned-model-config.yaml"
    shown = yaml_path.relative_to(ROOT) if yaml_path.is_relative_to(ROOT) else yaml_path
    cap = winner.capacity.rate if winner.capacity else 0.0
    # where the user applies it: the server given by URL, else the one `make serve` runs
    mgmt = (
        bench.client.endpoints.management
        if not bench.server
        else Endpoints.from_properties(read_properties(DEFAULT_PROPERTIES)).management
    )
    query = urllib.parse.urlencode({"url": f"{TUNED_NAME}.mar", "model_name": TUNED_NAME, "synchronous": "true"})
    commands = (
        f".venv/bin/python -m model_store.build --config {shown} --name {TUNED_NAME}",
        f'curl -X POST -H "Authorization: Bearer $(.venv/bin/python -m tsctl token --api management)" '
        f'"{mgmt}/models?{query}"',
    )
    comment = (
        f"# Tuned by `bench/compare.py --suite tune` on {winner.config.workload_label}: "
        f"{tune.fmt_rate(cap)} at p99 <= {settings.target_ms:g} ms on this machine.\n"
        "# Deploy it (from the repository, with `make serve` running):\n" + "".join(f"#   {c}\n" for c in commands)
    )
    yaml_path.write_text(comment + yaml.safe_dump(cfg, sort_keys=False))
    result = tune.TuneResult(
        settings.target_ms,
        budget_s,
        0.0,
        tuple(ranked),
        tuple(measured),
        tuple(skipped),
        yaml_path.name,
        yaml_path.read_text(),
        commands,
    )
    if not bench.server:
        return replace(result, elapsed_s=time.monotonic() - t0)
    print(f"\nrecommended: {winner.config.name}; building {TUNED_NAME}.mar from {yaml_path.name} ...")
    store = Path(bench.server.properties["model_store"])
    if build.main(["--config", str(yaml_path), "--name", TUNED_NAME, "--out", str(store)]) != 0:
        raise SystemExit(f"building {TUNED_NAME}.mar from {yaml_path} failed (see above)")
    bench.client.unregister(TUNED_NAME)
    reply = bench.client.call("management", "POST", f"/models?{query}", timeout=300)  # as the curl line does
    if reply.status != 200:
        raise SystemExit(f"registering {TUNED_NAME} from its YAML failed: HTTP {reply.status} {reply.text[:200]}")
    try:
        described = bench.client.call("management", "GET", f"/models/{TUNED_NAME}").json()[0]
        config = replace(winner.config, label="from YAML")
        print(f"\n{config.name} on {config.workload_label}")
        remeasured = bench.measure_target(config, bench.torchserve_target(config, TUNED_NAME), None)
    finally:
        bench.client.unregister(TUNED_NAME)
    record(remeasured)
    applied = tuple(tune.describe_matches(described, cfg))
    return replace(result, remeasured=remeasured, applied=applied, elapsed_s=time.monotonic() - t0)


if __name__ == "__main__":
    sys.exit(main())
