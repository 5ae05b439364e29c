"""The target seam: where a job's load goes. A target is a context manager (entered: ready to answer; left:
stopped or unregistered) with one interface, the `Target` protocol; the run loop knows no other. Three kinds serve
it: a model registered on a TorchServe (`TorchServeModel`, here), our worker on another host (`hosts/`: the
standalone server), and a peer server (`peers.PeerServer`). What every host of our worker shares is here too: the
archive a configuration runs (`archive`), the registered name (`model_name`), the engine (`engine_of`) and the
fidelity check of its answers (`answers_cosine`)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from bench.harness import stats
from bench.harness.worker_memory import workers_peak_rss_mb
from bench.inputs import models
from bench.inputs.configuration import Configuration
from bench.inputs.job import Job
from bench.inputs.references import cosine
from bench.inputs.workloads import RERANK
from bucketing.config import STRATEGIES
from bucketing.protocols import cohere_rerank
from model_store import archives
from model_store import build as archive_build
from tsctl import Client, Endpoints, TorchServe, group_cpu_seconds, read_properties
from tsctl.process import DEFAULT_PROPERTIES


class Target(Protocol):
    """Where one job's load goes, and how to read the server it measures."""

    @property
    def url(self) -> str:
        """Where each request is posted."""
        ...

    @property
    def engine(self) -> str:
        """What runs the model (the report's `engine`)."""
        ...

    @property
    def device(self) -> str:
        """Where the model runs: cpu, gpu, or unknown."""
        ...

    def __enter__(self) -> Self:
        """Start or register; ready to answer when it returns."""
        ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Unregister or stop what `__enter__` started."""

    def bodies(self, job: Job) -> list[bytes]:
        """The job's request bodies in this server's wire format."""
        ...

    def headers(self) -> dict[str, str]:
        """Headers each request carries (a fresh token, where the server wants one)."""
        ...

    def cpu(self) -> float | None:
        """CPU seconds the server's processes have used so far (None: not known)."""
        ...

    def counters(self) -> dict[str, float]:
        """The handler's counters ({} where the server has none)."""
        ...

    def peak_rss_mb(self) -> float | None:
        """The largest peak RSS (MB) of the processes that run the model (None: not known)."""
        ...

    def fidelity(self, job: Job) -> float | None:
        """The lowest cosine of this server's answers against our float32 reference (None: not checked)."""
        ...


def engine_of(config: Configuration) -> str:
    """The engine a configuration's workers run: its own, torch for a reduced dtype, else the shipped archives'."""
    reduced = config.dtype not in (None, "float32")
    return config.engine or ("torch" if reduced else archives.default_engine())


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
        strategies=tuple(strategies or STRATEGIES),
        threads=threads,
        engine=engine,
        model_dir=models.model_dir(model) if model is not None else None,
        task=task if model is not None else None,
        prefix=models.prefix(model, engine, schedule, dtype),
        schedule=schedule,
        max_length=models.archive_max_length(model),
        dtype=dtype,
        settings=models.archive_settings(model),
    )
    try:
        archive_build.build_archives(store, spec, if_stale=True)
    except archive_build.BuildError as e:
        raise SystemExit(f"building the archives failed: {e}") from None


def model_name(config: Configuration) -> str:
    """The name a configuration's model is registered under."""
    return (
        f"bench-{config.strategy}-bs{config.batch_size}-d{config.max_batch_delay}-{config.workers}x{config.threads}"
        + (f"-{config.engine}" if config.engine else "")
        + (f"-{config.schedule}" if config.schedule else "")
        + (f"-{config.dtype}" if config.dtype else "")
        + (f"-{models.prefix(config.model, None)}" if config.model else "")
    )


def archive(store: Path | None, config: Configuration) -> str:
    """The configuration's archive file name in `store`, built first when missing or stale (None: a store not
    ours, which must already hold it)."""
    prefix = models.prefix(config.model, config.engine, config.schedule, config.dtype)
    name = archives.name(config.strategy, config.threads, prefix)
    if store is not None:
        task = models.task(config.workload)
        strategies = [config.strategy]
        build_archives(
            store, config.threads, strategies, config.engine, config.model, task, config.schedule, config.dtype
        )
    return f"{name}.mar"


def answers_cosine(url: str, headers: dict[str, str], job: Job) -> float | None:
    """The lowest cosine of the answers at `url` to the job's picks (our JSON body, one request) against their
    float32 references (None: the job has none); an answer other than 200 ends the run with its one line."""
    if job.references is None:
        return None
    from tsctl.client import request

    reply = request(
        url, "POST", json.dumps({"texts": list(job.picks)}), {"Content-Type": "application/json", **headers}
    )
    if reply.status != 200:
        raise SystemExit(f"{job.config.name}: the fidelity check got HTTP {reply.status}: {reply.body[:200]!r}")
    answers = [a["embedding"] for a in json.loads(reply.body)]
    return min(cosine(a, b) for a, b in zip(answers, job.references, strict=True))


class TorchServeSite:
    """A TorchServe the bench talks to: its client, and the server itself when the bench started it (None: a
    running server given by URL, whose model store must already hold the archives)."""

    def __init__(self, client: Client, server: TorchServe | None) -> None:
        self.client, self.server = client, server

    @property
    def store(self) -> Path | None:
        return Path(self.server.properties["model_store"]) if self.server else None

    @property
    def user_management_url(self) -> str:
        """Where a user applies a tuned model: the server given by URL, else the one `make serve` runs."""
        if self.server is None:
            return self.client.endpoints.management
        return Endpoints.from_properties(read_properties(DEFAULT_PROPERTIES)).management

    def archive(self, config: Configuration) -> str:
        """The configuration's archive file name (built first, when the store is ours; a server of someone else's
        must have it in its model store)."""
        return archive(self.store, config)

    def device(self, model: str) -> str:
        """Where the model's workers run, as TorchServe's describe API says (`gpu` per worker)."""
        reply = self.client.call("management", "GET", f"/models/{model}")
        workers = reply.json()[0].get("workers", []) if reply.status == 200 else []
        return "gpu" if any(w.get("gpu") for w in workers) else "cpu" if workers else "unknown"

    def cpu(self) -> float | None:
        pid = self.server.pid() if self.server else None
        return group_cpu_seconds(os.getpgid(pid)) if pid else None

    def workers_peak_rss_mb(self) -> float | None:
        """The largest peak RSS of the workers alive on our server (the one model registered); None: not ours."""
        pid = self.server.pid() if self.server else None
        return workers_peak_rss_mb(os.getpgid(pid)) if pid else None

    def model(self, job: Job) -> TorchServeModel:
        """The target of a job: its archive registered under its own name while entered."""
        return TorchServeModel(self, job.config, model_name(job.config))


class TorchServeModel:
    """A model on a TorchServe as a target: registered on entry (unless `registered`: by someone else, as the
    tuned model is), unregistered on exit."""

    def __init__(self, site: TorchServeSite, config: Configuration, name: str, registered: bool = False) -> None:
        self.site, self.config, self.name, self.registered = site, config, name, registered
        route = f"/1.0/{cohere_rerank.PATH}" if config.workload == RERANK else ""
        self.url = f"{site.client.endpoints.inference}/predictions/{name}{route}"
        self.engine = engine_of(config)
        self.device = "unknown"

    def __enter__(self) -> TorchServeModel:
        client, c = self.site.client, self.config
        if not self.registered:
            client.unregister(self.name)
            client.register(self.site.archive(c), self.name, c.batch_size, c.max_batch_delay, c.workers)
        try:
            self.device = self.site.device(self.name)
        except BaseException:
            client.unregister(self.name)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.site.client.unregister(self.name)

    def bodies(self, job: Job) -> list[bytes]:
        return job.load.bodies

    def headers(self) -> dict[str, str]:
        return self.site.client.keys.headers("inference")

    def cpu(self) -> float | None:
        return self.site.cpu()

    def counters(self) -> dict[str, float]:
        return stats.parse_prometheus(self.site.client.metrics(), self.name)

    def peak_rss_mb(self) -> float | None:
        return self.site.workers_peak_rss_mb()

    def fidelity(self, job: Job) -> float | None:
        """The lowest cosine of the model's answers to the job's picks against their references."""
        return answers_cosine(self.url, self.headers(), job)
