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
from typing import Any

import yaml

from bench.harness.targets import archive
from bench.hosts.host import HostRun
from bench.hosts.own_server import OwnServerModel
from bench.inputs.configuration import Configuration
from bench.inputs.job import Job
from bucketing.hosts.ray.args import fix_replicas
from bucketing.hosts.ray.board import PUSH_S
from tsctl import ServerError, free_ports
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
            fix_replicas(deployment, config.workers)
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


class RayModel(OwnServerModel[RayServe]):
    """One job's configuration on a Ray cluster of its own, as a target (`targets.Target`): started on entry (ready
    when it returns), stopped on exit however the run ends."""

    WHAT = "the Ray host"

    def make_server(self, job: Job, run: HostRun) -> RayServe:
        c = job.config
        return RayServe(run.work / NAME / self.name, free_ports(1)[0], num_cpus=c.workers * c.threads)

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

    def cpu(self) -> float | None:
        pid = self.live_pid()
        return tree_cpu_seconds(pid) if pid else None

    def counters(self) -> dict[str, float]:
        time.sleep(COUNTERS_WAIT_S)  # every replica's last figures pushed
        return self.scrape()

    def peak_rss_mb(self) -> float | None:
        return None  # the replicas are Ray workers of their own, not read


def target(job: Job, run: HostRun) -> RayModel:
    return RayModel(job, run)
