"""A run's results: results.csv and results.json after every configuration, offline.csv, and report.md from one
`ReportInputs` (the run header, the summaries, and what the report shows beside them)."""

from __future__ import annotations

import csv
import datetime as dt
import itertools
import json
import os
import platform
import shlex
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import offline, plots, report, stats
from bench.harness.capacity import CapacitySettings
from bench.harness.run_plan import RunPlan
from bench.inputs.configuration import TORCHSERVE
from bucketing.engines.precision import cpu_info, cpu_name
from bucketing.planning.planner import CostModel
from model_store.archives import SERVED

LENGTH_EDGES = (0, 8, 16, 32, 64, 128, 192, SERVED.max_length)  # the report's token-length histogram
DEFAULT_SWEEP: dict[str, list[Any]] = {"short_fracs": [0.1, 0.3, 0.5, 0.7, 0.9], "batch_sizes": [8, 16, 32]}


class ResultsWriter:
    """results.csv and results.json, rewritten whole (atomically) after every configuration."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.rows: list[dict[str, object]] = []

    def add(self, summary: stats.Summary) -> None:
        self.rows.append(summary.as_json())
        self._write("results.json", json.dumps(self.rows, indent=1))
        with tempfile.NamedTemporaryFile("w", dir=self.folder, delete=False, newline="") as f:
            writer = csv.DictWriter(f, fieldnames=stats.CSV_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(self.rows)
        os.chmod(f.name, 0o644)
        os.replace(f.name, self.folder / "results.csv")

    def _write(self, name: str, text: str) -> None:
        tmp = self.folder / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.folder / name)


def run_header(
    argv: Sequence[str] | None,
    plan: RunPlan,
    texts: str = "",
    settings: CapacitySettings | None = None,
) -> dict[str, str]:
    """What the report says about the run: date, machine, the command that reproduces it, the suite, the hosts
    (where other than TorchServe alone), the user's texts and the p99 target."""
    command = "python bench/compare.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    header = {
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": f"{cpu_name(cpu_info())}; {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "command": f"`{command.strip()}`",
        "suite": f"{plan.name}: {plan.description}".strip(),
    }
    hosts = list(dict.fromkeys(c.host for c in plan.configs))
    if hosts != [TORCHSERVE]:  # said where another host ran (`--hosts`)
        header["hosts"] = ", ".join(hosts) + " (each configuration on each, in turn)" * (len(hosts) > 1)
    if texts:
        header["texts"] = texts
    if settings:
        header["p99 target"] = settings.describe()
    return header


def length_histogram(tokens: Sequence[int], edges: Sequence[int] = LENGTH_EDGES) -> list[tuple[int, int, int]]:
    return [(lo + 1, hi, sum(lo < t <= hi for t in tokens)) for lo, hi in itertools.pairwise(edges)]


def run_offline(plan: RunPlan, out: Path) -> list[dict[str, object]]:
    """The offline padded-token sweep (the plan's, or the default one) into offline.csv."""
    sweep = plan.sweep or DEFAULT_SWEEP
    rows = offline.sweep(sweep["short_fracs"], sweep["batch_sizes"], CostModel())
    with open(out / "offline.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return rows


@dataclass
class ReportInputs:
    """Everything report.md shows, gathered as the run goes."""

    title: str
    header: dict[str, str]
    summaries: list[stats.Summary] = field(default_factory=list)
    sent: Mapping[str, Sequence[int]] = field(default_factory=dict)  # token counts sent, per workload
    offline_rows: list[dict[str, Any]] = field(default_factory=list)
    bounds: list[dict[str, Any]] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)  # sections after the comparisons (the tune recommendation)

    def write(self, out: Path) -> list[stats.Comparison]:
        """Plots and report.md into `out`; the comparisons it shows (within each host, then across hosts)."""
        comparisons = stats.comparisons(self.summaries)
        host_pairs = stats.host_comparisons(self.summaries)
        made = plots.all_plots(self.summaries, self.offline_rows, out)
        histograms = {label: length_histogram(tokens) for label, tokens in self.sent.items()}
        md = report.render_markdown(
            self.title,
            self.header,
            self.summaries,
            comparisons,
            histograms,
            self.offline_rows,
            self.bounds,
            made,
            self.extra,
            host_pairs,
        )
        (out / "report.md").write_text(md)
        return comparisons + host_pairs
