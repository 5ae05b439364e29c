"""Run kinds: what a run does with its plan. A new kind is a module here (`context.RunKind`: NAME, TITLE, the
WORKLOADS it alone measures, its FLAGS declared with `options.flag`, check and refuse of its flags, run, which returns
its report sections), a line in RUN_KINDS, and its suite in suites.yaml (named as the kind, `kind: NAME`; a suite
that names no kind is `matrix`): no other file. The command line (`bench/compare.py`) reads RUN_KINDS for the flags,
the checks, a workload's own kind and the run."""

from __future__ import annotations

from bench.kinds import bulk, long, matrix, tune
from bench.kinds.context import RunContext, RunKind

RUN_KINDS: dict[str, RunKind] = {
    matrix.NAME: matrix,  # every configuration of the plan (and a peer on the same loads)
    tune.NAME: tune,  # candidates ranked offline, measured under a budget, the winner deployed from its YAML
    bulk.NAME: bulk,  # one bulk request against the same texts split, and small requests' p99 during it
    long.NAME: long,  # long documents truncated, chunked and late-chunked on a long-context model
}

__all__ = ["RUN_KINDS", "RunContext", "RunKind"]
