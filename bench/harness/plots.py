"""SVG plots of a comparison run (matplotlib, no display); each returns the file name it wrote, or None."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.harness.stats import Summary  # noqa: E402
from bench.inputs.configuration import TORCHSERVE  # noqa: E402

COLORS = {"bucketed": "#1b9e77", "dynamic": "#d95f02", "static": "#7570b3", "infinity": "#e7298a"}
HOST_STYLES = ("-", "--", ":", "-.")  # a line style per host, in the order they ran (TorchServe's solid)


def series(s: Summary) -> tuple[str, str]:
    """A plot's series: the strategy, and the host our worker ran on."""
    return s.config.strategy, s.config.host


def series_label(strategy: str, host: str) -> str:
    """`bucketed`, or `bucketed on standalone` off TorchServe."""
    return strategy if host == TORCHSERVE else f"{strategy} on {host}"


def host_style(summaries: Sequence[Summary], host: str) -> str:
    hosts = list(dict.fromkeys([TORCHSERVE] + [s.config.host for s in summaries]))
    return HOST_STYLES[hosts.index(host) % len(HOST_STYLES)]


def _save(fig: plt.Figure, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / f"{name}.svg", format="svg")
    plt.close(fig)
    return f"{name}.svg"


def batching_comparison(summaries: Sequence[Summary], out: Path) -> str | None:
    """Throughput of every closed-loop configuration: direct inference (bs1) against batching."""
    closed = [s for s in summaries if s.config.mode == "closed"]
    if not closed:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(closed) + 1.5))
    labels = [f"{s.config.name} [{s.config.workload_label}]" for s in closed]
    ax.barh(labels, [s.rps for s in closed], color=[COLORS.get(s.config.strategy, "grey") for s in closed])
    ax.invert_yaxis()
    ax.set_xlabel("requests/s (closed loop)")
    ax.set_title("Throughput by configuration")
    return _save(fig, out, "batching_comparison")


def batch_size_comparison(summaries: Sequence[Summary], out: Path) -> str | None:
    """Throughput and p99 against batch size, a line per strategy (closed loop)."""
    closed = [s for s in summaries if s.config.mode == "closed"]
    if len({s.config.batch_size for s in closed}) < 2:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for strategy, host in sorted({series(s) for s in closed}):
        pts = sorted((s.config.batch_size, s.rps, s.p99_ms) for s in closed if series(s) == (strategy, host))
        xs = [p[0] for p in pts]
        style, label = f"o{host_style(closed, host)}", series_label(strategy, host)
        left.plot(xs, [p[1] for p in pts], style, label=label, color=COLORS.get(strategy))
        right.plot(xs, [p[2] for p in pts], style, label=label, color=COLORS.get(strategy))
    for ax, ylabel in ((left, "requests/s"), (right, "p99 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.legend()
    fig.suptitle("Batch-size sensitivity")
    return _save(fig, out, "batch_size_comparison")


def queue_wait_comparison(summaries: Sequence[Summary], out: Path) -> str | None:
    """Open loop: achieved throughput against p99, a curve per (strategy, max_batch_delay) over the rates."""
    opened = [s for s in summaries if s.config.mode == "open"]
    if not opened:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    keys = sorted({(*series(s), s.config.max_batch_delay) for s in opened})
    for strategy, host, delay in keys:
        pts = sorted(
            (s.config.rate or 0, s.rps, s.p99_ms)
            for s in opened
            if (*series(s), s.config.max_batch_delay) == (strategy, host, delay)
        )
        style, label = f"o{host_style(opened, host)}", f"{series_label(strategy, host)} delay {delay} ms"
        ax.plot([p[1] for p in pts], [p[2] for p in pts], style, label=label)
    ax.set_xlabel("achieved requests/s")
    ax.set_ylabel("p99 latency (ms, from intended send time)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("Batch delay: throughput against p99 (open loop)")
    return _save(fig, out, "queue_wait_comparison")


def padding_comparison(summaries: Sequence[Summary], out: Path) -> str | None:
    """Padding efficiency and throughput per strategy, grouped by workload (closed loop, batch size > 1)."""
    pts = [s for s in summaries if s.config.mode == "closed" and s.config.batch_size > 1 and not s.config.peer]
    if not pts:
        return None
    workloads = sorted({s.config.workload_label for s in pts})
    strategies = sorted({series(s) for s in pts})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(strategies)
    for k, (strategy, host) in enumerate(strategies):
        eff, rps = [], []
        for w in workloads:
            match = [s for s in pts if series(s) == (strategy, host) and s.config.workload_label == w]
            eff.append(match[0].handler.padding_efficiency or 0 if match else 0)
            rps.append(match[0].rps if match else 0)
        xs = [i + k * width for i in range(len(workloads))]
        hatch = None if host == TORCHSERVE else "//"
        label, color = series_label(strategy, host), COLORS.get(strategy)
        left.bar(xs, eff, width, label=label, color=color, hatch=hatch)
        right.bar(xs, rps, width, label=label, color=color, hatch=hatch)
    for ax, ylabel in ((left, "padding efficiency (real / padded)"), (right, "requests/s")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads, rotation=15, fontsize=8)
        ax.set_ylabel(ylabel)
        ax.legend()
    fig.suptitle("Padding strategy")
    return _save(fig, out, "padding_comparison")


def capacity_comparison(summaries: Sequence[Summary], out: Path) -> str | None:
    """Capacity at the p99 target next to closed-loop throughput, a bar pair per configuration."""
    searched = [s for s in summaries if s.capacity]
    if not searched:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(searched) + 1.5))
    labels = [s.config.name for s in searched]
    ys = range(len(searched))
    ax.barh([y + 0.2 for y in ys], [s.rps for s in searched], 0.4, color="lightgrey", label="closed-loop throughput")
    colors = [COLORS.get(s.config.strategy, "grey") for s in searched]
    rates = [s.capacity.rate if s.capacity else 0.0 for s in searched]
    target = searched[0].capacity.target_ms if searched[0].capacity else float("nan")
    ax.barh([y - 0.2 for y in ys], rates, 0.4, color=colors, label=f"capacity at p99 <= {target:g} ms")
    ax.set_yticks(list(ys), labels)
    ax.invert_yaxis()
    ax.set_xlabel("requests/s")
    ax.legend(fontsize=8)
    ax.set_title("Capacity at the latency target")
    return _save(fig, out, "capacity_comparison")


def short_frac_sweep(rows: Sequence[Mapping[str, float]], out: Path) -> str | None:
    """Share of padded tokens the planner saves against dynamic padding, against the short fraction."""
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for bs in sorted({int(r["batch_size"]) for r in rows}):
        pts = sorted((float(r["short_frac"]), float(r["saved_vs_arrival"])) for r in rows if r["batch_size"] == bs)
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], "o-", label=f"batch size {bs}")
    ax.set_xlabel("share of short texts (mixed workload)")
    ax.set_ylabel("padded tokens saved vs dynamic padding (%)")
    ax.legend()
    ax.set_title("Bucketed vs dynamic: padded tokens saved")
    return _save(fig, out, "short_frac_sweep")


def all_plots(summaries: Sequence[Summary], sweep_rows: Sequence[Mapping[str, float]], out: Path) -> list[str]:
    made = [
        batching_comparison(summaries, out),
        batch_size_comparison(summaries, out),
        queue_wait_comparison(summaries, out),
        padding_comparison(summaries, out),
        capacity_comparison(summaries, out),
        short_frac_sweep(sweep_rows, out),
    ]
    return [m for m in made if m]
