"""The server's `/metrics`: the same `bucket_*` series the handler emits through TorchServe (`bucketing.metrics`:
one name, unit and histogram bounds each), summed per model (`ModelName` label, as TorchServe's endpoint labels
them), in Prometheus' text format; plus the host's own `standalone_*` series (answers by status, queue depth).

Histograms are Prometheus' `_bucket{le}`, `_sum`, `_count` series declared `counter`, as TorchServe shows the
handler's (README, "Metrics"). Updated on the event loop only (the workers' threads hand their figures back).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from bucketing.metrics import (
    ERRORS,
    FIDELITY,
    HISTOGRAMS,
    METRICS,
    SAMPLES,
    SAMPLES_MIN,
    BatchStats,
    Labels,
    Sample,
    Samples,
    cumulative,
)


def _labels(labels: Labels) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels) + "}" if labels else ""


class Registry:
    """Counters and gauges by (name, labels), rendered as Prometheus text."""

    def __init__(self) -> None:
        self.counters: dict[str, dict[Labels, float]] = defaultdict(lambda: defaultdict(float))
        self.gauges: dict[str, dict[Labels, float]] = defaultdict(dict)

    def add(self, name: str, value: float, labels: Labels = ()) -> None:
        self.counters[name][labels] += value

    def set(self, name: str, value: float, labels: Labels = ()) -> None:
        self.gauges[name][labels] = value

    def record(
        self, model: str, stats: BatchStats, cosine_min: float | None = None, samples: Samples | None = None
    ) -> None:
        """One served batch's figures, as `bucketing.metrics.emit` adds them to TorchServe's cache."""
        base: Labels = (("ModelName", model),)
        for name, (attr, _unit) in METRICS.items():
            self.add(name, float(getattr(stats, attr)), base)
        observed: dict[str, tuple[Sequence[float], list[tuple[float, int]]]] = {
            name: (HISTOGRAMS[name][1], obs) for name, obs in stats.observations().items()
        }
        if samples is not None:
            observed[SAMPLES] = (samples.bounds, [(c, 1) for c in samples.cosines])
        for name, (bounds, obs) in observed.items():
            for le, count in cumulative(obs, bounds):
                self.add(f"{name}_bucket", count, (*base, ("le", le)))
            self.add(f"{name}_sum", sum(v * w for v, w in obs), base)
            self.add(f"{name}_count", sum(w for _, w in obs), base)
        for (kind, status), count in Counter(stats.errors).items():
            self.add(ERRORS, count, (*base, ("type", kind), ("status", str(status))))
        if cosine_min is not None:
            self.set(FIDELITY, cosine_min, base)
        if samples is not None and samples.minimum is not None:
            self.set(SAMPLES_MIN, samples.minimum, base)

    def render(self, gauges: Iterable[tuple[str, float, Labels]] = (), samples: Iterable[Sample] = ()) -> str:
        """The text exposition format (0.0.4); `gauges`: values read now (queue depth, ...); `samples`: series read
        now with their type (`QueueSignals.samples`)."""
        lines: list[str] = []
        counters: dict[str, dict[Labels, float]] = defaultdict(dict, {k: dict(v) for k, v in self.counters.items()})
        now: dict[str, dict[Labels, float]] = defaultdict(dict, {k: dict(v) for k, v in self.gauges.items()})
        for name, value, labels in gauges:
            now[name][labels] = value
        for name, kind, labels, value in samples:
            (counters if kind == "counter" else now)[name][labels] = value
        for name in sorted(counters):
            lines.append(f"# TYPE {name} counter")
            lines += [f"{name}{_labels(k)} {_number(v)}" for k, v in counters[name].items()]
        for name in sorted(now):
            lines.append(f"# TYPE {name} gauge")
            lines += [f"{name}{_labels(k)} {_number(v)}" for k, v in sorted(now[name].items())]
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

__all__ = ["CONTENT_TYPE", "Registry"]
