"""Metrics: cumulative histogram buckets, what a batch emits, and a dashboard that names only real series."""

from __future__ import annotations

import json
import re

import yaml

from bucketing.metrics import (
    CAPACITY,
    ERRORS,
    FIDELITY,
    HISTOGRAMS,
    INFLIGHT,
    METRICS,
    QUEUE_GAUGES,
    QUEUE_REQUESTS,
    QUEUE_SECONDS,
    QUEUE_TOKENS,
    SAMPLES,
    SAMPLES_MIN,
    BatchStats,
    QueueSignals,
    Samples,
    cumulative,
    emit,
    host_series_names,
    series_names,
    signal_names,
)
from model_store.archives import ROOT
from tsctl.inprocess import LocalMetrics


def test_cumulative_buckets():
    assert cumulative([(3, 1), (8, 1), (100, 2)], [1, 4, 8]) == [("1", 0), ("4", 1), ("8", 2), ("+Inf", 4)]
    assert cumulative([], [1.5]) == [("1.5", 0), ("+Inf", 0)]


def test_a_batch_emits_counters_histograms_and_errors_by_type():
    stats = BatchStats(
        requests=5,
        rejected=2,
        failed=1,
        texts=6,
        passes=((4, 64), (2, 300)),
        handler_ms=40.0,
        errors=(("EmptyText", 400), ("EmptyText", 400), ("InternalServerError", 500)),
    )
    metrics = LocalMetrics()
    emit(metrics, stats, cosine_min=0.99993, samples=Samples((0.99997, 0.9992, 0.15), 0.15, 0.9993), capacity=9e4)
    names = {name for name, *_ in metrics.added}
    assert names == series_names()
    float32 = LocalMetrics()
    emit(float32, stats)
    sampled = {SAMPLES_MIN} | {f"{SAMPLES}_{part}" for part in ("bucket", "sum", "count")}
    # none in float32; no capacity gauge unless handler.capacity_tokens_per_s is set
    assert {name for name, *_ in float32.added} == series_names() - {FIDELITY, CAPACITY} - sampled
    added = {(name, tuple((d.name, d.value) for d in dims)): value for name, value, _, dims in metrics.added}
    assert added["bucket_requests_total", ()] == 5 and added["bucket_failed_total", ()] == 1
    assert added["bucket_batch_size_bucket", (("le", "4"),)] == 0
    assert added["bucket_batch_size_bucket", (("le", "8"),)] == 1
    assert (
        added["bucket_pass_texts_bucket", (("le", "2"),)] == 1
        and added["bucket_pass_texts_bucket", (("le", "4"),)] == 2
    )
    assert added["bucket_pass_padded_tokens_sum", ()] == 364
    assert added["bucket_request_ms_bucket", (("le", "50"),)] == 5 and added["bucket_request_ms_count", ()] == 5
    assert added[ERRORS, (("type", "EmptyText"), ("status", "400"))] == 2
    assert added[ERRORS, (("type", "InternalServerError"), ("status", "500"))] == 1
    assert added[FIDELITY, ()] == 0.99993
    # shadow checks: a bucket at min_cosine (0.9993) among the fixed ones, the minimum as a gauge
    assert added[f"{SAMPLES}_bucket", (("le", "0.9993"),)] == 2 and added[f"{SAMPLES}_bucket", (("le", "0.999"),)] == 1
    assert added[f"{SAMPLES}_bucket", (("le", "0.99995"),)] == 2 and added[f"{SAMPLES}_bucket", (("le", "+Inf"),)] == 3
    assert added[f"{SAMPLES}_count", ()] == 3 and added[SAMPLES_MIN, ()] == 0.15
    assert added[CAPACITY, ()] == 9e4
    unsampled = LocalMetrics()
    emit(unsampled, stats, 0.99993, Samples((), None, 0.999))  # sampling on, nothing sampled yet: no gauge
    assert {n for n, *_ in unsampled.added} == series_names() - {SAMPLES_MIN, CAPACITY}


def test_stats_add_up_across_retries():
    a = BatchStats(batches=0, texts=2, passes=((2, 20),))
    b = BatchStats(batches=0, texts=1, passes=((1, 7),), errors=(("X", 500),))
    assert a + b == BatchStats(batches=0, texts=3, passes=((2, 20), (1, 7)), errors=(("X", 500),))


def torchserve_metric_names() -> set[str]:
    import ts

    spec = yaml.safe_load(open(f"{ts.__path__[0]}/configs/metrics.yaml").read())
    names = set()
    for section in ("ts_metrics", "model_metrics"):
        for kind in spec.get(section, {}).values():
            names |= {m["name"] for m in kind}
    return names


def test_dashboard_queries_name_only_emitted_metrics():
    dashboard = json.loads((ROOT / "config" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if v.get("definition")]
    used = set()
    for expr in exprs:
        used |= set(re.findall(r"([A-Za-z_:][\w:]*)\s*\{", expr)) | set(re.findall(r"label_values\((\w+)", expr))
    known = host_series_names() | torchserve_metric_names()  # the handler's, the hosts' queue signals, TorchServe's
    assert used and used <= known, f"not emitted: {sorted(used - known)}"
    assert {*QUEUE_GAUGES, CAPACITY, f"{QUEUE_SECONDS}_bucket"} <= used  # the queue panels
    assert {
        "bucket_batch_size_bucket",
        "bucket_pass_texts_bucket",
        "bucket_pass_padded_tokens_bucket",
        "bucket_request_ms_bucket",
        ERRORS,
    } <= used
    assert set(METRICS) & used and set(HISTOGRAMS)


def test_queue_signals_count_what_waits_what_runs_and_how_long_it_waited():
    signals = QueueSignals(capacity_tokens_per_s=5000.0)
    for tokens in (10, 20, 30):
        signals.admitted(tokens)
    signals.left(30)  # its caller gave up before it started
    signals.started(10, 0.004)
    signals.started(20, 0.2)
    signals.finished()
    got = {(name, labels): value for name, _, labels, value in signals.samples((("ModelName", "m"),))}
    m = (("ModelName", "m"),)
    assert got[QUEUE_REQUESTS, m] == 0 and got[QUEUE_TOKENS, m] == 0 and got[INFLIGHT, m] == 1
    assert got[CAPACITY, m] == 5000.0
    assert got[f"{QUEUE_SECONDS}_bucket", (*m, ("le", "0.001"))] == 0
    assert got[f"{QUEUE_SECONDS}_bucket", (*m, ("le", "0.005"))] == 1
    assert got[f"{QUEUE_SECONDS}_bucket", (*m, ("le", "0.25"))] == 2
    assert got[f"{QUEUE_SECONDS}_bucket", (*m, ("le", "+Inf"))] == 2 == got[f"{QUEUE_SECONDS}_count", m]
    assert abs(got[f"{QUEUE_SECONDS}_sum", m] - 0.204) < 1e-9
    assert {name for name, _ in got} == signal_names()  # the one declaration of what a host serves
    assert CAPACITY not in {name for name, *_ in QueueSignals().samples()}  # unset: no gauge
