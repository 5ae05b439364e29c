"""`matrix`: every configuration of the plan, each resolved into a job before the first is measured, each on its
own model; then, with `--peer`, the peer on each distinct load of the plan."""

from __future__ import annotations

import sys

from .. import models, peers
from ..options import Options
from ..run_plan import RunPlan, peer_configs
from .context import RunContext

NAME = "matrix"
TITLE = "Batching comparison"
FLAGS = None  # the bench's flags are its own (--peer, --bound)


def check(options: Options, plan: RunPlan) -> None:
    """Every flag of the bench is honoured; another kind's own are refused by that kind (`refuse`)."""


def refuse(options: Options) -> None:
    """No flags of its own to refuse."""


def run(ctx: RunContext) -> list[str]:
    """Every configuration, then the peer; no report section of its own (a skipped peer is said in the header)."""
    jobs = [ctx.resolver.job(c, exact=ctx.plan.bound) for c in ctx.plan.configs]
    for i, job in enumerate(jobs, 1):
        print(f"\n[{i}/{len(jobs)}] {job.config.name} on {job.config.workload_label}")
        with ctx.target(job) as target:
            ctx.record(ctx.measurer.measure(job, target))
    peer = ctx.options.peer
    if peer:
        try:
            measure_peer(ctx, peer)
        except peers.PeerUnavailable as e:
            print(f"\npeer skipped: {e}", file=sys.stderr)
            ctx.inputs.header["peer"] = f"{peer} skipped: {e}"
    return []


def measure_peer(ctx: RunContext, name: str) -> None:
    """Start the peer once per batch size, spot-check its answers, measure it on each configuration's load."""
    spec = peers.PEERS[name]
    python = peers.venv(spec, progress=ctx.progress)
    jobs = [ctx.resolver.job(c, check=False) for c in peer_configs(ctx.plan.configs, name)]
    for batch_size in dict.fromkeys(j.config.batch_size for j in jobs):
        group = [j for j in jobs if j.config.batch_size == batch_size]
        folder = models.model_dir(group[0].config.model)
        print(f"\nstarting {spec.name} (batch size {batch_size}) ...")
        with peers.PeerServer(spec, python, folder, batch_size, ctx.out / "logs") as server:
            server.fidelity(group[0])  # its answers checked before any load
            for job in group:
                print(f"\n{job.config.name} on {job.config.workload_label}")
                ctx.record(ctx.measurer.measure(job, server))
