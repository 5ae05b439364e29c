"""The runner: measure one configuration against a target (register, warm up, load, read the figures, unregister;
then its capacity at the p99 target), and the peers on the same load."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bucketing.protocols import cohere_rerank
from model_store import archives
from model_store import build as archive_build
from tsctl import Client, TorchServe, group_cpu_seconds

from . import capacity, load, models, peers, stats, traffic
from .capacity import START_SHARE, STEP_REQUESTS, CapacitySettings
from .configuration import Configuration
from .workloads import DOCS_PER_REQUEST, RERANK, Workload, make_workload, rerank_requests

WARMUP_S = 3.0
MAX_REQUESTS = 20000  # per configuration: the load is bounded in count as well as time
WORKLOAD_TEXTS = 2000  # texts drawn for a generated workload
FIDELITY_TEXTS = 32  # texts of the run, spread over its lengths, each configuration's answers are checked on


@dataclass(frozen=True)
class Bodies:
    """A configuration's load: the texts, the request bodies, and each body's tokens as served."""

    workload: Workload
    bodies: list[bytes]
    tokens: list[int]
    pair_tokens: list[list[int]] | None = None  # the rerank workload: each body's pair token counts


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


def build_archives(
    store: Path,
    threads: int = 1,
    strategies: Sequence[str] | None = None,
    engine: str | None = None,
    model: str | None = None,
    task: str = "embedding",
    schedule: str | None = None,
    dtype: str | None = None,
) -> None:
    """Build the archives that are missing or older than their sources (the one staleness rule)."""
    spec = archive_build.ArchiveSpec(
        strategies=tuple(strategies or archive_build.STRATEGIES),
        threads=threads,
        engine=engine,
        model_dir=models.model_dir(model) if model is not None else None,
        task=task if model is not None else None,
        prefix=models.prefix(model, engine, schedule, dtype),
        schedule=schedule,
        max_length=models.archive_max_length(model),
        dtype=dtype,
    )
    try:
        archive_build.build_archives(store, spec, if_stale=True)
    except archive_build.BuildError as e:
        raise SystemExit(f"building the archives failed: {e}") from None


def engine_of(config: Configuration) -> str:
    """The engine a configuration's workers run: its own, torch for a reduced dtype, else the shipped archives'."""
    reduced = config.dtype not in (None, "float32")
    return config.engine or ("torch" if reduced else archives.default_engine())


class Runner:
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
        self._bodies: dict[tuple[str, float, str | None], Bodies] = {}
        self.bounds: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.sent: dict[str, list[int]] = {}  # per workload: token counts of every measured request sent
        self.gemm_per_core: dict[str, float] = {}  # GEMM FLOP/s of one thread per dtype, measured once per run
        self.references: dict[tuple[str | None, tuple[str, ...]], list[list[float]]] = {}  # float32, batch of one

    def count_sent(self, config: Configuration, result: load.LoadResult) -> None:
        """Token counts of what was sent, for the report's histogram: each text (each pair of a rerank request)."""
        bodies = self.bodies(config)
        sent = self.sent.setdefault(config.workload_label, [])
        if bodies.pair_tokens is not None:
            sent.extend(n for s in result.samples for n in bodies.pair_tokens[s.body_index])
        else:
            sent.extend(bodies.tokens[s.body_index] for s in result.samples)

    def bound(self, config: Configuration) -> float:
        """The exact-length grouping rate of this workload and worker layout (real tokens/s), measured once per run."""
        engine = config.engine or archives.default_engine()
        key = (config.workload_label, config.workers, config.threads, engine, config.model)
        if key not in self.bounds:
            from bench.exact_length import exact_length_rate

            w = self.bodies(config).workload
            print(
                f"exact-length grouping: {w.label}, {config.workers} processes x {config.threads} thread, {engine} ..."
            )
            folder = str(models.model_dir(config.model))
            b = exact_length_rate(w.texts[:800], folder, config.workers, config.threads, engine=engine)
            self.bounds[key] = {"workload": config.workload_label, "model": models.label(config.model), **b}
            print(f"  {b['tokens_per_s']:.0f} real tokens/s")
            (self.out / "bound.json").write_text(json.dumps(list(self.bounds.values()), indent=1))
        return self.bounds[key]["tokens_per_s"]

    def roofline(self, config: Configuration) -> float:
        """The GEMM roofline of this configuration's dtype, model, texts and cores (real tokens/s)."""
        from bench.roofline import gemm_flops_per_core, roofline_tokens_per_s

        dtype = config.dtype or "float32"
        if dtype not in self.gemm_per_core:
            self.gemm_per_core[dtype] = gemm_flops_per_core(dtype=dtype)
            print(f"{dtype} GEMM: {self.gemm_per_core[dtype] / 1e9:.1f} GFLOP/s per core (one thread)")
        bodies = self.bodies(config)
        lengths = [n for p in bodies.pair_tokens for n in p] if bodies.pair_tokens is not None else bodies.tokens
        cores = min(config.workers * config.threads, os.cpu_count() or 1)
        mean = sum(lengths) / max(1, len(lengths))
        return roofline_tokens_per_s(models.model_dir(config.model), mean, cores, self.gemm_per_core[dtype])

    def fidelity(self, config: Configuration, target: Target) -> float | None:
        """The lowest cosine of the configuration's answers against our float32 batch-of-one reference (torch), on
        `FIDELITY_TEXTS` of the run's texts spread over their lengths; None for the rerank workload (scores)."""
        if config.workload == RERANK:
            return None
        from tsctl.client import request

        bodies = self.bodies(config)
        by_length = sorted(range(len(bodies.workload.texts)), key=lambda i: bodies.tokens[i])
        step = max(1, len(by_length) // FIDELITY_TEXTS)
        picks = tuple(bodies.workload.texts[i] for i in by_length[::step][:FIDELITY_TEXTS])
        key = (config.model, picks)
        if key not in self.references:
            self.references[key] = peers.reference_embeddings(picks, models.model_dir(config.model))
        headers = {"Content-Type": "application/json", **target.headers()}
        reply = request(target.url, "POST", json.dumps({"texts": list(picks)}), headers)
        if reply.status != 200:
            raise SystemExit(f"{config.name}: the fidelity check got HTTP {reply.status}: {reply.body[:200]!r}")
        answers = [a["embedding"] for a in json.loads(reply.body)]
        return min(peers.cosine(a, b) for a, b in zip(answers, self.references[key], strict=True))

    def bodies(self, config: Configuration) -> Bodies:
        """The texts of a configuration's workload (the user's file for `file:`), their bodies and token counts."""
        key = (config.workload, config.short_frac if config.workload == "mixed" else 0.0, config.model)
        if key not in self._bodies:
            tokenizer = models.tokenizer(config.model, models.task(config.workload))  # as the archive cuts
            if config.workload == RERANK:
                self._bodies[key] = self.rerank_bodies(tokenizer)
                return self._bodies[key]
            if config.workload.startswith(traffic.PREFIX):
                if self.texts is None or self.texts.name != config.workload:
                    raise SystemExit(f"workload {config.workload}: give the file with --texts")
                w = self.texts
            else:
                w = make_workload(config.workload, WORKLOAD_TEXTS, self.seed, short_frac=config.short_frac)
            bodies = [json.dumps({"text": t}).encode() for t in w.texts]
            tokens = [len(e.ids) for e in tokenizer.encode(w.texts)]  # as served: cut at max_length
            self._bodies[key] = Bodies(w, bodies, tokens)
        return self._bodies[key]

    def rerank_bodies(self, tokenizer: Any) -> Bodies:
        """Cohere-style rerank bodies (a query, `docs_per_request` documents) and each request's pair tokens."""
        requests = rerank_requests(WORKLOAD_TEXTS // self.docs_per_request + 1, self.docs_per_request, self.seed)
        documents = tuple(d for _, docs in requests for d in docs)
        w = Workload(RERANK, documents, tuple(0 for _ in documents), self.seed)
        bodies = [json.dumps({"query": q, "documents": list(docs)}).encode() for q, docs in requests]
        pairs = [[len(e.ids) for e in tokenizer.encode_pairs([(q, d) for d in docs])] for q, docs in requests]
        return Bodies(w, bodies, [sum(p) for p in pairs], pairs)

    def archive(self, config: Configuration) -> str:
        name = archives.name(
            config.strategy,
            config.threads,
            models.prefix(config.model, config.engine, config.schedule, config.dtype),
        )
        if self.server:
            store = Path(self.server.properties["model_store"])
            build_archives(
                store,
                config.threads,
                [config.strategy],
                config.engine,
                config.model,
                models.task(config.workload),
                config.schedule,
                config.dtype,
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

    def run_load(self, config: Configuration, target: Target, duration: float, label: str) -> load.LoadResult:
        bar = load.Progress(label, duration, self.progress)
        if config.mode == "open":
            rate = config.rate or 1.0
            coro = load.open_loop(
                target.url, target.bodies, target.headers, rate, duration, MAX_REQUESTS, self.seed, bar
            )
        else:
            clients = config.concurrency
            coro = load.closed_loop(target.url, target.bodies, target.headers, clients, duration, MAX_REQUESTS, bar)
        return asyncio.run(coro)

    def torchserve_target(self, config: Configuration, model: str) -> Target:
        """The load target of a model registered on our TorchServe."""
        route = f"/1.0/{cohere_rerank.PATH}" if config.workload == RERANK else ""
        return Target(
            url=f"{self.client.endpoints.inference}/predictions/{model}{route}",
            bodies=self.bodies(config).bodies,
            headers=lambda: self.client.keys.headers("inference"),
            cpu=self.cpu,
            counters=lambda: stats.parse_prometheus(self.client.metrics(), model),
            engine=engine_of(config),
            device=self.device(model),
        )

    def measure(self, config: Configuration, bound_tps: float | None = None) -> stats.Summary:
        """Register the configuration, measure it, unregister it."""
        model = (
            f"bench-{config.strategy}-bs{config.batch_size}-d{config.max_batch_delay}-{config.workers}x{config.threads}"
            + (f"-{config.engine}" if config.engine else "")
            + (f"-{config.schedule}" if config.schedule else "")
            + (f"-{config.dtype}" if config.dtype else "")
            + (f"-{models.prefix(config.model, None)}" if config.model else "")
        )
        self.client.unregister(model)
        self.client.register(self.archive(config), model, config.batch_size, config.max_batch_delay, config.workers)
        try:
            target = self.torchserve_target(config, model)
            summary = self.measure_target(config, target, bound_tps)
            return replace(summary, min_cosine=self.fidelity(config, target))
        finally:
            self.client.unregister(model)

    def measure_target(self, config: Configuration, target: Target, bound_tps: float | None) -> stats.Summary:
        """Warm up, load, read the figures; then the capacity search when a p99 target was given."""
        tokens = self.bodies(config).tokens
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
        summary = replace(summary, roofline_tokens_per_s=self.roofline(config))
        if self.capacity_settings:
            start = (config.rate or 1.0) if config.mode == "open" else START_SHARE * summary.rps
            summary = replace(summary, capacity=self.search_capacity(config, target, start))
        return summary

    def search_capacity(self, config: Configuration, target: Target, start: float) -> capacity.Capacity:
        """The highest open-loop rate within the p99 target (each step's requests are reported)."""
        settings = self.capacity_settings
        assert settings is not None

        def step(rate: float) -> capacity.Step:
            duration = capacity.step_duration(rate, settings.step_s, STEP_REQUESTS, settings.max_step_s)
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
        self, spec: peers.PeerSpec, configs: Sequence[Configuration], record: Callable[[stats.Summary], None]
    ) -> None:
        """Start the peer once per batch size, spot-check its answers, measure it on each configuration's load."""
        python = peers.venv(spec, progress=self.progress)
        for batch_size in dict.fromkeys(c.batch_size for c in configs):
            group = [c for c in configs if c.batch_size == batch_size]
            folder = models.model_dir(group[0].model)
            print(f"\nstarting {spec.name} (batch size {batch_size}) ...")
            with peers.PeerServer(spec, python, folder, batch_size, self.out / "logs") as server:
                bodies = self.bodies(group[0])
                by_length = sorted(range(len(bodies.workload.texts)), key=lambda i: bodies.tokens[i])
                picks = [bodies.workload.texts[by_length[k * (len(by_length) - 1) // 7]] for k in range(8)]
                cos = peers.spot_check(server, picks, folder)
                print(f"  answers: lowest cosine {cos:.6f} against our batch-of-one reference (8 texts)")
                for config in group:
                    target = Target(
                        url=server.url,
                        bodies=[spec.body(t) for t in self.bodies(config).workload.texts],
                        headers=dict,
                        cpu=server.cpu,
                        counters=dict,
                        engine="torch",
                        device="cpu",
                    )
                    print(f"\n{config.name} on {config.workload_label}")
                    record(replace(self.measure_target(config, target, None), min_cosine=cos))
