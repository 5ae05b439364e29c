"""bench/compare.py end to end with tiny configurations: on a running TorchServe, on its own, and offline."""

from __future__ import annotations

import csv
import json

import pytest

from bench import compare
from model_store.archives import ROOT
from tests.e2e.conftest import processes_under

pytestmark = pytest.mark.e2e

REQUIRED = ["config", "strategy", "batch_size", "max_batch_delay", "workload", "mode", "rate", "rps", "tokens_per_s",
            "p50_ms", "p90_ms", "p99_ms", "errors", "padding_efficiency", "mean_batch_size"]  # fmt: skip


def only_run(out):
    (run,) = list(out.iterdir())
    return run


def test_against_a_running_torchserve(torchserve, tmp_path, capsys):
    e = torchserve.endpoints
    argv = ["--inference-url", e.inference, "--management-url", e.management, "--metrics-url", e.metrics,
            "--token-file", str(torchserve.workdir / "key_file.json"), "--strategies", "bucketed,dynamic",
            "--batch-sizes", "4", "--workers", "1", "--duration", "2", "--concurrency", "8",
            "--workload", "mixed", "--no-progress", "--out", str(tmp_path)]  # fmt: skip
    assert compare.main(argv) == 0
    run = only_run(tmp_path)
    rows = list(csv.DictReader(open(run / "results.csv")))
    assert [r["config"] for r in rows] == ["bucketed bs4 1x1", "dynamic bs4 1x1"]
    for r in rows:
        assert set(REQUIRED) <= set(r)
        assert float(r["rps"]) > 0 and r["errors"] == "0"
        assert 0 < float(r["padding_efficiency"]) <= 1
    assert float(rows[0]["padding_efficiency"]) > float(rows[1]["padding_efficiency"])
    assert len(json.loads((run / "results.json").read_text())) == 2
    out = capsys.readouterr().out
    assert "bucketed bs4 1x1 ran" in out and "the throughput of dynamic bs4 1x1" in out
    assert torchserve.client.models() == []  # every configuration was unregistered


def test_smoke_suite_on_its_own_server(tmp_path):
    assert compare.main(["--suite", "smoke", "--duration", "2", "--no-progress", "--out", str(tmp_path)]) == 0
    run = only_run(tmp_path)
    for name in ("results.csv", "results.json", "report.md", "offline.csv", "batching_comparison.svg",
                 "queue_wait_comparison.svg", "padding_comparison.svg", "short_frac_sweep.svg"):  # fmt: skip
        assert (run / name).exists(), name
    report = (run / "report.md").read_text()
    assert "## Results" in report and "## Token lengths sent" in report and "ran" in report
    assert processes_under(ROOT / ".tmp") == []


def test_offline_mode(tmp_path, capsys):
    assert compare.main(["--offline", "--out", str(tmp_path)]) == 0
    run = only_run(tmp_path)
    assert (run / "short_frac_sweep.svg").exists() and (run / "offline.csv").exists()
    assert "planner padded" in capsys.readouterr().out
