"""What a run kind is given: the plan, the job resolver, the target seam, the measurer, where results go."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..capacity import CapacitySettings
from ..configuration import Configuration
from ..job import Bodies, Job
from ..results import ReportInputs
from ..run_plan import RunPlan
from ..stats import Summary
from ..targets import Target, TorchServeSite


class Resolves(Protocol):
    """Configurations into jobs (`jobs.Resolver`; a literal one in unit tests)."""

    @property
    def exact_length_rates(self) -> list[dict[str, Any]]: ...

    def load(self, config: Configuration) -> Bodies: ...

    def job(self, config: Configuration, *, exact: bool = False, check: bool = True) -> Job: ...


class Measures(Protocol):
    """A job on an entered target into its summary (`measure.Measurer`)."""

    sent: dict[str, list[int]]

    def measure(self, job: Job, target: Target) -> Summary: ...


@dataclass
class RunContext:
    """One run: its plan and flags, how configurations become jobs and jobs targets, and where summaries go."""

    plan: RunPlan
    resolver: Resolves
    target: Callable[[Job], Target]  # a job's own target: its model on our TorchServe
    measurer: Measures
    inputs: ReportInputs
    record: Callable[[Summary], None]  # a summary into the report and the results files, as soon as it is measured
    out: Path
    t0: float
    settings: CapacitySettings | None = None
    site: TorchServeSite | None = None  # the TorchServe behind `target` (tune deploys its winner there)
    peer: str | None = None
    budget_min: float = 15.0
    min_cosine: float | None = None
    progress: bool = False  # progress bars on stderr


class RunKind(Protocol):
    """A kind of run (`matrix`, `tune`): a module with these names, and a line in `kinds.KINDS`."""

    NAME: str
    TITLE: str  # the report's title

    def check(self, args: argparse.Namespace, plan: RunPlan) -> None:
        """Refuse the flags this kind cannot honour, with one line."""

    def run(self, ctx: RunContext) -> None:
        """Measure, calling `ctx.record` after each configuration."""
