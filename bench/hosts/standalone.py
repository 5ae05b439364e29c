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

from bench.harness.targets import archive
from bench.harness.worker_memory import process_peak_rss_mb
from bench.hosts.host import HostRun
from bench.hosts.own_server import OwnServerModel
from bench.inputs.job import Job
from tsctl import ServerError, free_ports, group_cpu_seconds
from tsctl.standalone import Standalone

NAME = "standalone"
START_TIMEOUT_S = 300.0  # until every worker is ready (a cold start loads the model once per worker)
LOG_LEVEL = "warning"  # no access line per request in its log (as the peers are run)


class StandaloneModel(OwnServerModel[Standalone]):
    """One job's configuration on a standalone server of its own, as a target (`targets.Target`): started on
    entry (ready when it returns), stopped on exit however the run ends."""

    WHAT = "the standalone server"

    def make_server(self, job: Job, run: HostRun) -> Standalone:
        return Standalone(run.work / NAME / self.name, free_ports(1)[0])

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

    def cpu(self) -> float | None:
        pid = self.live_pid()
        return group_cpu_seconds(pid) if pid else None  # its own session: the group id is its pid

    def counters(self) -> dict[str, float]:
        return self.scrape()

    def peak_rss_mb(self) -> float | None:
        pid = self.live_pid()
        return process_peak_rss_mb(pid) if pid else None


def target(job: Job, run: HostRun) -> StandaloneModel:
    return StandaloneModel(job, run)
