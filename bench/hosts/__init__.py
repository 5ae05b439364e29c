"""The hosts our worker is measured on, side by side: `--hosts torchserve,standalone` (a configuration axis;
default: each configuration's own host, torchserve) runs each configuration on each host in turn, with the same
archive, engine, precision, batch settings (batch size, max batch delay), workers x threads and load; the results
name the host (`host` column, `... on standalone` in names and plots) and the report compares the hosts pair by
pair (`report.host_sections`).

`HOSTS` is the registry, one module a host (`host.Host`): `torchserve` (the configuration's archive registered on
the run's TorchServe), `standalone` (the same archive on a standalone server of its own, started and stopped
through tsctl's safe start and stop on a free loopback port) and `ray` (the same archive on a local single-node Ray
Serve cluster of its own, workers x threads as replicas x threads, through `tsctl.ray`'s safe start and stop).

A new host is one module here and one line in `HOSTS`. The module has:

- `NAME`: its name in `--hosts`, in `Configuration.host`, the `host` column and the report;
- `target(job, run)`: the job's target (`harness.targets.Target`), given what the run gives every host
  (`host.HostRun`: the run's TorchServe, the model store, a work folder). Entered, it serves `job.config` (its
  archive from `targets.archive(run.store, config)`, under `targets.model_name(config)`; its batch size, max batch
  delay, workers and threads) and returns once ready to answer; left, it ends everything it started, on every path
  (an exception, Ctrl-C; SIGTERM and SIGHUP arrive as the same, `tsctl.exit_on_signals`). Between, it answers the
  protocol's reads: `url` (our JSON body's route) and `headers`, `bodies`, `engine` (`targets.engine_of`) and
  `device`, `cpu` (its processes' CPU seconds), `counters` (the `bucket_*` counters, `stats.parse_prometheus` of
  its Prometheus text), `peak_rss_mb`, and `fidelity` (`targets.answers_cosine` on its answers).

Nothing else changes: the axis, its check, the `host` column, the report's host sections, the plots and every run
kind that measures through `RunContext.target` (matrix, bulk) follow from `HOSTS`. Kinds that drive TorchServe
themselves (tune, long) refuse other hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from bench.harness.options import flag
from bench.harness.run_plan import csv_list
from bench.harness.targets import Target
from bench.hosts import ray, standalone, torchserve
from bench.hosts.host import Host, HostRun
from bench.inputs.configuration import TORCHSERVE, Configuration
from bench.inputs.job import Job

HOSTS: dict[str, Host] = {
    torchserve.NAME: torchserve,  # the archive registered on the run's TorchServe (the default)
    standalone.NAME: standalone,  # the same archive on a standalone server of its own
    ray.NAME: ray,  # the same archive on a local single-node Ray Serve cluster of its own
}


@dataclass(frozen=True)
class HostFlags:
    """The hosts' flag (`options.flag`, read with `options.of(HostFlags)`)."""

    hosts: str | None = flag(
        None,
        f"comma list of {','.join(HOSTS)}: where our worker runs, each configuration on each host in turn with the "
        f"same archive and settings (a configuration axis; default: {TORCHSERVE})",
    )


FLAGS = HostFlags


def across(
    configs: Sequence[Configuration], given: str | None, registry: Mapping[str, Host] = HOSTS
) -> tuple[Configuration, ...]:
    """Each configuration once per host of `given` (a comma list), hosts in turn (a configuration that differed
    only in its host is measured once); `given` None: as they are."""
    names = list(dict.fromkeys(csv_list(given, str) or []))
    if not names:
        return tuple(configs)
    bad = [n for n in names if n not in registry]
    if bad:
        raise SystemExit(f"--hosts: got {', '.join(bad)}; allowed: {' | '.join(registry)}")
    return tuple(dict.fromkeys(replace(c, host=name) for c in configs for name in names))


def check(configs: Sequence[Configuration], registry: Mapping[str, Host] = HOSTS) -> None:
    """Every configuration's host is one of `registry` (a suite may name one)."""
    for c in configs:
        if c.host not in registry:
            raise SystemExit(f"host: got {c.host!r}; allowed: {' | '.join(registry)}")


def targets(run: HostRun, registry: Mapping[str, Host] = HOSTS) -> Callable[[Job], Target]:
    """The run's target seam (`RunContext.target`): each job on its configuration's host."""

    def target(job: Job) -> Target:
        return registry[job.config.host].target(job, run)

    return target


__all__ = ["FLAGS", "HOSTS", "Host", "HostFlags", "HostRun", "across", "check", "targets"]
