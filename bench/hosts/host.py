"""What a host of our worker is (`Host`): a module with a NAME and a `target` for a job; and what a run gives every
host (`HostRun`): the run's TorchServe, the model store the archives are built in, a folder for its own servers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bench.harness.targets import Target, TorchServeSite
from bench.inputs.job import Job


@dataclass(frozen=True)
class HostRun:
    """What one run gives each host."""

    site: TorchServeSite  # the run's TorchServe (the torchserve host registers each job's archive on it)
    store: Path  # our model store: each configuration's archive is built there when missing or stale
    work: Path  # a folder for the servers a host starts itself (a sub-folder each: pid file, log, key file)


class Host(Protocol):
    """A host our worker runs on (`torchserve`, `standalone`): a module with these names, and a line in
    `hosts.HOSTS`."""

    NAME: str  # its name in --hosts, `Configuration.host`, the `host` column and the report

    def target(self, job: Job, run: HostRun) -> Target:
        """The job's target on this host (`harness.targets.Target`): entered, it serves the job's configuration
        (its archive, `targets.archive`; batch size, max batch delay, workers x threads) and is ready to answer;
        left, whatever it started is ended, on every path."""
        ...
