"""`matrix`: every configuration of the plan, each resolved into a job before the first is measured, each on its
own model; then, with `--peer`, the peer on each distinct load of the plan."""

from __future__ import annotations

import sys

from bench import peers
from bench.harness.options import Options
from bench.harness.run_plan import RunPlan
from bench.inputs import models
from bench.kinds.context import RunContext

NAME = "matrix"
TITLE = "Batching comparison"
WORKLOADS: tuple[str, ...] = ()  # it measures the bench's workloads, none of its own
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
    """Start the peer once per setup (batch size, dtype, layout) and model, spot-check its answers against our float32
    reference, measure it on each configuration's load."""
    kind = peers.PEERS[name]
    python = peers.venv(kind, progress=ctx.progress)
    configs = peers.peer_configs(ctx.plan.configs, name, ctx.options.peer_dtype_list)
    jobs = [ctx.resolver.job(c, check=False) for c in configs]
    for setup, model in dict.fromkeys((peers.PeerSetup.of(j.config), j.config.model) for j in jobs):
        group = [j for j in jobs if (peers.PeerSetup.of(j.config), j.config.model) == (setup, model)]
        folder = models.model_dir(model)
        print(f"\nstarting {kind.name} (batch size {setup.batch_size}, {setup.dtype}) ...")
        with peers.PeerServer(kind, python, folder, setup, ctx.out / "logs") as server:
            server.fidelity(group[0])  # its answers checked before any load
            for job in group:
                print(f"\n{job.config.name} on {job.config.workload_label}")
                ctx.record(ctx.measurer.measure(job, server))
