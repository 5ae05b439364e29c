"""Pure rendering: terminal blocks (hyperfine-like), closing comparison lines, and report.md (a run kind's own
sections, `kinds/`, are built from `num`, `table` and `layout` here)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from bench.harness.stats import Comparison, Summary
from bench.inputs.configuration import TORCHSERVE, Configuration


def num(value: float | None, fmt: str = ".1f") -> str:
    """A figure, or `n/a` for none (or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, fmt)


def layout(c: Configuration) -> str:
    """`2 workers x 1 thread`, or `1 process x 2 threads` for a peer (whose workers are processes of its own)."""
    unit = ("process" if c.workers == 1 else "processes") if c.peer else "worker" if c.workers == 1 else "workers"
    return f"{c.workers} {unit} x {c.threads} thread{'s' if c.threads != 1 else ''}"


def render_block(s: Summary) -> str:
    """One configuration's figures, one block."""
    c, h = s.config, s.handler
    batching = (
        f"  Batching:    {num(h.mean_batch_size, '.1f')} requests/batch, "
        f"{num(h.sub_batches_per_batch, '.1f')} sub-batches/batch, "
        f"padding efficiency {num(h.padding_efficiency, '.2f')} "
        f"({int(h.real_tokens)} real / {int(h.padded_tokens)} padded tokens)"
        if not c.peer
        else f"  Batching:    {c.peer}'s own (batch size {c.batch_size}); it reports no padding counters"
    )
    load = f"closed loop, {c.concurrency} clients" if c.mode == "closed" else f"open loop, {c.rate:g} req/s Poisson"
    bound = f"   ({num(s.bound_fraction, '.2f')} of exact-length grouping)" if s.bound_fraction is not None else ""
    if s.roofline_fraction is not None:
        bound += f"   ({num(s.roofline_fraction, '.2f')} of the {GEMM_NAMES[c.dtype or 'float32']} GEMM roofline)"
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(s.errors.items())) or "none"
    server = f"server {num(s.server_cpu_cores, '.2f')} cores, " if s.server_cpu_cores is not None else ""
    return "\n".join(
        [
            f"Config: {c.name}   [{c.workload_label}, {load}, {layout(c)}"
            f"{f', {s.engine} on {s.device}' if s.engine else ''}]",
            f"  Throughput:  {s.rps:7.1f} req/s   {s.tokens_per_s:8.0f} tokens/s{bound}",
            f"  Latency:     p50 {num(s.p50_ms):>7} ms   p90 {num(s.p90_ms):>7} ms   "
            f"p99 {num(s.p99_ms):>7} ms   max {num(s.max_ms):>7} ms   "
            f"(shortest quarter p50 {num(s.short_p50_ms)} ms)",
            batching,
            *(
                [
                    f"  Answers:     {num(h.answer_us_per_text, '.1f')} us/text rendering and encoding, "
                    f"{num(h.answer_bytes_per_text, '.0f')} bytes/text"
                ]
                if not c.peer and h.texts
                else []
            ),
            f"  Requests:    {s.requests} sent, {s.ok} ok, errors: {errors}",
            f"  CPU:         {server}load generator {s.client_cpu_cores:.2f} cores",
            *([capacity_line(s)] if s.capacity else []),
            *(
                [f"  Memory:      worker peak RSS {s.worker_peak_rss_mb:.0f} MB ({memory_of(c)})"]
                if s.worker_peak_rss_mb is not None
                else []
            ),
            *(
                [f"  Answers:     cosine >= {s.min_cosine:.6f} against our float32 batch-of-one reference"]
                if s.min_cosine is not None
                else []
            ),
        ]
    )


def memory_of(c: Configuration) -> str:
    """What the peak RSS read: TorchServe's largest worker, or another host's processes that run the model (the
    standalone server's one process, whose workers are threads)."""
    return "the largest of its workers" if c.host == TORCHSERVE else "the largest of the processes running its model"


def capacity_line(s: Summary) -> str:
    """`Capacity: 38.4 req/s at p99 <= 200 ms (p99 171.2 ms; 5 open-loop steps of 240-410 requests)`."""
    cap = s.capacity
    assert cap is not None
    sizes = [st.requests for st in cap.steps]
    span = f"{min(sizes)}-{max(sizes)}" if sizes and min(sizes) != max(sizes) else str(sizes[0]) if sizes else ""
    steps = f"{len(sizes)} open-loop step{'s' if len(sizes) != 1 else ''} of {span} requests" if sizes else "no steps"
    if cap.best is None:
        return f"  Capacity:    none at p99 <= {cap.target_ms:g} ms (every rate tried missed it; {steps})"
    return (
        f"  Capacity:    {cap.rate:7.1f} req/s at p99 <= {cap.target_ms:g} ms "
        f"(p99 {cap.best.p99_ms:.1f} ms there; {steps})"
    )


def render_comparison(cmp: Comparison) -> str:
    """`bucketed bs16 ran 2.1x the throughput of dynamic bs16, at 0.6x its p99`, and the capacity ratio if any."""
    capacity = cmp.capacity_ratio
    held = (
        f"; held {num(capacity, '.2f')}x its capacity at p99 <= {cmp.a.capacity.target_ms:g} ms"  # type: ignore[union-attr]
        if capacity is not None
        else ""
    )
    return (
        f"{cmp.a.config.name} ran {cmp.throughput_ratio:.2f}x the throughput of {cmp.b.config.name}, "
        f"at {num(cmp.p99_ratio, '.2f')}x its p99 ({cmp.a.config.workload_label}, {cmp.a.config.mode} loop){held}"
    )


def ratio(a: float | None, b: float | None) -> str:
    """`a / b` to two decimals, or `n/a` (either unknown or NaN, or `b` zero)."""
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return "n/a"
    return f"{a / b:.2f}"


def load_label(c: Configuration) -> str:
    """`longtail, closed 32 clients` or `longtail, open 10 req/s`."""
    how = f"closed {c.concurrency} clients" if c.mode == "closed" else f"open {c.rate:g} req/s"
    return f"{c.workload_label}, {how}"


def host_sections(pairs: Sequence[Comparison]) -> list[str]:
    """One section per host pair (`stats.host_comparisons`): each configuration's figures on both hosts and their
    ratio, other host over the baseline."""
    out = []
    for other, base in dict.fromkeys((c.a.config.host, c.b.config.host) for c in pairs):
        group = [c for c in pairs if (c.a.config.host, c.b.config.host) == (other, base)]
        per = f"{other} / {base}"
        headers = ["config", "load"]
        for what in ("req/s", "p50 ms", "p99 ms"):
            headers += [f"{base} {what}", f"{other} {what}", f"{per} {what.removesuffix(' ms')}"]
        cores = any(c.a.server_cpu_cores is not None and c.b.server_cpu_cores is not None for c in group)
        searched = any(c.capacity_ratio is not None for c in group)
        headers += [f"{per} server cores"] * cores + [f"{per} capacity"] * searched
        rows = []
        for c in group:
            a, b = c.a, c.b
            row: list[object] = [b.config.name, load_label(b.config)]
            for x, y in ((a.rps, b.rps), (a.p50_ms, b.p50_ms), (a.p99_ms, b.p99_ms)):
                row += [num(y), num(x), ratio(x, y)]
            row += [ratio(a.server_cpu_cores, b.server_cpu_cores)] * cores + [num(c.capacity_ratio, ".2f")] * searched
            rows.append(row)
        out.append(
            "\n".join(
                [
                    f"## Hosts: {other} against {base}",
                    "",
                    f"The same configuration (archive, engine, precision, batch settings, workers x threads) and the "
                    f"same load on each host in turn (`--hosts`); `{per}` is the {other} figure over the {base} one.",
                    "",
                    table(headers, rows),
                ]
            )
        )
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


RESULT_COLUMNS = (
    "config",
    "server",
    "engine",
    "device",
    "workload",
    "mode",
    "rps",
    "tokens_per_s",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "errors",
    "padding_efficiency",
    "mean_batch_size",
    "sub_batches_per_batch",
    "answer_us_per_text",
    "answer_bytes_per_text",
    "server_cpu_cores",
    "client_cpu_cores",
    "bound_fraction",
)
CAPACITY_COLUMNS = ("capacity_rps", "capacity_p99_ms")  # shown when the run searched capacity (--p99-ms)
FIDELITY_COLUMNS = ("min_cosine",)  # shown when answers were checked against our float32 reference
MEMORY_COLUMNS = ("worker_peak_rss_mb",)  # shown when the workers' peak RSS was read
DTYPE_COLUMNS = ("dtype",)  # shown when a configuration ran other than float32, or beside a peer
GEMM_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def results_table(summaries: Sequence[Summary]) -> str:
    columns = list(RESULT_COLUMNS)
    if any(s.capacity for s in summaries):
        columns[columns.index("p99_ms") + 1 : columns.index("p99_ms") + 1] = CAPACITY_COLUMNS
    if any(s.config.dtype not in (None, "float32") or s.config.peer for s in summaries):  # a peer says its dtype
        columns[columns.index("engine") + 1 : columns.index("engine") + 1] = DTYPE_COLUMNS
    if any(s.min_cosine is not None for s in summaries):
        columns += FIDELITY_COLUMNS
    if any(s.worker_peak_rss_mb is not None for s in summaries):
        columns += MEMORY_COLUMNS
    return table(columns, [[s.row()[k] for k in columns] for s in summaries])


def capacity_table(summaries: Sequence[Summary]) -> str:
    """Every open-loop step of every capacity search: rate, requests sent, p99, errors, within the target."""
    rows = []
    for s in summaries:
        if not s.capacity:
            continue
        for i, st in enumerate(s.capacity.steps, 1):
            ok = "yes" if st.passes(s.capacity.target_ms) else "no"
            rate, seconds = f"{st.rate:g}", f"{st.duration_s:.0f}"
            rows.append([s.config.name, i, rate, st.requests, seconds, num(st.p99_ms), st.errors, ok])
    return table(["config", "step", "rate (req/s)", "requests", "seconds", "p99 ms", "errors", "within target"], rows)


def histogram_table(hist: Sequence[tuple[int, int, int]]) -> str:
    """Rows of (low, high, count) as a table with a text bar."""
    top = max((n for _, _, n in hist), default=0) or 1
    return table(
        ["tokens", "texts", ""],
        [[f"{lo}-{hi}", n, "#" * max(1 if n else 0, round(30 * n / top))] for lo, hi, n in hist],
    )


def offline_table(rows: Sequence[Mapping[str, object]]) -> str:
    """The offline sweep: one row per (short_frac, batch size); padded tokens and estimated seconds per policy."""
    if not rows:
        return ""
    keys = [k for k in rows[0] if k.endswith(("_padded", "_est_s"))] + ["saved_vs_arrival"]
    headers = ["short_frac", "batch size", "real tokens", *[k.replace("_", " ") for k in keys]]
    return table(headers, [[r["short_frac"], r["batch_size"], r["real_tokens"], *[r[k] for k in keys]] for r in rows])


def render_markdown(
    title: str,
    header: Mapping[str, str],
    summaries: Sequence[Summary],
    comparisons: Sequence[Comparison],
    histograms: Mapping[str, Sequence[tuple[int, int, int]]],
    offline_rows: Sequence[Mapping[str, object]],
    bounds: Sequence[Mapping[str, object]],
    plots: Sequence[str],
    extra: Sequence[str] = (),
    host_pairs: Sequence[Comparison] = (),
) -> str:
    """report.md: what was run where, the results table, comparisons, the hosts side by side (when more than one
    ran), extra sections (the tune suite's recommendation), capacity steps, length histograms and plots."""
    parts = [f"# {title}", ""]
    parts += [f"- **{k}**: {v}" for k, v in header.items()]
    if summaries:
        parts += ["", "## Results", "", results_table(summaries)]
    if comparisons:
        parts += ["", "## Comparisons", ""] + [f"- {render_comparison(c)}" for c in comparisons]
    for section in host_sections(host_pairs):
        parts += ["", section]
    for section in extra:
        parts += ["", section.rstrip("\n")]
    searched = [s for s in summaries if s.capacity]
    if searched:
        target = searched[0].capacity.target_ms  # type: ignore[union-attr]
        parts += [
            "",
            f"## Capacity at p99 <= {target:g} ms",
            "",
            "Each configuration's capacity is the highest open-loop (Poisson) arrival rate measured with its p99 "
            "within the target and no errors: a search that starts at half the closed-loop throughput, brackets, "
            "then bisects. Latency counts from each request's intended send time. Every step:",
            "",
            capacity_table(searched),
        ]
    if bounds:
        parts += [
            "",
            "## Exact-length grouping (a reference, not a bound)",
            "",
            "The same texts run in process, grouped by exact token length (zero padding), with the workers' threads; "
            "each configuration's `bound_fraction` is its real tokens/s over this. It is not a limit: exact-length "
            "groups are small and pay more per-pass overhead, and a configuration can run faster. The limit is the "
            "fp32 GEMM roofline (`roofline_fraction`, bench/harness/roofline.py).",
            "",
            table(
                ["workload", "model", "engine", "processes x threads", "real tokens/s", "texts", "forward passes"],
                [
                    [
                        b.get("workload", ""),
                        b.get("model", "all-MiniLM-L6-v2"),
                        b.get("engine", "torch"),
                        f"{b.get('workers')} x {b.get('threads')}",
                        num(b.get("tokens_per_s"), ".0f"),  # type: ignore[arg-type]
                        b.get("texts"),
                        b.get("forwards"),
                    ]
                    for b in bounds
                ],
            ),
        ]
    for name, hist in histograms.items():
        parts += [
            "",
            f"## Token lengths sent: {name}",
            "",
            f"Every measured request ({sum(n for _, _, n in hist)}), in the model's tokens as served (special "
            "tokens included; a text over max_length counts as cut to it).",
            "",
            histogram_table(hist),
        ]
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
