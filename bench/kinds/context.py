"""What a run kind is given: the plan and flags, the job resolver, the target seam, the measurer, where results go;
and what a run kind is (`RunKind`): its flags, their checks, its run and its report sections."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bench.harness.capacity import CapacitySettings
from bench.harness.measure import Send
from bench.harness.options import Options
from bench.harness.results import ReportInputs
from bench.harness.run_plan import RunPlan
from bench.harness.stats import Summary
from bench.harness.targets import Target, TorchServeSite
from bench.inputs.configuration import Configuration
from bench.inputs.job import Bodies, Job

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class Resolves(Protocol):
    """Configurations into jobs (`jobs.Resolver`; a literal one in unit tests)."""

    @property
    def exact_length_rates(self) -> list[dict[str, Any]]: ...

    def load(self, config: Configuration) -> Bodies: ...

    def job(self, config: Configuration, *, exact: bool = False, check: bool = True) -> Job: ...


class Measures(Protocol):
    """A job on an entered target into its summary (`measure.Measurer`)."""

    sent: dict[str, list[int]]
    send: Send  # one load, as it is sent (the bulk kind drives its own loads)

    def measure(self, job: Job, target: Target) -> Summary: ...


@dataclass
class RunContext:
    """One run: its plan and flags, how configurations become jobs and jobs targets, and where summaries go."""

    plan: RunPlan
    resolver: Resolves
    target: Callable[[Job], Target]  # a job's own target: its model on its configuration's host (`hosts.targets`)
    measurer: Measures
    inputs: ReportInputs
    record: Callable[[Summary], None]  # a summary into the report and the results files, as soon as it is measured
    out: Path
    t0: float
    settings: CapacitySettings | None = None
    site: TorchServeSite | None = None  # the TorchServe behind `target` (tune deploys its winner there)
    options: Options = field(default_factory=Options)  # the flags; a kind's own: `options.of(its FLAGS)`
    progress: bool = False  # progress bars on stderr


class RunKind(Protocol):
    """A kind of run (`matrix`, `tune`): a module with these names, and a line in `kinds.RUN_KINDS`."""

    NAME: str  # also its suite's name in suites.yaml
    TITLE: str  # the report's title
    # The workloads it alone measures: `--workload W` with no --suite runs its suite, and another kind refuses W.
    WORKLOADS: tuple[str, ...]

    @property
    def FLAGS(self) -> type[DataclassInstance] | None:  # a module constant: read-only here
        """Its own flags: a frozen dataclass of `options.flag(...)` fields (None: it has none)."""

    def check(self, options: Options, plan: RunPlan) -> None:
        """As the run's kind: refuse, with one line, the flags it cannot honour and bad values of its own."""

    def refuse(self, options: Options) -> None:
        """Where another kind runs: refuse, with one line, its own flags given."""

    def run(self, ctx: RunContext) -> list[str]:
        """Measure, calling `ctx.record` after each configuration; its report sections (after the comparisons)."""
