"""The run loop (compare.measure_all over the `matrix` kind) on a fake target and a fake load: every configuration
resolved into a job, measured in the plan's order, each target left before the next is entered, results written
after each configuration, failed requests reported, and a target that fails to start ending the run with the
results so far kept and the report written."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from bench import compare
from bench.harness.jobs import Bodies, Job
from bench.harness.load import LoadResult, Sample
from bench.harness.measure import Load, Measurer
from bench.harness.results import ReportInputs
from bench.harness.run_plan import RunPlan
from bench.inputs.configuration import Configuration
from bench.inputs.workloads import Workload
from bench.kinds import RUN_KINDS, RunContext

TEXTS = ("short", "a somewhat longer text", "the longest text of this tiny workload by far")
TOKENS = [3, 6, 11]


@dataclass
class Fake:
    """The fake world: which targets fail how, and what happened, in order."""

    out: Path
    failing_requests: set[str] = field(default_factory=set)  # configuration names answered with 503
    failing_start: set[str] = field(default_factory=set)  # configuration names whose target does not start
    events: list[str] = field(default_factory=list)

    def send(self, spec: Load) -> LoadResult:
        """A closed or open loop of six requests, each 10 ms; 503 for a failing target."""
        name = spec.url.removeprefix("fake://")
        status = 503 if name in self.failing_requests else 200
        samples = tuple(Sample(0.01 * i, 10.0, status, i % len(spec.bodies)) for i in range(6))
        self.events.append(f"load {spec.label}")
        return LoadResult(spec.mode, spec.clients, None, samples, 0.06, 0.001)


class FakeTarget:
    """A target that answers through `Fake.send`; it records when it is entered and left."""

    engine = "fake"
    device = "cpu"

    def __init__(self, fake: Fake, job: Job) -> None:
        self.fake, self.name = fake, job.config.name
        self.url = f"fake://{self.name}"

    def __enter__(self) -> FakeTarget:
        rows = self.fake.out / "results.json"
        written = len(json.loads(rows.read_text())) if rows.exists() else 0
        self.fake.events.append(f"enter {self.name} after {written} rows")
        if self.name in self.fake.failing_start:
            raise SystemExit(f"{self.name}: its worker did not start")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.fake.events.append(f"exit {self.name}")

    def bodies(self, job: Job) -> list[bytes]:
        return job.load.bodies

    def headers(self) -> dict[str, str]:
        return {}

    def cpu(self) -> float | None:
        return None

    def counters(self) -> dict[str, float]:
        return {}

    def peak_rss_mb(self) -> float | None:
        return None

    def fidelity(self, job: Job) -> float | None:
        return 1.0 if job.references is not None else None


class FakeResolver:
    """Literal jobs: three texts, their bodies and tokens; a fixed roofline."""

    def __init__(self) -> None:
        self.resolved: list[str] = []

    @property
    def exact_length_rates(self) -> list[dict[str, Any]]:
        return []

    def load(self, config: Configuration) -> Bodies:
        return Bodies(Workload("longtail", TEXTS, (3, 6, 11), 0), [t.encode() for t in TEXTS], TOKENS)

    def job(self, config: Configuration, *, exact: bool = False, check: bool = True) -> Job:
        self.resolved.append(config.name)
        load = self.load(config)
        return Job(config, load, TEXTS if check else (), [[1.0]] * 3 if check else None, roofline_tps=1e6)


def run(tmp_path: Path, fake: Fake, configs: tuple[Configuration, ...]) -> tuple[int, FakeResolver]:
    resolver = FakeResolver()
    plan = RunPlan("fake", "a fake plan", configs, False, None)
    ctx = RunContext(
        plan=plan,
        resolver=resolver,
        target=lambda job: FakeTarget(fake, job),
        measurer=Measurer(fake.send, warmup_s=0.0),
        inputs=ReportInputs(RUN_KINDS[plan.kind].TITLE, {"command": "fake"}),
        record=lambda summary: None,
        out=tmp_path,
        t0=0.0,
    )
    return compare.measure_all(ctx), resolver


CONFIGS = (
    Configuration("bucketed", 16, duration=1),
    Configuration("dynamic", 16, duration=1),
    Configuration("static", 16, duration=1),
)


def rows(tmp_path: Path) -> list[dict[str, str]]:
    with open(tmp_path / "results.csv") as f:
        return list(csv.DictReader(f))


def test_each_configuration_is_resolved_once_then_measured_in_order_with_results_after_each(tmp_path):
    fake = Fake(tmp_path)
    code, resolver = run(tmp_path, fake, CONFIGS)
    assert code == 0
    assert resolver.resolved == ["bucketed bs16", "dynamic bs16", "static bs16"]  # once each, before any load
    enters = [e for e in fake.events if e.startswith(("enter", "exit"))]
    assert enters == [
        "enter bucketed bs16 after 0 rows",
        "exit bucketed bs16",
        "enter dynamic bs16 after 1 rows",
        "exit dynamic bs16",
        "enter static bs16 after 2 rows",
        "exit static bs16",
    ]
    assert fake.events[1:3] == ["load bucketed bs16 warm-up", "load bucketed bs16"]
    got = rows(tmp_path)
    assert [r["config"] for r in got] == ["bucketed bs16", "dynamic bs16", "static bs16"]
    assert all(r["errors"] == "0" and float(r["rps"]) == pytest.approx(100.0) for r in got)
    assert [json.loads((tmp_path / "results.json").read_text())[i]["min_cosine"] for i in range(3)] == [1.0] * 3
    assert "## Results" in (tmp_path / "report.md").read_text()


def test_failed_requests_are_reported_in_the_results(tmp_path):
    fake = Fake(tmp_path, failing_requests={"dynamic bs16"})
    assert run(tmp_path, fake, CONFIGS)[0] == 0
    by_name = {r["config"]: r for r in rows(tmp_path)}
    assert by_name["dynamic bs16"]["errors"] == "6" and by_name["dynamic bs16"]["errors_by_status"] == "503:6"
    assert by_name["bucketed bs16"]["errors"] == by_name["static bs16"]["errors"] == "0"


def test_a_target_that_does_not_start_ends_the_run_with_the_results_so_far(tmp_path, capsys):
    fake = Fake(tmp_path, failing_start={"dynamic bs16"})
    assert run(tmp_path, fake, CONFIGS)[0] == 130
    assert [r["config"] for r in rows(tmp_path)] == ["bucketed bs16"]
    assert "enter static bs16 after 1 rows" not in fake.events  # nothing after the failure
    assert "interrupted: results so far are kept" in capsys.readouterr().err
    assert (tmp_path / "report.md").exists()
