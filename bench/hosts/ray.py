"""`ray`: the configuration's archive on a local single-node Ray Serve cluster of its own (`bucketing.hosts.ray`,
docs/hosts/ray.md), started for the job and stopped after it.

The cluster is started and stopped through tsctl's safe start and stop (`tsctl.ray.RayServe`: one head node on
127.0.0.1, its own folder, pid file, key file, Ray temp folder and token; a failed or interrupted start stops what it
launched; the stop signals only a Ray head whose identity it checked, never `ray stop`), its HTTP on a free loopback
port. The application is `config/ray/serve.yaml` with the configuration's batch settings (batch size, max batch
delay) and workers x threads as replicas x threads: a fixed `num_replicas` (no autoscaling, so every host runs the
same workers), each replica one worker of `threads` torch threads, the node `workers x threads` CPUs.

Its `/metrics` (the ingress's) carries the handler's `bucket_*` counters summed over the replicas, as each replica
last pushed them (every `PUSH_S`): `counters` waits `COUNTERS_WAIT_S` first, so a read right after the load sees
all of it. CPU is the head's process tree's (`tree_cpu_seconds`: GCS, raylet, the replicas' and
ingress's workers); peak RSS is not read (None: the replicas are processes of their own, not the head).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from bench.harness import stats
from bench.harness.targets import answers_cosine, archive, engine_of, model_name
from bench.hosts.host import HostRun
from bench.inputs.configuration import Configuration
from bench.inputs.job import Job
from bench.inputs.workloads import RERANK
from bucketing.hosts.ray.board import PUSH_S
from bucketing.protocols import cohere_rerank
from tsctl import ServerError, free_ports, request
from tsctl.identity import stat_fields
from tsctl.ray import CONFIG, RayServe

NAME = "ray"
START_TIMEOUT_S = 600.0  # the head, `serve run`, then every replica's worker opened
COUNTERS_WAIT_S = 2 * PUSH_S + 0.5


def application(config: Configuration, name: str) -> dict[str, Any]:
    """`config/ray/serve.yaml` with the configuration's batching and `workers` replicas of `threads` threads."""
    base: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    app = base["applications"][0]
    model = app["args"]["models"][0]
    shipped = model.get("name")
    model.update(
        {"batch_size": config.batch_size, "max_batch_delay_ms": config.max_batch_delay, "threads": config.threads}
    )
    for deployment in app.get("deployments", []):
        if deployment.get("name") == shipped:
            deployment.pop("autoscaling_config", None)
            deployment["num_replicas"] = config.workers
            deployment["max_ongoing_requests"] = 2 * config.batch_size  # one batch running, the next filling
    return base


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) of `root` and every live descendant: the Ray head, its GCS and raylet, and the
    raylet's workers (the replicas and the ingress; the head's process group missed them: 0.08 cores read in a smoke
    run of 37 req/s on one replica)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        fields = stat_fields(pid)
        if fields:
            total += (int(fields[11]) + int(fields[12])) / tick
        todo += children.get(pid, [])
    return total


class RayModel:
    """One job's configuration on a Ray cluster of its own, as a target (`targets.Target`): started on entry (ready
    when it returns), stopped on exit however the run ends."""

    device = "cpu"

    def __init__(self, job: Job, run: HostRun) -> None:
        c = job.config
        self.config, self.store, self.name = c, run.store, model_name(c)
        self.server = RayServe(run.work / NAME / self.name, free_ports(1)[0], num_cpus=c.workers * c.threads)
        route = f"/1.0/{cohere_rerank.PATH}" if c.workload == RERANK else ""
        self.url = f"{self.server.url}/predictions/{self.name}{route}"
        self.engine = engine_of(c)

    def archive_path(self) -> Path:
        """The archive TorchServe registers (built first when missing or stale)."""
        return self.store / archive(self.store, self.config)

    def __enter__(self) -> RayModel:
        print(f"  starting a Ray cluster on {self.server.url} (log {self.server.log})")
        base = application(self.config, self.name)
        try:  # stops what it launched if it fails or is interrupted
            self.server.start(
                self.archive_path(),
                self.name,
                threads=self.config.threads,
                base=base,
                timeout=START_TIMEOUT_S,
            )
        except ServerError as e:
            raise SystemExit(f"{self.config.name}: the Ray cluster did not start: {e}") from None
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.server.stop()

    def bodies(self, job: Job) -> list[bytes]:
        return job.load.bodies

    def headers(self) -> dict[str, str]:
        return self.server.headers()

    def cpu(self) -> float | None:
        process = self.server.process
        alive = process is not None and process.poll() is None
        return tree_cpu_seconds(process.pid) if alive and process is not None else None

    def counters(self) -> dict[str, float]:
        time.sleep(COUNTERS_WAIT_S)  # every replica's last figures pushed
        reply = request(f"{self.server.url}/metrics", headers=self.headers())
        if reply.status != 200:
            raise SystemExit(f"{self.config.name}: the Ray host's /metrics answered HTTP {reply.status}")
        return stats.parse_prometheus(reply.body.decode(errors="replace"), self.name)

    def peak_rss_mb(self) -> float | None:
        return None  # the replicas are Ray workers of their own, not read

    def fidelity(self, job: Job) -> float | None:
        """The lowest cosine of its answers to the job's picks against their references (as TorchServe's)."""
        return answers_cosine(self.url, self.headers(), job)


def target(job: Job, run: HostRun) -> RayModel:
    return RayModel(job, run)
