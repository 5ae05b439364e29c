"""bench.compare and bench.harness.run_plan: flags, suites and axes into configurations, one-line errors; and
model_store.build's checks of a model-config."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.inputs.configuration import Configuration

# --- --texts ---------------------------------------------------------------------------------------------------


BASE = Configuration("bucketed", 16, duration=8)


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
        (["--min-cosine", "0.999"], "--min-cosine: got 0.999; allowed: with --suite tune, a floor in"),
        (["--suite", "tune", "--p99-ms", "100", "--min-cosine", "1.5"], "--min-cosine: got 1.5; allowed"),
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


def test_engines_are_an_axis_over_a_suite_or_a_matrix():
    from bench.compare import parse_args, plan_from_args

    suite = plan_from_args(parse_args(["--suite", "batch-size", "--engines", "torch"]))
    assert suite.name == "batch-size" and {c.engine for c in suite.configs} == {"torch"}
    matrix = plan_from_args(parse_args(["--strategies", "bucketed", "--engines", "torch,onnxruntime"]))
    assert [c.name for c in matrix.configs] == ["bucketed bs16 torch", "bucketed bs16 onnxruntime"]
    every = plan_from_args(parse_args(["--strategies", "bucketed", "--engines", "onnxruntime,openvino"]))
    assert [c.engine for c in every.configs] == ["onnxruntime", "openvino"]
    with pytest.raises(SystemExit, match="--engines"):
        plan_from_args(parse_args(["--engines", "tensorrt"]))


def test_model_axis_names_and_suite():
    from bench.compare import parse_args, plan_from_args
    from bench.inputs import models

    assert models.prefix(None, None) == "minilm" and models.prefix("/data/My_Encoder.v2", None) == "my-encoder-v2"
    assert models.prefix("bert-base-random", "torch") == "bert-base-random-torch"
    suite = plan_from_args(parse_args(["--suite", "model-size"]))
    assert {c.model for c in suite.configs} == {None, "bert-base-random"} and suite.bound
    custom = plan_from_args(parse_args(["--strategies", "bucketed", "--model-dir", "/data/enc"]))
    assert custom.configs[0].model == "/data/enc" and custom.configs[0].name == "bucketed bs16 [enc]"
    with pytest.raises(SystemExit, match="no config.json"):
        models.model_dir("/nonexistent/encoder")


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


def test_dtypes_are_an_axis_and_name_their_archives():
    from bench.compare import parse_args, plan_from_args
    from bench.inputs import models

    matrix = plan_from_args(parse_args(["--strategies", "bucketed", "--dtypes", "float32,bfloat16"]))
    assert [c.name for c in matrix.configs] == ["bucketed bs16 float32", "bucketed bs16 bfloat16"]
    suite = plan_from_args(parse_args(["--suite", "batch-size", "--dtypes", "bfloat16"]))
    assert {c.dtype for c in suite.configs} == {"bfloat16"}
    with pytest.raises(SystemExit, match="--dtypes: got float16; allowed: float32 | bfloat16"):
        plan_from_args(parse_args(["--dtypes", "float16"]))  # a CPU worker never runs float16
    assert models.prefix(None, None, dtype="bfloat16") == "minilm-bfloat16"
    assert models.prefix(None, None, dtype="float32") == models.prefix(None, None) == "minilm"


def test_engines_crossed_with_dtypes_leave_out_the_pairs_no_engine_runs_before_any_server_starts(capsys):
    from bench.compare import parse_args, plan_from_args

    argv = ["--strategies", "bucketed", "--engines", "onnxruntime,openvino", "--dtypes", "float32,bfloat16"]
    plan = plan_from_args(parse_args(argv))
    assert [(c.engine, c.dtype) for c in plan.configs] == [
        ("onnxruntime", "float32"),
        ("openvino", "float32"),
        ("openvino", "bfloat16"),
    ]
    assert "left out: bucketed bs16 onnxruntime bfloat16 (the onnxruntime engine does not run bfloat16)" in (
        capsys.readouterr().out
    )
    with pytest.raises(SystemExit, match="no engine here runs its dtype \\(onnxruntime bfloat16\\)"):
        plan_from_args(parse_args(["--strategies", "bucketed", "--engines", "onnxruntime", "--dtypes", "bfloat16"]))


def test_bfloat16_on_a_cpu_without_it_is_refused_before_any_server_starts(monkeypatch):
    import bucketing.engines.precision
    from bench.compare import check_args, parse_args, plan_from_args

    args = parse_args(["--strategies", "bucketed", "--dtypes", "float32,bfloat16"])
    monkeypatch.setattr(bucketing.engines.precision, "cpu_info", lambda: "flags\t\t: fpu avx2\n")
    with pytest.raises(SystemExit, match=r"^--dtypes bfloat16: this CPU has no native bfloat16 .*bench.probes.bf16"):
        check_args(args, plan_from_args(args))
    monkeypatch.setattr(bucketing.engines.precision, "cpu_info", lambda: "flags\t\t: fpu avx2 amx_bf16\n")
    assert check_args(args, plan_from_args(args)) is None


def test_the_sparse_workload_picks_the_splade_model_on_torch():
    from bench import compare
    from bench.inputs import models

    for argv in (["--workload", "sparse", "--strategies", "bucketed,dynamic"], ["--suite", "sparse"]):
        args = compare.parse_args(argv)
        plan = compare.plan_from_args(args)
        compare.check_args(args, plan)
        assert {(c.workload, c.model, c.engine) for c in plan.configs} == {("sparse", "minilm-splade-random", "torch")}
        assert {models.task(c.workload) for c in plan.configs} == {"sparse"}
    assert {c.strategy for c in compare.plan_from_args(compare.parse_args(["--suite", "sparse"])).configs} == {
        "bucketed",
        "dynamic",
        "static",
    }
    own = compare.plan_from_args(compare.parse_args(["--workload", "sparse", "--model-dir", "/data/splade"]))
    assert {(c.model, c.engine) for c in own.configs} == {("/data/splade", "torch")}  # a user's SPLADE: still torch
    args = compare.parse_args(["--workload", "sparse", "--strategies", "bucketed", "--engines", "torch,onnxruntime"])
    both = compare.plan_from_args(args)
    compare.check_args(args, both)
    assert {c.engine for c in both.configs} == {"torch", "onnxruntime"}
    assert (models.task("longtail"), models.task("rerank")) == ("embedding", "classification")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--bound"], "--workload sparse: not with --peer, --suite tune or --bound"),
        (["--peer", "infinity"], "--workload sparse: not with --peer"),
        (["--dtypes", "bfloat16"], "--workload sparse: --dtypes bfloat16: a sparse model is served in float32 only"),
    ],
)
def test_the_sparse_workload_refuses_what_it_cannot_combine_with(extra, message):
    from bench import compare

    args = compare.parse_args(["--workload", "sparse", "--strategies", "bucketed", *extra])
    with pytest.raises(SystemExit, match=message):
        compare.check_args(args, compare.plan_from_args(args))
    args = compare.parse_args(["--suite", "tune", "--p99-ms", "300", "--workload", "sparse"])
    with pytest.raises(SystemExit, match="--workload sparse: not with"):
        compare.check_args(args, compare.plan_from_args(args))


def test_the_builder_is_split_by_job_each_module_under_the_house_size():
    """model_store's modules stay under the house's ~400 lines (build.py was 409): the folder checks and model-configs
    in archive_spec, staging and the archiver in archiver, the CLI in build, which still offers what its importers
    (the bench, the tests) read from it."""
    from model_store import archive_spec, archiver, build
    from model_store.archives import ROOT

    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted((ROOT / "model_store").glob("*.py"))}
    assert all(n <= 400 for n in sizes.values()), sizes
    assert build.ArchiveSpec is archive_spec.ArchiveSpec and build.BuildError is archive_spec.BuildError
    assert build.STRATEGIES == archive_spec.STRATEGIES
    assert all(callable(f) for f in (build.main, build.build_archives, build.from_config, archiver.build_all))
