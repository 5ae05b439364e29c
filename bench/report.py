"""Pure rendering: terminal blocks (hyperfine-like), closing comparison lines, and report.md."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from .stats import Comparison, Summary


def _num(value: float | None, fmt: str = ".1f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, fmt)


def render_block(s: Summary) -> str:
    """One configuration's figures, one block."""
    c, h = s.config, s.handler
    load = f"closed loop, {c.concurrency} clients" if c.mode == "closed" else f"open loop, {c.rate:g} req/s Poisson"
    bound = f"   ({_num(s.bound_fraction, '.2f')} of padding-free bound)" if s.bound_fraction is not None else ""
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(s.errors.items())) or "none"
    server = f"server {_num(s.server_cpu_cores, '.2f')} cores, " if s.server_cpu_cores is not None else ""
    return "\n".join(
        [
            f"Config: {c.name}   [{c.workload_label}, {load}, {c.workers} workers x {c.threads} thread"
            f"{f', {s.engine} on {s.device}' if s.engine else ''}]",
            f"  Throughput:  {s.rps:7.1f} req/s   {s.tokens_per_s:8.0f} tokens/s{bound}",
            f"  Latency:     p50 {_num(s.p50_ms):>7} ms   p90 {_num(s.p90_ms):>7} ms   "
            f"p99 {_num(s.p99_ms):>7} ms   max {_num(s.max_ms):>7} ms",
            f"  Batching:    {_num(h.mean_batch_size, '.1f')} requests/batch, "
            f"{_num(h.sub_batches_per_batch, '.1f')} sub-batches/batch, "
            f"padding efficiency {_num(h.padding_efficiency, '.2f')} "
            f"({int(h.real_tokens)} real / {int(h.padded_tokens)} padded tokens)",
            f"  Requests:    {s.requests} sent, {s.ok} ok, errors: {errors}",
            f"  CPU:         {server}load generator {s.client_cpu_cores:.2f} cores",
        ]
    )


def render_comparison(cmp: Comparison) -> str:
    """`bucketed bs16 ran 2.1x the throughput of dynamic bs16, at 0.6x its p99`."""
    return (
        f"{cmp.a.config.name} ran {cmp.throughput_ratio:.2f}x the throughput of {cmp.b.config.name}, "
        f"at {_num(cmp.p99_ratio, '.2f')}x its p99 ({cmp.a.config.workload_label}, {cmp.a.config.mode} loop)"
    )


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


RESULT_COLUMNS = (
    "config", "engine", "device", "workload", "mode", "rps", "tokens_per_s", "p50_ms", "p90_ms", "p99_ms", "errors",
    "padding_efficiency", "mean_batch_size", "sub_batches_per_batch", "server_cpu_cores", "client_cpu_cores",
    "bound_fraction",
)  # fmt: skip


def results_table(summaries: Sequence[Summary]) -> str:
    return _table(RESULT_COLUMNS, [[s.row()[k] for k in RESULT_COLUMNS] for s in summaries])


def histogram_table(hist: Sequence[tuple[int, int, int]]) -> str:
    """Rows of (low, high, count) as a table with a text bar."""
    top = max((n for _, _, n in hist), default=0) or 1
    return _table(
        ["tokens", "texts", ""],
        [[f"{lo}-{hi}", n, "#" * max(1 if n else 0, round(30 * n / top))] for lo, hi, n in hist],
    )


def offline_table(rows: Sequence[Mapping[str, object]]) -> str:
    """The offline sweep: one row per (short_frac, batch size); padded tokens and estimated seconds per policy."""
    if not rows:
        return ""
    keys = [k for k in rows[0] if k.endswith(("_padded", "_est_s"))] + ["saved_vs_arrival"]
    headers = ["short_frac", "batch size", "real tokens", *[k.replace("_", " ") for k in keys]]
    return _table(headers, [[r["short_frac"], r["batch_size"], r["real_tokens"], *[r[k] for k in keys]] for r in rows])


def render_markdown(
    title: str,
    header: Mapping[str, str],
    summaries: Sequence[Summary],
    comparisons: Sequence[Comparison],
    histograms: Mapping[str, Sequence[tuple[int, int, int]]],
    offline_rows: Sequence[Mapping[str, object]],
    bounds: Sequence[Mapping[str, object]],
    plots: Sequence[str],
) -> str:
    """report.md: what was run where, the results table, comparisons, length histograms and plots."""
    parts = [f"# {title}", ""]
    parts += [f"- **{k}**: {v}" for k, v in header.items()]
    if summaries:
        parts += ["", "## Results", "", results_table(summaries)]
    if comparisons:
        parts += ["", "## Comparisons", ""] + [f"- {render_comparison(c)}" for c in comparisons]
    if bounds:
        parts += [
            "",
            "## Padding-free bound",
            "",
            "The same texts run in process, grouped by exact token length (zero padding), with the workers' threads; "
            "each configuration's `bound_fraction` is its real tokens/s over this.",
            "",
            _table(
                ["workload", "model", "engine", "processes x threads", "real tokens/s", "texts", "forward passes"],
                [
                    [
                        b.get("workload", ""),
                        b.get("model", "all-MiniLM-L6-v2"),
                        b.get("engine", "torch"),
                        f"{b.get('workers')} x {b.get('threads')}",
                        _num(b.get("tokens_per_s"), ".0f"),  # type: ignore[arg-type]
                        b.get("texts"),
                        b.get("forwards"),
                    ]
                    for b in bounds
                ],
            ),  # fmt: skip
        ]
    for name, hist in histograms.items():
        parts += ["", f"## Token lengths sent: {name}", "", histogram_table(hist)]
    if offline_rows:
        parts += [
            "",
            "## Offline: padded tokens by batching policy",
            "",
            "Delivered batches are consecutive requests in arrival order. Policies: `arrival` pads each batch to its "
            "longest text (dynamic padding); `sorted4` sorts the batch and runs fixed micro-batches of 4; "
            "`pow2` groups by power-of-two length buckets; `planner` is the bucketed handler's planner, which "
            "minimises estimated time (the cost model's), not padded tokens. `saved vs arrival` is the share of "
            "padded tokens the planner saves against dynamic padding.",
            "",
            offline_table(offline_rows),
        ]
    if plots:
        parts += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(parts) + "\n"
