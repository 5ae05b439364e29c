"""`torchserve`: the configuration's archive registered on the run's TorchServe (`harness.targets.TorchServeModel`,
unregistered on exit); the default host."""

from __future__ import annotations

from bench.harness.targets import TorchServeModel
from bench.hosts.host import HostRun
from bench.inputs.configuration import TORCHSERVE
from bench.inputs.job import Job

NAME = TORCHSERVE


def target(job: Job, run: HostRun) -> TorchServeModel:
    """The job's archive registered under its own name on the run's TorchServe while entered."""
    return run.site.model(job)
