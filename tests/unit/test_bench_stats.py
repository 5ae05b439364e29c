"""bench.harness.stats: percentiles, handler-metric deltas, summaries, rows and comparisons."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.harness import stats
from tests.unit.summaries import summary


def test_percentile_interpolates():
    assert stats.percentile([1, 2, 3, 4], 50) == 2.5
    assert stats.percentile([5], 99) == 5
    assert stats.percentile(list(range(101)), 90) == 90
    assert str(stats.percentile([], 50)) == "nan"


PROM = """# TYPE bucket_batches_total counter
bucket_batches_total{ModelName="m",Level="Model",Hostname="vm",} 10.0
bucket_batches_total{ModelName="other",Level="Model",Hostname="vm",} 99.0
bucket_requests_total{ModelName="m",Level="Model",Hostname="vm",} 80.0
bucket_padded_tokens_total{ModelName="m",Level="Model",Hostname="vm",} 2000.0
bucket_real_tokens_total{ModelName="m",Level="Model",Hostname="vm",} 1800.0
bucket_sub_batches_total{ModelName="m",Level="Model",Hostname="vm",} 25.0
"""


def test_handler_delta_from_prometheus_text():
    after = stats.parse_prometheus(PROM, "m")
    before = {"bucket_batches_total": 2.0, "bucket_requests_total": 16.0}
    d = stats.handler_delta(before, after)
    assert (d.batches, d.requests, d.padding_efficiency, d.mean_batch_size) == (8, 64, 0.9, 8)
    assert d.sub_batches_per_batch == 25 / 8
    assert stats.handler_delta({}, {}).padding_efficiency is None


def test_summarize_and_csv_row():
    s = summary("bucketed", 16, 2.0, 100)
    assert (s.requests, s.ok, s.rps, s.tokens_per_s, s.errors) == (202, 200, 20.0, 1000.0, {"503": 2})
    assert s.p50_ms == pytest.approx(55.0) and s.max_ms == 100.0
    row = s.row()
    assert tuple(row) == stats.CSV_COLUMNS
    required = "config strategy batch_size max_batch_delay workload mode rate rps tokens_per_s p50_ms p90_ms p99_ms"
    for col in required.split() + ["errors", "padding_efficiency", "mean_batch_size"]:
        assert col in row
    assert row["padding_efficiency"] == 0.95 and row["server_cpu_cores"] == 1.5 and row["bound_fraction"] == 0.05


def test_comparisons_pair_bucketed_with_same_batch_size_and_batch_size_one():
    runs = [
        summary("bucketed", 16, 2.0, 100),
        summary("dynamic", 16, 1.0, 200),
        summary("bucketed", 1, 1.25, 150),
        summary("dynamic", 8, 1.0, 10),
    ]
    pairs = [(c.a.config.name, c.b.config.name) for c in stats.comparisons(runs)]
    assert pairs == [("bucketed bs16", "dynamic bs16"), ("bucketed bs16", "bucketed bs1")]
    assert stats.comparisons(runs)[0].throughput_ratio == 2.0
    assert stats.comparisons(runs)[0].p99_ratio == pytest.approx(0.5)


def test_comparisons_pair_engines_of_one_configuration():
    ort, torch_run = summary("bucketed", 16, 2.4, 100), summary("bucketed", 16, 2.0, 120)
    ort = replace(ort, config=replace(ort.config, engine="onnxruntime"))
    torch_run = replace(torch_run, config=replace(torch_run.config, engine="torch"))
    pairs = stats.comparisons([torch_run, ort])
    assert [(c.a.config.name, c.b.config.name) for c in pairs] == [("bucketed bs16 onnxruntime", "bucketed bs16 torch")]
    assert pairs[0].throughput_ratio == pytest.approx(1.2)


def test_comparisons_stay_within_one_model():
    a, b = summary("bucketed", 16, 2.0, 100), summary("dynamic", 16, 1.0, 200)
    big = replace(b, config=replace(b.config, model="bert-base-random"))
    assert [(c.a.config.name, c.b.config.name) for c in stats.comparisons([a, b, big])] == [
        ("bucketed bs16", "dynamic bs16")
    ]


def test_rows_carry_their_dtype_and_bfloat16_pairs_with_float32():
    from bench.harness import report
    from bench.harness.targets import engine_of

    f32, bf16 = summary("bucketed", 16, 2.0, 100), summary("bucketed", 16, 5.0, 60)
    f32 = replace(f32, config=replace(f32.config, dtype="float32"), min_cosine=1.0)
    bf16 = replace(bf16, config=replace(bf16.config, dtype="bfloat16"), min_cosine=0.99991)
    assert f32.row()["dtype"] == "float32" and bf16.row()["dtype"] == "bfloat16"
    assert summary("bucketed", 16, 2.0, 100).row()["dtype"] == "float32"  # None: the shipped float32
    pairs = stats.comparisons([f32, bf16])
    assert [(c.a.config.name, c.b.config.name) for c in pairs] == [("bucketed bs16 bfloat16", "bucketed bs16 float32")]
    assert pairs[0].throughput_ratio == pytest.approx(2.5)
    table = report.results_table([f32, bf16])
    header = table.splitlines()[0]
    assert "| engine | dtype |" in header and header.endswith("| min_cosine |") and "| 0.99991 |" in table
    assert "dtype" not in report.results_table([summary("bucketed", 16, 2.0, 100)]).splitlines()[0]
    assert engine_of(bf16.config) == "torch" and engine_of(replace(bf16.config, dtype=None)) != "torch"
