"""bench.kinds.tune_search and tune_choice: candidates ranked and pruned offline, the measuring order under a budget
(`explore` on a fake measure), the winner's YAML and its report section."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from bench.harness import capacity, report, stats
from bench.inputs.configuration import Configuration
from bench.kinds import tune_choice as choice
from bench.kinds import tune_search as tune
from bucketing.config import HandlerConfig
from bucketing.planning.planner import CostModel
from tests.unit.summaries import GOLDEN

# --- --texts ---------------------------------------------------------------------------------------------------


LENGTHS = [10, 12, 200, 15, 30, 8, 120, 22] * 25


BASE = Configuration("bucketed", 16, duration=8)


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


def summary_with_capacity(config: Configuration, rps: float, cap: float) -> stats.Summary:
    steps = (capacity.Step(cap, 300, 300, 80.0, 10.0), capacity.Step(cap * 1.3, 390, 390, 900.0, 10.0))
    s = stats.summarize(config, [(50.0, 200, 10)] * int(rps * 10), 10.0, stats.HandlerDelta(batches=1), 0.1, 5.0)
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

    winner = Configuration("dynamic", 8, max_batch_delay=20, workers=1, threads=2)
    cfg = choice.model_config(winner, archives.model_config(winner.strategy))
    again = yaml.safe_load(yaml.safe_dump(cfg))
    assert (again["batchSize"], again["maxBatchDelay"], again["minWorkers"], again["maxWorkers"]) == (8, 20, 1, 1)
    handler = HandlerConfig.from_yaml(again)
    assert (handler.strategy, handler.torch_threads) == ("dynamic", 2)
    described = {"batchSize": 8, "maxBatchDelay": 20, "minWorkers": 1, "workers": [{}]}
    assert choice.describe_mismatches(described, cfg) == []
    assert choice.describe_mismatches({**described, "batchSize": 1}, cfg) == ["batchSize: YAML 8, served 1"]


def test_tune_section_golden():
    from bench.kinds.tune_report import tune_section  # tune's report section, beside its run kind

    onnx = replace(BASE, engine="onnxruntime")
    a = summary_with_capacity(onnx, 50, 40)
    b = replace(summary_with_capacity(replace(BASE, engine="openvino", dtype="bfloat16"), 60, 30), min_cosine=0.9999)
    ranked = [
        tune.Candidate(onnx, 137.0, 69.0),
        tune.Candidate(b.config, 130.0, 69.0),
        tune.Candidate(replace(onnx, batch_size=32, workers=1, threads=2), 124.0, 43.0),
        tune.Candidate(replace(onnx, strategy="static"), 40.0, 300.0, "estimated latency floor 300 ms > target 200 ms"),
    ]
    engine_costs = (
        choice.EngineCost("onnxruntime", "float32", CostModel(2570.0, 225.0, 0.184), 5.85, 2.63, 138.0),
        choice.EngineCost("openvino", "bfloat16", CostModel(1880.0, 111.0, 0.075), 5.2, 2.96, 260.0),
        choice.EngineCost("openvino", "float32", CostModel(2110.0, 226.0, 0.105), 6.1, 2.52, 141.0),
        choice.EngineCost("torch", "bfloat16", None, refused="handler.dtype bfloat16: refused here"),
    )
    result = choice.TuneResult(
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
        min_cosine=0.999,
        engine_costs=engine_costs,
        base=BASE,
    )
    assert tune_section(result) == (GOLDEN / "tune.md").read_text()


def test_capacity_and_peer_rows_render_golden():

    ours = summary_with_capacity(BASE, 50, 40)
    peer = replace(
        summary_with_capacity(replace(BASE, strategy="infinity", peer="infinity", workers=1, threads=2), 20, 10),
        min_cosine=0.9999987,
    )
    text = "\n\n".join(report.render_block(s) for s in (ours, peer))
    text += "\n\n" + "\n".join(report.render_comparison(c) for c in stats.comparisons([ours, peer]))
    text += "\n\n" + report.results_table([ours, peer]) + "\n\n" + report.capacity_table([ours, peer]) + "\n"
    assert text == (GOLDEN / "capacity.txt").read_text()


def test_explore_measures_heads_first_then_delays_of_the_best_within_the_budget():
    kept = [
        replace(BASE, strategy="bucketed", batch_size=16),
        replace(BASE, strategy="bucketed", batch_size=8),
        replace(BASE, strategy="dynamic", batch_size=16),
        replace(BASE, strategy="static", batch_size=16),
    ]
    ranked = [tune.Candidate(c, 100.0 - i, 10.0) for i, c in enumerate(kept)]
    ranked.append(tune.Candidate(replace(BASE, batch_size=1), 1.0, 10.0, pruned="estimated too slow"))
    clock = [0.0]
    seen: list[Configuration] = []

    def measure(config: Configuration) -> stats.Summary:
        clock[0] += 100.0  # each measurement costs 100 s on the fake clock
        seen.append(config)
        if config.strategy == "static":
            raise tune.MeasureFailed("worker did not start")
        return summary_with_capacity(config, 50.0, 100.0 if config.batch_size == 8 else 50.0)

    budget = tune.Budget(650.0 + tune.RESERVE_S)
    measured, skipped = tune.explore(ranked, measure, budget, 100.0, lambda: clock[0], delays=(5, 20))
    assert [(c.strategy, c.batch_size, c.max_batch_delay) for c in seen] == [
        ("bucketed", 16, 10),  # the best of each strategy first
        ("dynamic", 16, 10),
        ("static", 16, 10),
        ("bucketed", 8, 10),  # then the rest by estimate; then the best so far at the other delays
        ("bucketed", 8, 5),
    ]
    assert skipped == [
        (replace(kept[3]), "failed: worker did not start"),
        (replace(kept[1], max_batch_delay=20), "budget (about 100 s each)"),
    ]
    assert len(measured) == 4 and budget.costs == [100.0] * 5


def test_deploy_commands_register_what_the_build_writes():
    from bench.kinds.tune import deploy_commands

    query, build, register = deploy_commands("bench/results/x/tuned.yaml", "http://127.0.0.1:8081", "m")
    assert build.endswith("--config bench/results/x/tuned.yaml --name m")
    assert query == "url=m.mar&model_name=m&synchronous=true" and register.endswith(f'/models?{query}"')


# --- bfloat16 under a fidelity floor (--min-cosine) -----------------------------------------------------------------


def test_bfloat16_is_considered_only_with_a_floor_on_a_cpu_that_multiplies_it():
    assert choice.reduced_dtypes(None, "amx_bf16") == (
        (),
        "float32 only: bfloat16 is considered only with a fidelity floor (--min-cosine)",
    )
    dtypes, why = choice.reduced_dtypes(0.999, None)
    assert dtypes == () and "no native bfloat16 (it would emulate it, slower than float32)" in why
    dtypes, why = choice.reduced_dtypes(0.999, "amx_bf16")
    assert (
        dtypes == ("bfloat16",) and why == "float32 and bfloat16 (amx_bf16); bfloat16 eligible at cosine min >= 0.999"
    )


def test_bfloat16_candidates_run_at_their_own_cost():
    slow, fast = CostModel(), CostModel(per_token_us=CostModel().per_token_us / 3)
    costs = {("torch", "float32"): slow, ("torch", "bfloat16"): fast}
    ranked = tune.candidates(BASE, LENGTHS, costs, 1e9, cores=2)
    plain = tune.candidates(BASE, LENGTHS, slow, 1e9, cores=2)
    assert len(ranked) == 2 * len(plain) and all(c.config.dtype is None for c in plain)
    reduced = [c for c in ranked if c.config.dtype == "bfloat16"]
    assert reduced and all(c.config.engine == "torch" for c in reduced)
    assert ranked[0].config.dtype == "bfloat16"  # cheaper per token: estimated faster
    heads = tune.first_round(ranked)
    kinds = {(c.config.strategy, c.config.dtype) for c in ranked if not c.pruned}
    assert {(s, d) for s, d in kinds if s == "bucketed"} == {("bucketed", None), ("bucketed", "bfloat16")}
    assert {(c.strategy, c.dtype) for c in heads[: len(kinds)]} == kinds  # float32 kept beside a faster bfloat16


# --- engines crossed with dtypes, each with its own cost model ------------------------------------------------------


def test_engines_cross_dtypes_as_the_registry_says_they_run():
    served = {"graph": ("float32",), "compiled": ("float32", "bfloat16"), "eager": ("float32", "bfloat16")}
    assert tune.engine_dtypes(served, ()) == [("graph", "float32"), ("compiled", "float32"), ("eager", "float32")]
    assert tune.engine_dtypes(served, ("bfloat16",)) == [
        ("graph", "float32"),
        ("compiled", "float32"),
        ("eager", "float32"),
        ("compiled", "bfloat16"),  # bfloat16 only on the engines that run it
        ("eager", "bfloat16"),
    ]
    assert tune.engine_dtypes({"graph": ("float32",)}, ("bfloat16",)) == [("graph", "float32")]


def test_the_registry_says_which_dtypes_each_engine_runs_on_this_cpu():
    from bucketing.engine_registry import ENGINES
    from bucketing.engines import cpu_dtypes

    native, emulated = "flags\t\t: fpu avx512f avx512_bf16\n", "flags\t\t: fpu avx2\n"
    for name, kind in ENGINES.items():
        assert cpu_dtypes(name, emulated) == ("float32",)
        assert cpu_dtypes(name, native) == tuple(d for d in kind.dtypes if d in ("float32", "bfloat16"))
    assert "bfloat16" not in cpu_dtypes("onnxruntime", native)
    assert {"torch", "openvino"} <= {e for e in ENGINES if "bfloat16" in cpu_dtypes(e, native)}


def test_tune_engines_are_the_registry_unless_named():
    from bench.harness.options import Options
    from bench.kinds.tune import tune_engines

    registry = ("torch", "onnxruntime", "openvino")
    assert tune_engines(Options(), registry) == registry
    assert tune_engines(Options(engines="openvino,onnxruntime,openvino"), registry) == ("openvino", "onnxruntime")


COSTS = {  # a graph engine, a compiled one with half its fixed cost (and faster in bfloat16), an eager one
    ("graph", "float32"): CostModel(overhead_us=3000.0, per_token_us=225.0, per_token_sq_us=0.2),
    ("compiled", "float32"): CostModel(overhead_us=2800.0, per_token_us=230.0, per_token_sq_us=0.1),
    ("eager", "float32"): CostModel(overhead_us=30000.0, per_token_us=600.0, per_token_sq_us=0.5),
    ("compiled", "bfloat16"): CostModel(overhead_us=1500.0, per_token_us=110.0, per_token_sq_us=0.08),
    ("eager", "bfloat16"): CostModel(overhead_us=30000.0, per_token_us=400.0, per_token_sq_us=0.5),
}


def test_each_candidate_is_estimated_with_its_own_engine_and_dtype():
    ranked = tune.candidates(BASE, LENGTHS, COSTS, 1e9, cores=2)
    per_pair = len(tune.candidates(BASE, LENGTHS, CostModel(), 1e9, cores=2))
    assert len(ranked) == len(COSTS) * per_pair
    for c in ranked:
        pair = (str(c.config.engine), c.config.dtype or "float32")
        assert (c.est_rps, c.est_floor_ms) == tune.estimate(c.config, LENGTHS, COSTS[pair])
    assert (ranked[0].config.engine, ranked[0].config.dtype) == ("compiled", "bfloat16")
    f32 = [c for c in ranked if c.config.dtype is None]
    assert (f32[0].config.engine, f32[0].config.strategy) == ("compiled", "bucketed")


def test_pruning_is_per_dtype_across_engines():
    ranked = tune.candidates(BASE, LENGTHS, COSTS, 1e9, cores=2)
    kept = [c for c in ranked if not c.pruned]
    best = {d: max(c.est_rps for c in ranked if c.config.dtype == d) for d in (None, "bfloat16")}
    for c in ranked:
        below = c.est_rps < tune.PRUNE_BELOW * best[c.config.dtype]
        assert bool(c.pruned) == below
        assert not below or "best estimate of its dtype" in c.pruned
    assert not any(c.config.engine == "eager" for c in kept)  # a tenfold fixed cost: pruned on every dtype
    assert {(c.config.engine, c.config.dtype) for c in kept} == {
        ("graph", None),
        ("compiled", None),
        ("compiled", "bfloat16"),
    }
    heads = tune.first_round(ranked)
    # the best of each kept (engine, dtype) leads, float32 measured beside the faster bfloat16
    assert [(c.engine, c.dtype) for c in heads[:3]] == [("compiled", "bfloat16"), ("compiled", None), ("graph", None)]
    assert heads[:3] == [
        next(c.config for c in kept if (c.config.engine, c.config.dtype) == (c3.engine, c3.dtype)) for c3 in heads[:3]
    ]


def test_a_lower_fixed_cost_in_tokens_makes_the_planner_choose_more_tighter_passes():
    graph = COSTS[("graph", "float32")]
    calibrated: dict[tuple[str, str], CostModel | str] = {
        ("graph", "float32"): graph,
        ("cheap", "float32"): replace(graph, overhead_us=graph.overhead_us / 4),  # a quarter of its fixed cost
        ("halved", "float32"): replace(graph, overhead_us=graph.overhead_us / 2, per_token_us=graph.per_token_us / 2),
        ("eager", "bfloat16"): "handler.dtype bfloat16 on engine eager: refused here",
    }
    costs = choice.engine_costs(BASE, LENGTHS, calibrated)
    assert [(e.engine, e.dtype) for e in costs] == list(calibrated)
    full, cheap, halved, refused = costs
    assert refused.cost is None and refused.refused.endswith("refused here") and refused.passes == 0
    assert cheap.passes > full.passes > 1 and cheap.rows < full.rows
    assert full.passes * full.rows == pytest.approx(len(LENGTHS) / 13)  # texts a delivered batch: 12 of 16, one of 8
    assert cheap.est_rps > full.est_rps
    assert halved.fixed_tokens == full.fixed_tokens == pytest.approx(graph.overhead_us / graph.per_token_us)
    assert halved.passes >= full.passes and halved.est_rps > 1.8 * full.est_rps  # twice as fast at a similar split


def test_the_winners_yaml_names_its_engine_and_dtype():
    from model_store import archives

    f32 = replace(BASE, engine="openvino")
    handler = HandlerConfig.from_yaml(choice.model_config(f32, archives.model_config("bucketed"), 0.999))
    assert (handler.engine, handler.dtype, handler.min_cosine) == ("openvino", "float32", HandlerConfig.min_cosine)
    bf16 = replace(BASE, engine="openvino", dtype="bfloat16")
    cfg = choice.model_config(bf16, archives.model_config("bucketed"), 0.999)
    assert (cfg["handler"]["engine"], cfg["handler"]["dtype"], cfg["handler"]["min_cosine"]) == (
        "openvino",
        "bfloat16",
        0.999,
    )


def test_engine_choice_names_the_best_of_each_engine_and_dtype():
    onnx = summary_with_capacity(replace(BASE, engine="onnxruntime"), 50, 40)
    ov = summary_with_capacity(replace(BASE, engine="openvino"), 55, 45)
    ov_bf16 = replace(
        summary_with_capacity(replace(BASE, engine="openvino", dtype="bfloat16"), 90, 80), min_cosine=0.9996
    )
    best = choice.best_per_engine([onnx, ov, ov_bf16])
    assert list(best) == [("openvino", "bfloat16"), ("openvino", "float32"), ("onnxruntime", "float32")]
    assert choice.engine_choice([onnx, ov, ov_bf16], 0.999) == (
        "engine openvino, dtype bfloat16: the best capacity of each engine and dtype measured: openvino bfloat16 "
        "80.0 req/s, openvino float32 45.0 req/s, onnxruntime float32 40.0 req/s"
    )
    assert choice.engine_choice([onnx, ov, ov_bf16], 0.9999).startswith("engine openvino, dtype float32: ")
    assert "openvino bfloat16 80.0 req/s (below the floor)" in choice.engine_choice([onnx, ov, ov_bf16], 0.9999)


def test_a_bfloat16_winner_needs_its_cosine_to_reach_the_floor():
    f32 = summary_with_capacity(BASE, 50, 40)
    bf16 = replace(summary_with_capacity(replace(BASE, dtype="bfloat16", engine="torch"), 90, 80), min_cosine=0.9996)
    assert tune.rank([f32, bf16]) == [f32]  # no floor: float32 only
    assert tune.rank([f32, bf16], 0.999) == [bf16, f32]
    assert tune.rank([f32, bf16], 0.9999) == [f32]
    assert tune.rank([f32, replace(bf16, min_cosine=None)], 0.999) == [f32]  # unmeasured fidelity never wins
    why = choice.dtype_choice([f32, bf16], 0.999, "considered")
    assert why == (
        "dtype bfloat16: bfloat16's best capacity 80.0 req/s (cosine min 0.999600, floor 0.999) against float32's "
        "best capacity 40.0 req/s"
    )
    assert choice.dtype_choice([f32, bf16], 0.9999, "considered").startswith(
        "dtype float32: bfloat16 measured at cosine min 0.999600, below the floor 0.9999"
    )
    assert choice.dtype_choice([f32], None, "float32 only: why") == "dtype float32: float32 only: why"


def test_a_bfloat16_winner_deploys_with_its_floor():
    from model_store import archives

    winner = replace(BASE, dtype="bfloat16", engine="torch")
    handler = HandlerConfig.from_yaml(choice.model_config(winner, archives.model_config("bucketed"), 0.999))
    assert (handler.dtype, handler.engine, handler.min_cosine) == ("bfloat16", "torch", 0.999)
    plain = HandlerConfig.from_yaml(choice.model_config(BASE, archives.model_config("bucketed"), 0.999))
    assert plain.dtype == "float32" and plain.min_cosine == HandlerConfig.min_cosine
