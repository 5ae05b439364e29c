"""bench.harness.report: blocks, comparisons and report.md against golden output."""

from __future__ import annotations

from dataclasses import replace

from bench.harness import report, stats
from tests.unit.summaries import GOLDEN, summary


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


def test_blocks_and_rows_say_engine_and_device():
    s = replace(summary("bucketed", 16, 2.0, 100), engine="onnxruntime", device="cpu")
    assert "2 workers x 1 thread, onnxruntime on cpu]" in report.render_block(s).splitlines()[0]
    assert (s.row()["engine"], s.row()["device"]) == ("onnxruntime", "cpu")
