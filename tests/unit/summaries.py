"""A literal Summary for the bench's pure tests: one configuration's samples shaped by rate and p99."""

from __future__ import annotations

from pathlib import Path

from bench.harness import stats
from bench.inputs.configuration import Configuration


def summary(strategy, bs, rps_scale, p99, mode="closed", rate=None):
    config = Configuration(strategy, bs, mode=mode, rate=rate)
    samples = [(10.0 * (i % 10 + 1) * p99 / 100, 200, 50) for i in range(int(100 * rps_scale))]
    samples += [(1.0, 503, 50)] * 2
    padded = round(5000 / (0.95 if strategy == "bucketed" else 0.4))
    handler = stats.HandlerDelta(
        batches=10,
        requests=100,
        texts=100,
        real_tokens=5000,
        padded_tokens=padded,
        sub_batches=30,
        forward_ms=900,
        answer_ms=1.25,
        answer_bytes=807_700,
    )
    return stats.summarize(config, samples, 10.0, handler, 0.5, 15.0, 20000.0)


GOLDEN = Path(__file__).parent / "golden"  # expected renderings (report.md, blocks, the tune section)
