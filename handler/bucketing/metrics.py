"""What one delivered batch cost and saved, and its emission as TorchServe custom metrics."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# Metric name -> (BatchStats field, unit). All are counters, summed by TorchServe's Prometheus endpoint.
METRICS = {
    "bucket_batches_total": ("batches", "count"),
    "bucket_requests_total": ("requests", "count"),
    "bucket_rejected_total": ("rejected", "count"),
    "bucket_failed_total": ("failed", "count"),
    "bucket_texts_total": ("texts", "count"),
    "bucket_real_tokens_total": ("real_tokens", "count"),
    "bucket_padded_tokens_total": ("padded_tokens", "count"),
    "bucket_sub_batches_total": ("sub_batches", "count"),
    "bucket_forward_ms_total": ("forward_ms", "ms"),
}


@dataclass(frozen=True)
class BatchStats:
    """What delivered batches cost: requests answered 4xx (`rejected`) and 5xx (`failed`), and the passes run."""

    batches: int = 1
    requests: int = 0
    rejected: int = 0
    failed: int = 0
    texts: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    sub_batches: int = 0
    forward_ms: float = 0.0

    @property
    def padding_efficiency(self) -> float | None:
        """Real / padded tokens (None before any token was run)."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else None

    @property
    def mean_batch_size(self) -> float | None:
        """Requests per delivered batch."""
        return self.requests / self.batches if self.batches else None

    @property
    def sub_batches_per_batch(self) -> float | None:
        return self.sub_batches / self.batches if self.batches else None

    def __add__(self, other: BatchStats) -> BatchStats:
        return BatchStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def emit(metrics: Any, stats: BatchStats) -> None:
    """Add one batch's figures to TorchServe's metric cache (`context.metrics`), if there is one."""
    if metrics is None:
        return
    from ts.metrics.metric_type_enum import MetricTypes

    for name, (attr, unit) in METRICS.items():
        # A fresh dimensions list each call: TorchServe appends its default dimensions to the one it gets.
        metrics.add_metric(name, getattr(stats, attr), unit, None, [], MetricTypes.COUNTER)
