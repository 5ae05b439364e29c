"""The bench's pure parts: workloads, statistics, offline policies, and rendering against golden output."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from bench import offline, report, stats
from bench.workloads import WORDS, WORKLOADS, make_workload, text_of
from bucketing.planner import CostModel

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("name", WORKLOADS)
def test_workloads_are_deterministic_per_seed(name):
    assert make_workload(name, 50, seed=3) == make_workload(name, 50, seed=3)
    assert make_workload(name, 50, seed=3).texts != make_workload(name, 50, seed=4).texts


@pytest.mark.parametrize(
    "name, low, high",
    [("short", 8, 12), ("sentences", 22, 28), ("passages", 130, 150), ("longtail", 45, 80)],
)
def test_workload_means_match_their_distribution(name, low, high):
    targets = make_workload(name, 2000, seed=0).target_tokens
    assert low <= statistics.mean(targets) <= high
    assert max(targets) <= 256 and min(targets) >= 4


def test_longtail_is_long_tailed():
    targets = sorted(make_workload("longtail", 4000, seed=0).target_tokens)
    median, p90 = targets[2000], targets[3600]
    assert 22 <= median <= 34 and p90 >= 4 * median


def test_mixed_short_fraction():
    targets = make_workload("mixed", 4000, seed=0, short_frac=0.3).target_tokens
    assert sum(t <= 14 for t in targets) / len(targets) == pytest.approx(0.3, abs=0.03)
    with pytest.raises(ValueError, match="short_frac"):
        make_workload("mixed", 1, short_frac=1.5)


def test_texts_are_words_with_the_target_token_count():
    import random

    rng = random.Random(0)
    for tokens in (3, 4, 10, 57, 200):
        text = text_of(tokens, rng)
        pieces = text.replace(".", " .").split()
        assert len(pieces) + 2 == tokens
        assert all(p == "." or p.lower() in WORDS for p in pieces)


def test_minilm_tokenizes_workloads_to_their_targets(minilm_dir):
    from bucketing.tokenizer import Tokenizer

    w = make_workload("longtail", 200, seed=1)
    real = [len(e.ids) for e in Tokenizer(str(minilm_dir), 256).encode(w.texts)]
    assert all(0 <= r - t <= 4 for r, t in zip(real, w.target_tokens, strict=True))


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


def summary(strategy, bs, rps_scale, p99, mode="closed", rate=None):
    config = stats.Config(strategy, bs, mode=mode, rate=rate)
    samples = [(10.0 * (i % 10 + 1) * p99 / 100, 200, 50) for i in range(int(100 * rps_scale))]
    samples += [(1.0, 503, 50)] * 2
    padded = 5000 / (0.95 if strategy == "bucketed" else 0.4)
    handler = stats.HandlerDelta(
        batches=10, requests=100, texts=100, real_tokens=5000, padded_tokens=padded, sub_batches=30, forward_ms=900
    )
    return stats.summarize(config, samples, 10.0, handler, 0.5, 15.0, 20000.0)


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


def test_render_block_and_comparison_golden():
    runs = [summary("bucketed", 16, 2.0, 100), summary("dynamic", 16, 1.0, 200)]
    text = "\n\n".join(report.render_block(s) for s in runs)
    text += "\n\n" + "\n".join(report.render_comparison(c) for c in stats.comparisons(runs)) + "\n"
    assert text == (GOLDEN / "blocks.txt").read_text()


def test_render_markdown_golden():
    runs = [summary("bucketed", 16, 2.0, 100), summary("dynamic", 16, 1.0, 200, "open", 20.0)]
    md = report.render_markdown(
        "Batching comparison",
        {"date": "2026-11-30 12:00", "machine": "x86_64, 2 cores", "command": "`python bench/compare.py`"},
        runs,
        stats.comparisons(runs),
        {"longtail": [(1, 8, 3), (9, 16, 10), (17, 32, 0)]},
        [
            {
                "short_frac": 0.5,
                "batch_size": 8,
                "real_tokens": 100,
                "arrival_padded": 300,
                "arrival_est_s": 1.0,
                "planner_padded": 110,
                "planner_est_s": 0.5,
                "saved_vs_arrival": 0.633,
            }
        ],
        [{"workload": "longtail", "workers": 2, "threads": 1, "tokens_per_s": 7000.0, "texts": 800, "forwards": 150}],
        ["batching_comparison.svg"],
    )
    assert md == (GOLDEN / "report.md").read_text()


def test_offline_policies_on_a_literal_batch():
    cost = CostModel(overhead_us=1000, per_token_us=100, per_token_sq_us=0)
    result = offline.evaluate([10, 200, 12, 190, 9, 11, 180, 14], 8, cost)
    assert result["arrival"][0] == 8 * 200
    assert result["sorted4"][0] == 4 * 12 + 4 * 200
    assert result["pow2"][0] == 5 * 14 + 3 * 200  # buckets 9-16 and 129-256
    assert result["planner"][0] <= result["sorted4"][0]
    assert result["planner"][1] <= min(ms for _, ms in result.values())


def test_offline_sweep_rows():
    rows = offline.sweep([0.2, 0.8], [8, 16], CostModel(), n=200)
    assert [(r["short_frac"], r["batch_size"]) for r in rows] == [(0.2, 8), (0.2, 16), (0.8, 8), (0.8, 16)]
    for r in rows:
        assert r["real_tokens"] <= r["planner_padded"] <= r["arrival_padded"]
        assert 0 < r["saved_vs_arrival"] < 1


def test_engines_are_an_axis_over_a_suite_or_a_matrix():
    from bench.compare import parse_args, plan_from_args

    suite = plan_from_args(parse_args(["--suite", "batch-size", "--engines", "torch"]))
    assert suite.name == "batch-size" and {c.engine for c in suite.configs} == {"torch"}
    matrix = plan_from_args(parse_args(["--strategies", "bucketed", "--engines", "torch,onnxruntime"]))
    assert [c.name for c in matrix.configs] == ["bucketed bs16 torch", "bucketed bs16 onnxruntime"]
    with pytest.raises(SystemExit, match="--engines"):
        plan_from_args(parse_args(["--engines", "tensorrt"]))


def test_model_axis_names_and_suite():
    from bench import models
    from bench.compare import parse_args, plan_from_args

    assert models.prefix(None, None) == "minilm" and models.prefix("/data/My_Encoder.v2", None) == "my-encoder-v2"
    assert models.prefix("bert-base-random", "torch") == "bert-base-random-torch"
    suite = plan_from_args(parse_args(["--suite", "model-size"]))
    assert {c.model for c in suite.configs} == {None, "bert-base-random"} and suite.bound
    custom = plan_from_args(parse_args(["--strategies", "bucketed", "--model-dir", "/data/enc"]))
    assert custom.configs[0].model == "/data/enc" and custom.configs[0].name == "bucketed bs16 [enc]"
    with pytest.raises(SystemExit, match="no config.json"):
        models.model_dir("/nonexistent/encoder")


def test_comparisons_stay_within_one_model():
    a, b = summary("bucketed", 16, 2.0, 100), summary("dynamic", 16, 1.0, 200)
    big = replace(b, config=replace(b.config, model="bert-base-random"))
    assert [(c.a.config.name, c.b.config.name) for c in stats.comparisons([a, b, big])] == [
        ("bucketed bs16", "dynamic bs16")
    ]


def test_blocks_and_rows_say_engine_and_device():
    s = replace(summary("bucketed", 16, 2.0, 100), engine="onnxruntime", device="cpu")
    assert "2 workers x 1 thread, onnxruntime on cpu]" in report.render_block(s).splitlines()[0]
    assert (s.row()["engine"], s.row()["device"]) == ("onnxruntime", "cpu")


def test_rerank_requests_are_a_short_query_and_long_tail_documents():
    from bench.workloads import rerank_requests

    requests = rerank_requests(5, docs_per_request=20, seed=1)
    assert len(requests) == 5 and all(len(docs) == 20 for _, docs in requests)
    assert requests == rerank_requests(5, docs_per_request=20, seed=1)  # seeded
    assert max(len(q.split()) for q, _ in requests) < min(max(len(d.split()) for d in docs) for _, docs in requests)


def test_the_rerank_workload_refuses_what_measures_embeddings():
    import pytest

    from bench import compare

    for extra in (["--bound"], ["--peer", "infinity"]):
        args = compare.parse_args(["--workload", "rerank", "--strategies", "bucketed", *extra])
        with pytest.raises(SystemExit, match="--workload rerank: not with"):
            compare.check_args(args, compare.plan_from_args(args))
    args = compare.parse_args(["--workload", "rerank", "--strategies", "bucketed"])
    plan = compare.plan_from_args(args)
    assert {c.model for c in plan.configs} == {"minilm-cross-encoder-random"}
