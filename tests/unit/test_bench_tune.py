"""The bench's new pure parts: the user's texts files, the capacity search, the tune suite's ranking and YAML."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import yaml

from bench import capacity, report, stats, traffic, tune
from bench.stats import Config
from bucketing.config import HandlerConfig
from bucketing.planner import CostModel

# --- --texts ---------------------------------------------------------------------------------------------------


def test_txt_is_one_text_a_line_blank_lines_dropped():
    data = b"first text\r\n\nsecond one\n   \nthird\n"
    assert traffic.parse_texts(data, "t.txt") == ["first text", "second one", "third"]


def test_txt_with_byte_order_mark():
    assert traffic.parse_texts("\ufeffhello\n".encode(), "t.txt") == ["hello"]


def test_jsonl_field_and_errors():
    data = b'{"text": "a b"}\n\n{"text": "c", "id": 2}\n'
    assert traffic.parse_texts(data, "t.jsonl") == ["a b", "c"]
    assert traffic.parse_texts(b'{"body": "x"}\n', "t.jsonl", field="body") == ["x"]
    with pytest.raises(traffic.TextsError, match=r"t.jsonl: line 2 has no field 'text' \(it has: body\)"):
        traffic.parse_texts(b'{"text": "x"}\n{"body": "y"}\n', "t.jsonl")
    with pytest.raises(traffic.TextsError, match="line 1 is not JSON"):
        traffic.parse_texts(b"{nope\n", "t.jsonl")
    with pytest.raises(traffic.TextsError, match="line 1: 'text' is int, not a string"):
        traffic.parse_texts(b'{"text": 3}\n', "t.jsonl")


def test_csv_column_and_errors():
    data = b'id,body\n1,"hello, world"\n2,"two\nlines"\n'
    assert traffic.parse_texts(data, "t.csv", field="body") == ["hello, world", "two\nlines"]
    with pytest.raises(traffic.TextsError, match=r"no column 'text' \(columns: id, body\); use --text-field"):
        traffic.parse_texts(data, "t.csv")


def test_undecodable_line_is_named():
    with pytest.raises(traffic.TextsError, match="t.txt: line 2 is not UTF-8"):
        traffic.parse_texts(b"ok\n\xff\xfe bad\n", "t.txt")


def test_empty_unknown_and_missing_files(tmp_path):
    with pytest.raises(traffic.TextsError, match="no texts"):
        traffic.parse_texts(b"\n  \n", "t.txt")
    with pytest.raises(traffic.TextsError, match="unknown format '.parquet'"):
        traffic.parse_texts(b"x", "t.parquet")
    with pytest.raises(traffic.TextsError, match="no such file"):
        traffic.load_texts(tmp_path / "missing.txt")
    with pytest.raises(traffic.TextsError, match="is a folder"):
        traffic.load_texts(tmp_path)


def test_sample_is_seeded_without_replacement(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"text": f"text {i}"}) + "\n" for i in range(50)))
    w = traffic.load_texts(path, sample=10, seed=1)
    assert w.name == "file:t.jsonl" and len(w.texts) == 10 == len(set(w.texts))
    assert w.texts == traffic.load_texts(path, sample=10, seed=1).texts
    assert w.texts != traffic.load_texts(path, sample=10, seed=2).texts
    assert len(traffic.load_texts(path, sample=500).texts) == 50  # more than there are: all of them
    with pytest.raises(traffic.TextsError, match="--sample: got 0"):
        traffic.load_texts(path, sample=0)


def test_every_error_is_one_line(tmp_path):
    cases = [(b"\xff\n", "a.txt"), (b'{"x": 1}\n', "a.jsonl"), (b"a,b\n1,2\n", "a.csv"), (b"", "a.txt")]
    for data, name in cases:
        with pytest.raises(traffic.TextsError) as e:
            traffic.parse_texts(data, name)
        assert "\n" not in str(e.value)


# --- capacity search ---------------------------------------------------------------------------------------------


def fake_server(knee: float, target: float = 100.0):
    """p99 under the target below `knee` req/s, far over it above; every call recorded."""
    calls = []

    def measure(rate: float) -> capacity.Step:
        calls.append(rate)
        p99 = 50.0 if rate <= knee else 5000.0
        return capacity.Step(rate, int(rate * 10), int(rate * 10), p99, 10.0)

    return measure, calls


@pytest.mark.parametrize("knee, start", [(40.0, 50.0), (40.0, 10.0), (40.0, 39.0), (3.0, 80.0), (100.0, 20.0)])
def test_search_finds_a_passing_rate_near_the_knee(knee, start):
    measure, calls = fake_server(knee)
    result = capacity.search(measure, start, 100.0, max_steps=8, precision=0.1)
    assert len(calls) <= 8 and len(set(calls)) == len(calls)
    assert result.best is not None and result.rate <= knee  # only ever a measured, passing rate
    assert result.rate >= knee / 1.35  # bracketed within the growth step or the bisection


def test_search_with_no_passing_rate_reports_none():
    measure, calls = fake_server(0.1)
    result = capacity.search(measure, 20.0, 100.0, max_steps=10)
    assert result.best is None and result.rate == 0.0
    assert min(calls) >= capacity.MIN_RATE and calls[-1] == capacity.MIN_RATE


def test_errors_fail_a_step_even_with_a_low_p99():
    step = capacity.Step(10.0, 100, 99, 5.0, 10.0)
    assert step.errors == 1 and not step.passes(100.0)
    assert not capacity.Step(10.0, 0, 0, math.nan, 1.0).passes(100.0)


def test_step_duration_is_bounded():
    assert capacity.step_duration(100.0, 6, 300, 18) == 6
    assert capacity.step_duration(20.0, 6, 300, 18) == 15
    assert capacity.step_duration(1.0, 6, 300, 18) == 18


# --- tune ------------------------------------------------------------------------------------------------------

LENGTHS = [10, 12, 200, 15, 30, 8, 120, 22] * 25
BASE = Config("bucketed", 16, duration=8)


def test_layouts_use_every_core():
    assert tune.layouts(2) == [(2, 1), (1, 2), (1, 1)]
    assert tune.layouts(4) == [(4, 1), (2, 2), (1, 4), (1, 1)]


def test_estimates_order_strategies_on_mixed_lengths():
    strategies = ("bucketed", "dynamic", "static")
    est = {s: tune.estimate(replace(BASE, strategy=s), LENGTHS, CostModel())[0] for s in strategies}
    assert est["bucketed"] > est["dynamic"] > est["static"]
    one, two = (tune.estimate(replace(BASE, workers=w), LENGTHS, CostModel())[0] for w in (1, 2))
    assert two == pytest.approx(2 * one)


def test_floor_is_a_lower_bound_and_counts_the_delay():
    _, floor = tune.estimate(BASE, LENGTHS, CostModel())
    _, floor_bs1 = tune.estimate(replace(BASE, batch_size=1), LENGTHS, CostModel())
    assert floor == pytest.approx(floor_bs1 + BASE.max_batch_delay)
    _, static_floor = tune.estimate(replace(BASE, strategy="static"), LENGTHS, CostModel())
    assert static_floor > floor  # static pads even a lone short text to max_length


def test_candidates_prune_and_rank():
    ranked = tune.candidates(BASE, LENGTHS, CostModel(), target_ms=60.0, cores=2)
    assert [c.est_rps for c in ranked] == sorted((c.est_rps for c in ranked), reverse=True)
    assert not any(c.config.strategy == "dynamic" and c.config.batch_size == 1 for c in ranked)  # same as bucketed
    for c in ranked:
        if c.est_floor_ms > 60.0:
            assert "latency floor" in c.pruned
    kept = [c for c in ranked if not c.pruned]
    assert kept and all(c.est_rps >= tune.PRUNE_BELOW * ranked[0].est_rps for c in kept)
    order = tune.first_round(ranked)
    assert len(order) == len(kept) == len(set(order))
    strategies = list(dict.fromkeys(c.config.strategy for c in kept))
    assert [c.strategy for c in order[: len(strategies)]] == strategies  # each strategy's best leads


def test_delay_variants():
    assert [c.max_batch_delay for c in tune.delay_variants(BASE)] == [5, 20, 50]
    assert tune.delay_variants(replace(BASE, batch_size=1)) == []


def summary_with_capacity(config: Config, rps: float, cap: float) -> stats.Summary:
    steps = (capacity.Step(cap, 300, 300, 80.0, 10.0), capacity.Step(cap * 1.3, 390, 390, 900.0, 10.0))
    s = stats.summarize(config, [(50.0, 200, 10)] * int(rps * 10), 10.0, stats.BatchStats(batches=1), 0.1, 5.0)
    return replace(s, capacity=capacity.Capacity(200.0, steps))


def test_rank_by_capacity_then_throughput():
    a = summary_with_capacity(BASE, 50, 40)
    b = summary_with_capacity(replace(BASE, batch_size=8), 60, 30)
    c = summary_with_capacity(replace(BASE, batch_size=4), 45, 40)
    assert tune.rank([b, c, a]) == [a, c, b]


def test_budget_keeps_room_for_the_next_measurement():
    budget = tune.Budget(600.0)
    assert budget.fits(0.0, 100.0, reserve_s=150.0)
    budget.costs += [80.0, 120.0]
    assert budget.expected(100.0) == 120.0
    assert budget.fits(300.0, 100.0, reserve_s=180.0) and not budget.fits(301.0, 100.0, reserve_s=180.0)


def test_model_config_yaml_is_what_the_handler_and_torchserve_read():
    from model_store import archives

    winner = Config("dynamic", 8, max_batch_delay=20, workers=1, threads=2)
    cfg = tune.model_config(winner, archives.model_config(winner.strategy))
    again = yaml.safe_load(yaml.safe_dump(cfg))
    assert (again["batchSize"], again["maxBatchDelay"], again["minWorkers"], again["maxWorkers"]) == (8, 20, 1, 1)
    handler = HandlerConfig.from_yaml(again)
    assert (handler.strategy, handler.torch_threads) == ("dynamic", 2)
    described = {"batchSize": 8, "maxBatchDelay": 20, "minWorkers": 1, "workers": [{}]}
    assert tune.describe_matches(described, cfg) == []
    assert tune.describe_matches({**described, "batchSize": 1}, cfg) == ["batchSize: YAML 8, served 1"]


def test_tune_section_golden():
    from tests.unit.test_bench_pure import GOLDEN

    a = summary_with_capacity(BASE, 50, 40)
    b = summary_with_capacity(replace(BASE, batch_size=8), 60, 30)
    ranked = [
        tune.Candidate(BASE, 137.0, 69.0),
        tune.Candidate(b.config, 130.0, 69.0),
        tune.Candidate(replace(BASE, batch_size=32, workers=1, threads=2), 124.0, 43.0),
        tune.Candidate(replace(BASE, strategy="static"), 40.0, 300.0, "estimated latency floor 300 ms > target 200 ms"),
    ]
    result = tune.TuneResult(
        200.0,
        900.0,
        612.0,
        tuple(ranked),
        (a, b),
        ((ranked[2].config, "budget (about 70 s each)"),),
        "tuned-model-config.yaml",
        "minWorkers: 2\nbatchSize: 16\n",
        ("build it", "curl it"),
        replace(a, config=replace(a.config, label="from YAML")),
        (),
    )
    assert report.tune_section(result) == (GOLDEN / "tune.md").read_text()


def test_capacity_and_peer_rows_render_golden():
    from tests.unit.test_bench_pure import GOLDEN

    ours = summary_with_capacity(BASE, 50, 40)
    peer = replace(
        summary_with_capacity(replace(BASE, strategy="infinity", peer="infinity", workers=1, threads=2), 20, 10),
        min_cosine=0.9999987,
    )
    text = "\n\n".join(report.render_block(s) for s in (ours, peer))
    text += "\n\n" + "\n".join(report.render_comparison(c) for c in stats.comparisons([ours, peer]))
    text += "\n\n" + report.results_table([ours, peer]) + "\n\n" + report.capacity_table([ours, peer]) + "\n"
    assert text == (GOLDEN / "capacity.txt").read_text()


# --- flags -------------------------------------------------------------------------------------------------------


def test_peer_runs_once_per_distinct_load():
    from bench import compare

    configs = [BASE, replace(BASE, strategy="dynamic"), replace(BASE, batch_size=1), replace(BASE, engine="torch")]
    peers = compare.peer_configs(configs, "infinity")
    assert [(c.name, c.batch_size, c.workers) for c in peers] == [
        (f"infinity bs16 1x{peers[0].threads}", 16, 1),
        (f"infinity bs1 1x{peers[0].threads}", 1, 1),
    ]
    assert all(c.peer == "infinity" and c.engine is None for c in peers)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--suite", "tune"], "--suite tune needs --p99-ms"),
        (["--suite", "tune", "--p99-ms", "100", "--peer", "infinity"], "--peer: not with --suite tune"),
        (["--p99-ms", "-5"], "--p99-ms: got -5; allowed: a positive number"),
        (["--p99-ms", "100", "--capacity-steps", "0"], "--capacity-steps and --step-s"),
        (["--p99-ms", "100", "--budget-min", "0"], "--budget-min: got 0"),
    ],
)
def test_flag_errors_are_one_line(argv, message):
    from bench import compare

    args = compare.parse_args(argv)
    with pytest.raises(SystemExit, match=message):
        compare.check_args(args, compare.plan_from_args(args))


def test_tune_settings_come_from_the_suite_unless_given():
    from bench import compare

    args = compare.parse_args(["--suite", "tune", "--p99-ms", "250"])
    settings = compare.check_args(args, compare.plan_from_args(args))
    assert settings == compare.CapacitySettings(250.0, 4, 6)
    args = compare.parse_args(["--suite", "tune", "--p99-ms", "250", "--step-s", "12", "--capacity-steps", "3"])
    assert compare.check_args(args, compare.plan_from_args(args)) == compare.CapacitySettings(250.0, 3, 12.0)


def test_texts_flag_makes_the_file_the_workload(tmp_path):
    from bench import compare

    args = compare.parse_args(["--texts", str(tmp_path / "q.csv"), "--strategies", "bucketed", "--batch-sizes", "8"])
    (config,) = compare.plan_from_args(args).configs
    assert config.workload == config.workload_label == "file:q.csv"


def test_build_from_a_config_checks_it_first(tmp_path, capsys):
    from model_store import build

    bad = tmp_path / "tuned.yaml"
    bad.write_text("batchSize: 4\nhandler:\n  strategy: fastest\n")
    assert build.main(["--config", str(bad), "--name", "x", "--out", str(tmp_path)]) == 2
    assert "handler.strategy: got 'fastest'" in capsys.readouterr().err
    assert build.main(["--config", str(tmp_path / "none.yaml"), "--name", "x", "--out", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err
    bad.write_text("- a list\n")
    assert build.main(["--config", str(bad), "--name", "x", "--out", str(tmp_path)]) == 2
    assert not list(tmp_path.glob("*.mar"))
