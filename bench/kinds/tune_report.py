"""`tune`'s report section: the recommendation, and what was estimated, measured, pruned and skipped, and each
engine and dtype as calibrated."""

from __future__ import annotations

from bench.harness import report, stats
from bench.inputs.configuration import Configuration
from bench.kinds import tune_choice as choice
from bench.kinds import tune_search as tune


def _settings(s: stats.Summary) -> str:
    c = s.config
    layout = report.layout(c)
    engine = f", engine {c.engine}, dtype {c.dtype or 'float32'}" if c.engine else ""
    return (
        f"strategy `{c.strategy}`, batch_size {c.batch_size}, max_batch_delay {c.max_batch_delay} ms, {layout}{engine}"
    )


def _capacity(s: stats.Summary | None) -> str:
    if s is None or s.capacity is None:
        return "n/a"
    if s.capacity.best is None:
        return f"none within {s.capacity.target_ms:g} ms"
    return f"{s.capacity.rate:.1f} req/s (p99 {s.capacity.best.p99_ms:.0f} ms there)"


def tune_section(t: choice.TuneResult) -> str:
    """The tune suite's recommendation: winner, runner-up, both measurements, the YAML, how to apply it,
    and what was estimated, measured, pruned and skipped."""
    ranking = t.ranking
    winner = ranking[0]
    runner = ranking[1] if len(ranking) > 1 else None
    parts = [
        f"## Recommendation for p99 <= {t.target_ms:g} ms",
        "",
        f"- **Use**: {_settings(winner)}.",
        f"- **Capacity** (search): {_capacity(winner)}; closed loop {winner.rps:.1f} req/s, p99 "
        f"{report.num(winner.p99_ms)} ms.",
    ]
    if t.remeasured is not None:
        r = t.remeasured
        applied = "TorchServe applied every setting of the YAML" if not t.applied else "; ".join(t.applied)
        parts.append(
            f"- **Measured again from `{t.yaml_name}`** (built into an archive, registered through the management "
            f"API as the curl line below does; {applied}): capacity {_capacity(r)}; closed loop {r.rps:.1f} req/s, "
            f"p99 {report.num(r.p99_ms)} ms."
        )
    if runner is not None:
        parts.append(
            f"- **Runner-up**: {_settings(runner)}: capacity {_capacity(runner)}; closed loop {runner.rps:.1f} req/s."
        )
        ceiling = runner.capacity.ceiling if runner.capacity else None
        sure = (
            f"the winner's capacity is at or above the runner-up's interval (it missed the target at "
            f"{ceiling:g} req/s): the ranking holds"
            if tune.separated(winner, runner)
            else "the winner's capacity lies within the runner-up's interval (below the lowest rate it missed at"
            + (f", {ceiling:g} req/s" if ceiling else "")
            + "): a tie at the search's resolution, broken by closed-loop throughput"
        )
        parts.append(f"- **How sure**: each capacity is its lower measurement when measured twice; {sure}.")
    parts.append(
        f"- **Time**: {t.elapsed_s / 60:.1f} of {t.budget_s / 60:g} budgeted minutes; {len(t.measured)} "
        f"configurations measured, {len(t.skipped)} skipped to fit, "
        f"{sum(1 for c in t.candidates if c.pruned)} pruned by the offline estimates."
    )
    parts += ["", f"`{t.yaml_name}` (written next to this report):", "", "```yaml", t.yaml_text.rstrip(), "```"]
    parts += ["", "Deploy it (from the repository, with `make serve` running):", "", "```sh", *t.commands, "```"]
    measured = {s.config: s for s in t.measured}
    skipped = dict(t.skipped)
    rows = []
    for c in t.candidates:
        s = measured.get(c.config)
        status = c.pruned or skipped.get(c.config, "") or ("measured" if s else "not reached")
        rows.append(
            [
                c.config.engine or "",
                c.config.dtype or "float32",
                c.config.strategy,
                c.config.batch_size,
                f"{c.config.workers}x{c.config.threads}",
                f"{c.est_rps:.0f}",
                f"{c.est_floor_ms:.0f}",
                f"{s.rps:.1f}" if s else "",
                _capacity(s) if s else "",
                status,
            ]
        )
    extra = [s for s in t.measured if s.config.max_batch_delay != t.candidates[0].config.max_batch_delay]
    extra_skipped = [(c, why) for c, why in t.skipped if c.max_batch_delay != t.candidates[0].config.max_batch_delay]
    parts += engines_section(t)
    parts += [
        "",
        "### Candidates",
        "",
        "Offline estimates from the planner's cost model of each candidate's engine and dtype, calibrated on this "
        "machine at the start (one thread), over the token lengths sent: `est req/s` at saturation, `floor` a lower "
        "bound on p99 (a request's own pass, p99 over the texts, plus the batch delay); they rank and prune (against "
        "the best estimate of the same dtype), measurement decides. Kept candidates are measured best estimate first "
        "(the best of each engine and dtype leads, then the best of each strategy), then the best measured one at "
        "other batch delays.",
        "",
        report.table(
            [
                "engine",
                "dtype",
                "strategy",
                "batch size",
                "workers x threads",
                "est req/s",
                "floor ms",
                "req/s",
                "capacity",
                "status",
            ],
            rows,
        ),
    ]
    if extra or extra_skipped:
        parts += ["", "Batch delays tried on the best configuration:", ""]
        parts += [f"- {s.config.name}: capacity {_capacity(s)}; closed loop {s.rps:.1f} req/s" for s in extra]
        parts += [f"- {c.name}: skipped, {why}" for c, why in extra_skipped]
    return "\n".join(parts) + "\n"


def _per_core(s: stats.Summary | None) -> str:
    """Closed-loop req/s a core of CPU the server used (what a shared machine's share of cores does not move)."""
    return f"{s.rps / s.server_cpu_cores:.1f}" if s and s.server_cpu_cores else ""


def _short(c: Configuration) -> str:
    return f"{c.strategy} bs{c.batch_size} d{c.max_batch_delay} {c.workers}x{c.threads}"


def engines_section(t: choice.TuneResult) -> list[str]:
    """Each (engine, dtype) as calibrated: its fixed cost a pass and cost a token, what the planner makes of the base
    load with it (passes a delivered batch, texts a pass, the estimate), and its best measured configuration."""
    if not t.engine_costs:
        return []
    best = choice.best_per_engine(t.measured)
    base = t.base
    load = f"`{base.strategy}` at batch size {base.batch_size}, {base.workers}x{base.threads}" if base else "its base"
    rows = []
    for e in t.engine_costs:
        s = best.get((e.engine, e.dtype))
        measured = _short(s.config) if s else ""
        if e.cost is None:
            rows.append([e.engine, e.dtype, *[""] * 9, f"not considered: {e.refused}", ""])
            continue
        rows.append(
            [
                e.engine,
                e.dtype,
                f"{e.cost.overhead_us / 1000:.2f}",
                f"{e.cost.per_token_us:.0f}",
                f"{e.cost.per_token_sq_us:.3f}",
                f"{e.fixed_tokens:.1f}",
                f"{e.passes:.2f}",
                f"{e.rows:.1f}",
                f"{e.est_rps:.0f}",
                measured,
                _capacity(s) if s else "",
                f"{s.rps:.1f}" if s else "not measured",
                _per_core(s),
            ]
        )
    return [
        "",
        "### Engines and dtypes",
        "",
        "Each engine and dtype opened as a worker opens it and calibrated in process at the start (one thread; the "
        "handler's calibration shapes, the engines in turn, each shape's fastest of the rounds): the fixed cost of a "
        "pass and the cost a token (and a token x length, attention's share). The planner weighs a pass's fixed "
        "cost against the padding a split saves, so what sets its split is the fixed cost in tokens' worth (fixed "
        "cost / cost a token): the lower, the more and tighter the sub-batches. `passes a batch` and `texts a pass` "
        f"are its plan for the load sent ({load}), `est req/s` that configuration estimated on it; then each "
        "engine and dtype's best measured configuration, and its closed-loop req/s a core of CPU the server used "
        "(on a shared machine the cores it got vary: compare these).",
        "",
        report.table(
            [
                "engine",
                "dtype",
                "fixed ms a pass",
                "us a token",
                "us a token x length",
                "fixed cost in tokens",
                "passes a batch",
                "texts a pass",
                "est req/s",
                "best measured",
                "capacity",
                "closed loop req/s",
                "req/s a server core",
            ],
            rows,
        ),
    ]
