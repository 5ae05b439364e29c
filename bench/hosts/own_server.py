"""What a host whose servers the bench starts itself (standalone, Ray) has in common as a target: one job's
configuration on a server of its own (a `tsctl.served.ServedFolder`), its URL and headers, its live pid, its
`/metrics` counters and the fidelity check; each host says how the server starts and what it reads of it."""

from __future__ import annotations

from types import TracebackType
from typing import Generic, TypeVar

from bench.harness import stats
from bench.harness.targets import answers_cosine, engine_of, model_name
from bench.hosts.host import HostRun
from bench.inputs.job import Job
from bench.inputs.workloads import RERANK
from bucketing.protocols import cohere_rerank
from tsctl import request
from tsctl.served import ServedFolder

Server = TypeVar("Server", bound=ServedFolder)


class OwnServerModel(Generic[Server]):
    """A job's configuration on `server` (made by `make_server`), a target (`targets.Target`) once a host adds
    `__enter__`, `cpu`, `counters` and `peak_rss_mb`; stopped on exit however the run ends."""

    device = "cpu"  # these hosts run their workers on the CPU
    WHAT = "the server"  # in errors

    def __init__(self, job: Job, run: HostRun) -> None:
        c = job.config
        self.config, self.store, self.name = c, run.store, model_name(c)
        self.server = self.make_server(job, run)
        route = f"/1.0/{cohere_rerank.PATH}" if c.workload == RERANK else ""
        self.url = f"{self.server.url}/predictions/{self.name}{route}"
        self.engine = engine_of(c)

    def make_server(self, job: Job, run: HostRun) -> Server:
        raise NotImplementedError

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.server.stop()

    def bodies(self, job: Job) -> list[bytes]:
        return job.load.bodies

    def headers(self) -> dict[str, str]:
        return self.server.headers()

    def live_pid(self) -> int | None:
        """The launched server's pid while it runs."""
        process = self.server.process
        return process.pid if process is not None and process.poll() is None else None

    def scrape(self) -> dict[str, float]:
        """The `bucket_*` counters of the server's `/metrics`."""
        reply = request(f"{self.server.url}/metrics", headers=self.headers())
        if reply.status != 200:
            raise SystemExit(f"{self.config.name}: {self.WHAT}'s /metrics answered HTTP {reply.status}")
        return stats.parse_prometheus(reply.body.decode(errors="replace"), self.name)

    def fidelity(self, job: Job) -> float | None:
        """The lowest cosine of its answers to the job's picks against their references (as TorchServe's)."""
        return answers_cosine(self.url, self.headers(), job)


__all__ = ["OwnServerModel"]
