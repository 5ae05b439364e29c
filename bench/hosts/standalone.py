"""`standalone`: the configuration's archive on a standalone server of its own (`python -m
bucketing.hosts.standalone`, docs/hosts/standalone.md), started for the job and stopped after it.

The server is started and stopped through tsctl's safe start and stop (`tsctl.standalone.Standalone`: its own
folder, pid file and key file, its own session; a failed or interrupted start stops what it launched; the stop
signals only a process whose identity it checked, SIGTERM then SIGKILL), on a free loopback port. It is given the
archive TorchServe registers and the registration's settings as flags (batch size, max batch delay, workers,
threads), so both hosts run the same handler settings; its `/metrics` carries the same `bucket_*` counters, read
for the handler's figures. Its workers are threads of one process: the CPU and peak RSS read are that process's.
"""

from __future__ import annotations

from types import TracebackType

from bench.harness import stats
from bench.harness.targets import answers_cosine, archive, engine_of, model_name
from bench.harness.worker_memory import process_peak_rss_mb
from bench.hosts.host import HostRun
from bench.inputs.job import Job
from bench.inputs.workloads import RERANK
from bucketing.protocols import cohere_rerank
from tsctl import ServerError, free_ports, group_cpu_seconds, request
from tsctl.standalone import Standalone

NAME = "standalone"
START_TIMEOUT_S = 300.0  # until every worker is ready (a cold start loads the model once per worker)
LOG_LEVEL = "warning"  # no access line per request in its log (as the peers are run)


class StandaloneModel:
    """One job's configuration on a standalone server of its own, as a target (`targets.Target`): started on
    entry (ready when it returns), stopped on exit however the run ends."""

    device = "cpu"  # the standalone host runs its workers on the CPU

    def __init__(self, job: Job, run: HostRun) -> None:
        c = job.config
        self.config, self.store, self.name = c, run.store, model_name(c)
        self.server = Standalone(run.work / NAME / self.name, free_ports(1)[0])
        route = f"/1.0/{cohere_rerank.PATH}" if c.workload == RERANK else ""
        self.url = f"{self.server.url}/predictions/{self.name}{route}"
        self.engine = engine_of(c)

    def arguments(self) -> tuple[list[str], list[str]]:
        """Its model (the archive TorchServe registers, under the same name) and the registration's settings."""
        c = self.config
        source = ["--archive", str(self.store / archive(self.store, c)), "--name", self.name]
        extra = ["--workers", str(c.workers), "--threads", str(c.threads), "--batch-size", str(c.batch_size)]
        return source, [*extra, "--max-batch-delay", str(c.max_batch_delay), "--log-level", LOG_LEVEL]

    def __enter__(self) -> StandaloneModel:
        source, extra = self.arguments()
        print(f"  starting the standalone server on {self.server.url} (log {self.server.log})")
        try:
            self.server.start(source, extra, START_TIMEOUT_S)  # stops what it launched if it fails or is interrupted
        except ServerError as e:
            raise SystemExit(f"{self.config.name}: the standalone server did not start: {e}") from None
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.server.stop()

    def bodies(self, job: Job) -> list[bytes]:
        return job.load.bodies

    def headers(self) -> dict[str, str]:
        return self.server.headers()

    def _pid(self) -> int | None:
        process = self.server.process
        return process.pid if process is not None and process.poll() is None else None

    def cpu(self) -> float | None:
        pid = self._pid()
        return group_cpu_seconds(pid) if pid else None  # its own session: the group id is its pid

    def counters(self) -> dict[str, float]:
        reply = request(f"{self.server.url}/metrics", headers=self.headers())
        if reply.status != 200:
            raise SystemExit(f"{self.config.name}: the standalone server's /metrics answered HTTP {reply.status}")
        return stats.parse_prometheus(reply.body.decode(errors="replace"), self.name)

    def peak_rss_mb(self) -> float | None:
        pid = self._pid()
        return process_peak_rss_mb(pid) if pid else None

    def fidelity(self, job: Job) -> float | None:
        """The lowest cosine of its answers to the job's picks against their references (as TorchServe's)."""
        return answers_cosine(self.url, self.headers(), job)


def target(job: Job, run: HostRun) -> StandaloneModel:
    return StandaloneModel(job, run)
