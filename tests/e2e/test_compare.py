"""bench/compare.py end to end with tiny configurations: on a running TorchServe, on its own, and offline."""

from __future__ import annotations

import csv
import json

import pytest

from bench import compare
from model_store.archives import ROOT
from tests.e2e.conftest import processes_under

pytestmark = pytest.mark.e2e

REQUIRED = [
    "config",
    "strategy",
    "batch_size",
    "max_batch_delay",
    "workload",
    "mode",
    "rate",
    "rps",
    "tokens_per_s",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "errors",
    "padding_efficiency",
    "mean_batch_size",
]


def server_flags(torchserve) -> list[str]:
    """The flags that point the bench at a running TorchServe."""
    e = torchserve.endpoints
    return [
        *("--inference-url", e.inference, "--management-url", e.management, "--metrics-url", e.metrics),
        *("--token-file", str(torchserve.workdir / "key_file.json")),
    ]


def only_run(out):
    (run,) = list(out.iterdir())
    return run


def test_smoke_suite_against_a_running_torchserve(torchserve, tmp_path, capsys):
    """The smoke suite (bucketed and dynamic closed-loop, bucketed open-loop; mixed traffic) on a running TorchServe:
    every artefact written, each configuration's row whole and answered, bucketed padding less than dynamic, and
    every configuration unregistered after (the own-server path: the sparse, hosts and tune tests below)."""
    models = torchserve.client.models()  # other modules' shared models may be registered
    argv = [*server_flags(torchserve), "--suite", "smoke", "--duration", "2", "--no-progress", "--out", str(tmp_path)]
    assert compare.main(argv) == 0
    run = only_run(tmp_path)
    for name in (
        "results.csv",
        "results.json",
        "report.md",
        "offline.csv",
        "batching_comparison.svg",
        "queue_wait_comparison.svg",
        "padding_comparison.svg",
        "short_frac_sweep.svg",
    ):
        assert (run / name).exists(), name
    rows = list(csv.DictReader(open(run / "results.csv")))
    assert [r["config"] for r in rows][:2] == ["bucketed bs4 d20 1x1", "dynamic bs4 d20 1x1"] and len(rows) == 3
    for r in rows:
        assert set(REQUIRED) <= set(r)
        assert float(r["rps"]) > 0 and r["errors"] == "0"
        assert 0 < float(r["padding_efficiency"]) <= 1
    assert float(rows[0]["padding_efficiency"]) > float(rows[1]["padding_efficiency"])
    assert len(json.loads((run / "results.json").read_text())) == 3
    report = (run / "report.md").read_text()
    assert "## Results" in report and "## Token lengths sent" in report and "ran" in report
    out = capsys.readouterr().out
    assert "bucketed bs4 d20 1x1 ran" in out and "the throughput of dynamic bs4 d20 1x1" in out
    assert torchserve.client.models() == models  # every configuration was unregistered, nothing else
    assert processes_under(ROOT / ".tmp") == []


def test_sparse_workload_on_its_own_server(tmp_path):
    """`--workload sparse`: the generated SPLADE built and archived for torch, every answer a 200, and the
    configuration's workers' peak RSS read (one strategy: comparing them is the smoke suite's)."""
    argv = ["--workload", "sparse", "--strategies", "bucketed", "--batch-sizes", "4", "--workers", "1"]
    argv += ["--duration", "2", "--concurrency", "4", "--no-progress", "--out", str(tmp_path)]
    assert compare.main(argv) == 0
    rows = list(csv.DictReader(open(only_run(tmp_path) / "results.csv")))
    assert [r["config"] for r in rows] == ["bucketed bs4 1x1 torch [minilm-splade-random]"]
    for r in rows:
        assert r["workload"] == "sparse" and r["engine"] == "torch" and r["errors"] == "0" and float(r["rps"]) > 0
        assert float(r["worker_peak_rss_mb"]) > 100  # a worker holds at least the model
    assert processes_under(ROOT / ".tmp") == []


def test_hosts_side_by_side_on_servers_of_its_own(tmp_path):
    """`--hosts torchserve,standalone`: the configuration on TorchServe, then on a standalone server of the same
    archive and settings; both answer as the float32 reference, the standalone's /metrics gives the handler's
    figures, the report compares the hosts, and nothing is left running."""
    argv = ["--hosts", "torchserve,standalone", "--strategies", "bucketed", "--batch-sizes", "4", "--workers", "1"]
    argv += ["--duration", "2", "--concurrency", "4", "--no-progress", "--out", str(tmp_path)]
    assert compare.main(argv) == 0
    run = only_run(tmp_path)
    rows = list(csv.DictReader(open(run / "results.csv")))
    assert [(r["config"], r["host"]) for r in rows] == [
        ("bucketed bs4 1x1", "torchserve"),
        ("bucketed bs4 1x1 on standalone", "standalone"),
    ]
    for r in rows:
        assert r["errors"] == "0" and float(r["rps"]) > 0 and float(r["min_cosine"]) > 0.999
        assert 0 < float(r["padding_efficiency"]) <= 1 and float(r["mean_batch_size"]) >= 1  # the handler's counters
        assert float(r["server_cpu_cores"]) > 0 and float(r["worker_peak_rss_mb"]) > 100
    report = (run / "report.md").read_text()
    assert "## Hosts: standalone against torchserve" in report and "| standalone / torchserve req/s |" in report
    assert processes_under(ROOT / ".tmp") == []


def test_offline_mode(tmp_path, capsys):
    assert compare.main(["--offline", "--out", str(tmp_path)]) == 0
    run = only_run(tmp_path)
    assert (run / "short_frac_sweep.svg").exists() and (run / "offline.csv").exists()
    assert "planner padded" in capsys.readouterr().out


def test_own_texts_and_capacity_on_a_running_torchserve(torchserve, tmp_path):
    models = torchserve.client.models()  # other modules' shared models may be registered
    texts = tmp_path / "traffic.jsonl"
    lines = [{"text": f"short query {i}"} if i % 3 else {"text": "a much longer passage " * (5 + i)} for i in range(40)]
    texts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = [
        *server_flags(torchserve),
        "--strategies",
        "bucketed",
        "--batch-sizes",
        "4",
        "--workers",
        "1",
        "--duration",
        "2",
        "--concurrency",
        "4",
        "--texts",
        str(texts),
        "--sample",
        "30",
        "--p99-ms",
        "5000",
        "--capacity-steps",
        "2",
        "--step-s",
        "1",
        "--no-progress",
        "--out",
        str(tmp_path / "out"),
    ]
    assert compare.main(argv) == 0
    run = only_run(tmp_path / "out")
    (row,) = list(csv.DictReader(open(run / "results.csv")))
    assert row["workload"] == "file:traffic.jsonl" and row["errors"] == "0"
    assert (
        float(row["capacity_rps"]) > 0 and row["p99_target_ms"] == "5000.0" and int(row["capacity_steps"]) <= 2 + 1
    )  # 2 steps, then the deciding rate again
    (detail,) = json.loads((run / "results.json").read_text())
    assert all(step["requests"] > 0 for step in detail["capacity_detail"])
    report = (run / "report.md").read_text()
    assert "## Token lengths sent: file:traffic.jsonl" in report and "## Capacity at p99 <= 5000 ms" in report
    assert "traffic.jsonl: 30 texts (a sample of 30, seed 0)" in report
    assert torchserve.client.models() == models  # every configuration was unregistered, nothing else


@pytest.mark.parametrize(
    "content, name, extra, message",
    [
        (None, "missing.txt", [], "--texts: .*missing.txt: no such file"),
        (b"", "empty.txt", [], "empty.txt: no texts"),
        (b'{"body": "x"}\n', "t.jsonl", [], "t.jsonl: line 1 has no field 'text'"),
        (b"a,b\n1,2\n", "t.csv", ["--text-field", "body"], "t.csv: no column 'body'"),
        (b"ok\n\xff\n", "t.txt", [], "t.txt: line 2 is not UTF-8"),
    ],
)
def test_bad_texts_files_end_the_run_before_any_server(tmp_path, content, name, extra, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SystemExit, match=message) as e:
        compare.main(["--texts", str(path), *extra, "--out", str(tmp_path / "out")])
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_tune_needs_a_target(tmp_path):
    with pytest.raises(SystemExit, match="--suite tune needs --p99-ms"):
        compare.main(["--suite", "tune", "--out", str(tmp_path)])


def test_tune_suite_recommends_and_remeasures_from_its_yaml(tmp_path):
    argv = [
        "--suite",
        "tune",
        "--p99-ms",
        "3000",
        "--budget-min",
        "2.5",
        "--duration",
        "2",
        "--step-s",
        "1",
        "--capacity-steps",
        "1",
        "--concurrency",
        "8",
        "--engines",  # one engine: calibrating each of the registry's would take most of this short budget
        "onnxruntime",
        "--no-progress",
        "--out",
        str(tmp_path),
    ]
    assert compare.main(argv) == 0
    run = only_run(tmp_path)
    rows = list(csv.DictReader(open(run / "results.csv")))
    assert len(rows) >= 2 and rows[-1]["config"].endswith("(from YAML)")
    assert all(float(r["rps"]) > 0 and r["errors"] == "0" for r in rows)
    import yaml

    cfg = yaml.safe_load((run / "tuned-model-config.yaml").read_text())
    winner = rows[-1]
    assert (cfg["batchSize"], cfg["maxBatchDelay"], cfg["minWorkers"]) == (
        int(winner["batch_size"]),
        int(winner["max_batch_delay"]),
        int(winner["workers"]),
    )
    assert cfg["handler"]["strategy"] == winner["strategy"]
    assert (cfg["handler"]["engine"], cfg["handler"]["dtype"]) == ("onnxruntime", "float32")
    report = (run / "report.md").read_text()
    parts = [
        "## Recommendation for p99 <= 3000 ms",
        "TorchServe applied every setting of the YAML",
        "curl -X POST",
        "tuned-model-config.yaml --name minilm-tuned",
        "### Engines and dtypes",
        "| onnxruntime | float32 |",
        "### Candidates",
        "skipped",
    ]
    for part in parts:
        assert part in report, part
    assert processes_under(ROOT / ".tmp") == []
