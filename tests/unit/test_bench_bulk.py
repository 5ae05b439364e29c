"""The `bulk` run kind on the run loop's fake target: each configuration's loads in order (warm-ups, the bulk
request alone, the split requests, the small load alone, then the small load while a bulk request runs), its
bodies (one of N texts, N/32 of 32, single texts), its figures and report section, and its flags' checks."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from bench import compare
from bench.harness.load import LoadResult, Sample
from bench.harness.measure import Load, Measurer
from bench.harness.options import Options
from bench.harness.results import ReportInputs
from bench.harness.run_plan import RunPlan, load_suite
from bench.inputs.configuration import Configuration
from bench.kinds import RUN_KINDS, RunContext, bulk
from tests.unit.test_bench_run_loop import Fake, FakeResolver, FakeTarget


class BulkFake(Fake):
    """Answers a request of n texts in n ms (one sample a request, up to the load's count); records each load."""

    loads: list[Load]

    def send(self, spec: Load) -> LoadResult:
        self.loads = getattr(self, "loads", [])
        self.loads.append(spec)
        self.events.append(f"load {spec.label} on {threading.current_thread().name}")
        count = min(spec.max_requests, 100)
        sizes = [len(json.loads(b)["texts"]) if b.startswith(b"{") else 1 for b in spec.bodies]
        small = 50.0 if spec.label.endswith("small") else 10.0  # single texts: slower while the bulk runs
        samples = tuple(
            Sample(0.0, float(sizes[i % len(sizes)]) if sizes[i % len(sizes)] > 1 else small, 200, i % len(sizes))
            for i in range(count)
        )
        wall = sum(s.latency_ms for s in samples) / 1000.0 / max(spec.clients, 1)
        return LoadResult("closed", spec.clients, None, samples, wall, 0.0)


def run_bulk(tmp_path: Path, options: Options) -> tuple[int, BulkFake]:
    fake = BulkFake(tmp_path)
    configs = (Configuration("bucketed", 16, concurrency=16, duration=1),)
    plan = RunPlan("bulk", "fake", configs, False, None, kind="bulk")
    ctx = RunContext(
        plan=plan,
        resolver=FakeResolver(),
        target=lambda job: FakeTarget(fake, job),
        measurer=Measurer(fake.send, warmup_s=0.0),
        inputs=ReportInputs(RUN_KINDS["bulk"].TITLE, {"command": "fake"}),
        record=lambda summary: None,
        out=tmp_path,
        t0=0.0,
        options=options,
    )
    return compare.measure_all(ctx), fake


def test_bulk_measures_one_request_against_the_split_texts_and_small_p99_during_it(tmp_path):
    options = Options(kinds=(bulk.BulkFlags(bulk_texts=64, split_texts=16, small_clients=2),))
    code, fake = run_bulk(tmp_path, options)
    assert code == 0
    labels = [spec.label.removeprefix("bucketed bs16 ") for spec in fake.loads]
    assert labels == ["bulk warm-up", "small warm-up", "bulk", "split", "small alone", "bulk (during)", "small"]
    by = {spec.label.removeprefix("bucketed bs16 "): spec for spec in fake.loads}
    assert [len(json.loads(b)["texts"]) for b in by["bulk"].bodies] == [64] and by["bulk"].max_requests == 1
    assert [len(json.loads(b)["texts"]) for b in by["split"].bodies] == [16] * 4 and by["split"].max_requests == 4
    assert by["split"].clients == 16 and by["small"].clients == by["small alone"].clients == 2
    assert by["small"].bodies[0] == b"short"  # the target's single-text bodies
    texts = json.loads(by["bulk"].bodies[0])["texts"]
    assert texts[:3] == ["short", "a somewhat longer text", "the longest text of this tiny workload by far"]
    assert texts[3] == "short"  # the workload's texts, repeated to the count
    during = [e for e in fake.events if "(during)" in e]
    assert during and "MainThread" not in during[0]  # the bulk request runs beside the small load
    (row,) = json.loads((tmp_path / "bulk.json").read_text())
    assert row["bulk_texts_per_s"] == pytest.approx(1000.0)  # 64 texts in 64 ms
    assert row["split_texts_per_s"] == pytest.approx(64 / (4 * 0.016 / 16), rel=1e-3)
    assert row["small_p99_alone_ms"] == pytest.approx(10.0) and row["small_p99_during_ms"] == pytest.approx(50.0)
    assert row["p99_ratio"] == 5.0 and row["errors"] == 0
    report = (tmp_path / "report.md").read_text()
    assert "## Bulk requests" in report and "| bucketed bs16 | same | 0.064 | 1000.0 |" in report


def test_the_bulk_suite_runs_kind_bulk_on_the_batch_and_continuous_schedules():
    plan = load_suite("bulk")
    assert plan.kind == "bulk"
    assert [(c.schedule, c.workers, c.threads) for c in plan.configs] == [(None, 2, 1), ("continuous", 1, 2)]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (bulk.BulkFlags(bulk_texts=5000), "--bulk-texts: got 5000; allowed: 1 to 4096"),
        (bulk.BulkFlags(bulk_texts=8, split_texts=16), "--split-texts: got 16; allowed: 1 to --bulk-texts (8)"),
        (bulk.BulkFlags(small_clients=0), "--small-clients: got 0"),
    ],
)
def test_bad_flags_are_refused_in_one_line(flags, words):
    plan = load_suite("bulk")
    with pytest.raises(SystemExit, match=words.replace("(", r"\(").replace(")", r"\)")):
        bulk.check(Options(kinds=(flags,)), plan)
    with pytest.raises(SystemExit, match="only with --suite bulk"):
        bulk.refuse(Options(kinds=(bulk.BulkFlags(split_texts=8),)))
    bulk.refuse(Options())  # defaults: nothing to refuse


def test_a_bulk_layout_sends_the_bulk_requests_to_a_second_registration_and_the_rest_to_the_first(tmp_path):
    options = Options(kinds=(bulk.BulkFlags(bulk_texts=64, split_texts=16, small_clients=2, bulk_layouts="same,1x2"),))
    code, fake = run_bulk(tmp_path, options)
    assert code == 0
    urls = {(spec.label.removeprefix("bucketed bs16 "), spec.url) for spec in fake.loads}
    second = {label: url for label, url in urls if "1x2" in url}
    assert sorted(second) == ["bulk", "bulk (during)", "bulk warm-up"]  # the second row's bulk loads only
    rows = json.loads((tmp_path / "bulk.json").read_text())
    assert [r["bulk_to"] for r in rows] == ["same", "1x2"]


def test_bulk_layouts_pair_each_configuration_once_and_refuse_what_is_not_a_layout():
    batch = Configuration("bucketed", 16)
    continuous = Configuration("bucketed", 16, workers=1, threads=2, schedule="continuous")
    pairs = bulk.pairs((batch, continuous), ("same", "1x2"))
    assert [(c.name, to.workers, to.threads) for c, to in pairs] == [
        ("bucketed bs16", 2, 1),
        ("bucketed bs16", 1, 2),
        ("bucketed bs16 1x2 continuous", 1, 2),  # 1x2 is its own layout: measured once
    ]
    plan = load_suite("bulk")
    assert bulk.layouts(bulk.BulkFlags(), plan) == ("same", "1x2")
    assert bulk.layouts(bulk.BulkFlags(bulk_layouts="2x1"), plan) == ("2x1",)
    with pytest.raises(SystemExit, match="--bulk-layouts: got '0x2'; allowed: same, or WxT such as 1x2"):
        bulk.check(Options(kinds=(bulk.BulkFlags(bulk_layouts="same,0x2"),)), plan)
