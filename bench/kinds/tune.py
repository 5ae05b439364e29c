"""`tune` (`--suite tune`) on a server: calibrate the cost model, rank the candidates offline, measure what the
budget allows (`tune_search.explore`), re-measure the top two, write the winner's model-config and the commands that
deploy it, then build that archive and measure it again from the YAML; its report section is the recommendation.
Every engine of the registry that opens here is considered (or those `--engines` names), in float32, and in
bfloat16 where it runs it natively, each with its own calibrated cost model. Its own flag: --min-cosine (the
fidelity floor that lets bfloat16 compete)."""

from __future__ import annotations

import os
import time
import urllib.parse
from dataclasses import dataclass, replace

import yaml

from bench.harness import stats
from bench.harness.measure import WARMUP_S
from bench.harness.options import Options, flag
from bench.harness.run_plan import RunPlan
from bench.harness.targets import TorchServeModel, TorchServeSite
from bench.inputs import models
from bench.inputs.configuration import TORCHSERVE, Configuration
from bench.inputs.workloads import NOT_EMBEDDINGS
from bench.kinds import tune_choice as choice
from bench.kinds import tune_search as tune
from bench.kinds.context import RunContext
from bench.kinds.tune_report import tune_section
from model_store import archives
from model_store import build as archive_build
from model_store.archives import ROOT
from tsctl import ServerError

NAME = "tune"
TITLE = "Tuning"
WORKLOADS: tuple[str, ...] = ()  # it measures the bench's workloads, none of its own
TUNED_NAME = "minilm-tuned"
START_S = 25.0  # a configuration's registration and worker start, before its first measurement


@dataclass(frozen=True)
class TuneFlags:
    """tune's own flags (`options.flag` declarations, as the bench's in `options.Options`)."""

    min_cosine: float | None = flag(
        None,
        "--suite tune: also consider bfloat16 (where the CPU multiplies it natively), eligible only when its "
        "answers' cosine min against float32 on the run's texts reaches this floor (e.g. 0.999)",
    )


FLAGS = TuneFlags


def deploy_commands(yaml_shown: str, management_url: str, name: str = TUNED_NAME) -> tuple[str, str, str]:
    """The query that registers the tuned archive, and the two commands that build and register it."""
    query = urllib.parse.urlencode({"url": f"{name}.mar", "model_name": name, "synchronous": "true"})
    build = f".venv/bin/python -m model_store.build --config {yaml_shown} --name {name}"
    register = (
        f'curl -X POST -H "Authorization: Bearer $(.venv/bin/python -m tsctl token --api management)" '
        f'"{management_url}/models?{query}"'
    )
    return query, build, register


def check(options: Options, plan: RunPlan) -> None:
    """A p99 target is needed; a peer, a workload whose answers are not embeddings (rerank, sparse), a host other
    than TorchServe and a floor outside (0, 1] are refused."""
    min_cosine = options.of(TuneFlags).min_cosine
    if not options.p99_ms:
        raise SystemExit("--suite tune needs --p99-ms: the p99 latency target (ms) to tune for")
    if options.peer:
        raise SystemExit("--peer: not with --suite tune (measure the peer next to the tuned settings in a second run)")
    for c in plan.configs:
        if c.workload in NOT_EMBEDDINGS:
            raise SystemExit(
                f"--workload {c.workload}: not with --peer, --suite tune or --bound (they measure embeddings)"
            )
        if c.host != TORCHSERVE:
            raise SystemExit(f"--hosts {c.host}: not with --suite tune (it deploys its winner on TorchServe)")
    if min_cosine is not None and not 0 < min_cosine <= 1:
        raise SystemExit(_floor_refused(min_cosine))


def refuse(options: Options) -> None:
    """`--min-cosine` is tune's floor: refused where another kind runs."""
    min_cosine = options.of(TuneFlags).min_cosine
    if min_cosine is not None:
        raise SystemExit(_floor_refused(min_cosine))


def _floor_refused(min_cosine: float) -> str:
    return f"--min-cosine: got {min_cosine:g}; allowed: with --suite tune, a floor in (0, 1]"


def run(ctx: RunContext) -> list[str]:
    """Measure, recommend, re-measure; the recommendation is its report section (after the comparisons)."""
    return [tune_section(run_tune(ctx))]


def measure_config(ctx: RunContext, config: Configuration) -> stats.Summary:
    """One candidate, resolved into its job and measured on its own model."""
    job = ctx.resolver.job(config)
    with ctx.target(job) as target:
        return ctx.measurer.measure(job, target)


def run_tune(ctx: RunContext) -> choice.TuneResult:
    """Calibrate each (engine, dtype), rank candidates offline with their own cost model, measure what fits the
    budget (delays around the best), recommend, re-measure. --min-cosine (`TuneFlags`): the fidelity floor that lets
    bfloat16 compete (where the CPU multiplies it natively, on the engines that run it)."""
    from bench.inputs.engines import cpu_dtypes, engine_names
    from bench.kinds.tune_calibration import calibrated_costs
    from bucketing.engines import precision
    from bucketing.planning.planner import CostModel

    plan, budget_min, t0, record = ctx.plan, ctx.options.budget_min, ctx.t0, ctx.record
    min_cosine = ctx.options.of(TuneFlags).min_cosine
    space, settings = plan.options, ctx.settings
    assert settings is not None
    base = plan.configs[0]
    cpu = precision.cpu_info()
    reduced, considered = choice.reduced_dtypes(min_cosine, precision.native_bf16(cpu))
    print(f"tune: {considered}")
    engines = tune_engines(ctx.options, engine_names())
    pairs = tune.engine_dtypes({e: cpu_dtypes(e, cpu) for e in engines}, reduced)
    shown = ", ".join(f"{e} {d}" for e, d in pairs)
    print(f"tune: calibrating the cost model of each engine and dtype ({shown}), one thread ...")
    calibrated = calibrated_costs(str(models.model_dir(base.model)), pairs)
    lengths = ctx.resolver.load(base).tokens
    engine_costs = choice.engine_costs(base, lengths, calibrated)
    for e in engine_costs:
        print(f"  {e.engine} {e.dtype}: " + (f"not considered: {e.refused}" if e.cost is None else _calibration(e)))
    costs: dict[tune.Pair, CostModel] = {(e.engine, e.dtype): e.cost for e in engine_costs if e.cost is not None}
    if not costs:
        raise SystemExit("tune: no engine opened here (see above)")
    batch_sizes = space.get("batch_sizes", tune.BATCH_SIZES)
    schedules = space.get("schedules", ("batch",))
    ranked = tune.candidates(
        base,
        lengths,
        costs,
        settings.target_ms,
        os.cpu_count() or 1,
        batch_sizes=batch_sizes,
        schedules=schedules,
    )
    kept = [c for c in ranked if not c.pruned]
    print(
        f"\ntune: {len(ranked)} candidates, {len(kept)} kept by the offline estimates, "
        f"{len(ranked) - len(kept)} pruned; budget {budget_min:g} min"
    )
    measured_count = 0

    def measure(config: Configuration) -> stats.Summary:
        nonlocal measured_count
        used = (time.monotonic() - t0) / 60
        print(f"\n[tune {measured_count + 1}] {config.name} on {config.workload_label} ({used:.1f} min used)")
        try:
            summary = measure_config(ctx, config)
        except ServerError as e:
            raise tune.MeasureFailed(str(e)) from e
        measured_count += 1
        record(summary)
        return summary

    default_cost = START_S + WARMUP_S + base.duration + settings.max_steps * settings.step_s * 1.3
    measured, skipped = tune.explore(
        ranked,
        measure,
        tune.Budget(budget_min * 60),
        default_cost,
        lambda: time.monotonic() - t0,
        space.get("delays", tune.DELAYS),
        min_cosine,
    )
    if not measured:
        raise SystemExit("tune: nothing was measured (see above)")
    budget_left = budget_min * 60 - (time.monotonic() - t0)
    for top in tune.rank(measured, min_cosine)[
        :2
    ]:  # the top two again: capacity is the noisiest figure, rank on the lower
        if len(measured) > 1 and budget_left > default_cost + tune.RESERVE_S:
            started = time.monotonic()
            again = replace(top.config, label="again")
            print(f"\n[tune: the top two again] {again.name} on {again.workload_label}")
            try:
                measured.append(measure_config(ctx, again))
                record(measured[-1])
            except ServerError as e:
                skipped.append((again, f"failed: {str(e)[:120]}"))
            budget_left -= time.monotonic() - started
    why = choice.dtype_choice(measured, min_cosine, considered)
    engine_why = choice.engine_choice(measured, min_cosine)
    result = recommend(ctx, measured, skipped, ranked, "\n# ".join(w for w in (engine_why, why) if w))
    return replace(result, engine_costs=tuple(engine_costs), base=base)


def tune_engines(options: Options, registry: tuple[str, ...]) -> tuple[str, ...]:
    """The engines the suite considers: those `--engines` names (the plan's engine axis), else every engine in the
    registry (each then calibrated where it opens here; one that does not is reported and left out)."""
    given = [e.strip() for e in (options.engines or "").split(",") if e.strip()]
    return tuple(dict.fromkeys(given)) if given else registry


def _calibration(e: choice.EngineCost) -> str:
    assert e.cost is not None
    return (
        f"fixed {e.cost.overhead_us / 1000:.2f} ms a pass, {e.cost.per_token_us:.0f} us a token "
        f"(+ {e.cost.per_token_sq_us:.3f} us x length); {e.passes:.2f} passes of {e.rows:.1f} texts a batch, "
        f"estimated {e.est_rps:.0f} req/s for the base load"
    )


def recommend(
    ctx: RunContext,
    measured: list[stats.Summary],
    skipped: list[tuple[Configuration, str]],
    ranked: list[tune.Candidate],
    why: str = "",
) -> choice.TuneResult:
    """Write the winner's model-config YAML and the commands that deploy it; measure it again from that YAML."""
    settings, site, t0, out = ctx.settings, ctx.site, ctx.t0, ctx.out
    min_cosine = ctx.options.of(TuneFlags).min_cosine
    assert settings is not None and site is not None
    budget_s = ctx.options.budget_min * 60
    ranking = tune.rank(measured, min_cosine)
    if not ranking:
        raise SystemExit("tune: no measured configuration is eligible (see above)")
    winner = ranking[0]
    cfg = choice.model_config(winner.config, archives.model_config(winner.config.strategy), min_cosine)
    yaml_path = out / "tuned-model-config.yaml"
    shown = yaml_path.relative_to(ROOT) if yaml_path.is_relative_to(ROOT) else yaml_path
    cap = winner.capacity.rate if winner.capacity else 0.0
    query, *commands = deploy_commands(str(shown), site.user_management_url)
    comment = (
        f"# Tuned by `bench/compare.py --suite tune` on {winner.config.workload_label}: "
        f"{choice.fmt_rate(cap)} at p99 <= {settings.target_ms:g} ms on this machine.\n"
        + (f"# {why}\n" if why else "")
        + "# Deploy it (from the repository, with `make serve` running):\n"
        + "".join(f"#   {c}\n" for c in commands)
    )
    yaml_path.write_text(comment + yaml.safe_dump(cfg, sort_keys=False))
    result = choice.TuneResult(
        settings.target_ms,
        budget_s,
        0.0,
        tuple(ranked),
        tuple(measured),
        tuple(skipped),
        yaml_path.name,
        yaml_path.read_text(),
        tuple(commands),
        min_cosine=min_cosine,
    )
    store = site.store
    if store is None:  # a server given by URL: the user deploys it there
        return replace(result, elapsed_s=time.monotonic() - t0)
    print(f"\nrecommended: {winner.config.name}; building {TUNED_NAME}.mar from {yaml_path.name} ...")
    try:
        archive_build.from_config(yaml_path, TUNED_NAME, store)
    except archive_build.BuildError as e:
        raise SystemExit(f"building {TUNED_NAME}.mar from {yaml_path} failed: {e}") from None
    remeasured, described = remeasure_from_yaml(ctx, site, winner.config, query)
    ctx.record(remeasured)
    applied = tuple(choice.describe_mismatches(described, cfg))
    return replace(result, remeasured=remeasured, applied=applied, elapsed_s=time.monotonic() - t0)


def remeasure_from_yaml(
    ctx: RunContext, site: TorchServeSite, winner: Configuration, query: str
) -> tuple[stats.Summary, dict[str, object]]:
    """Register the tuned archive as the curl line does, measure it (its describe answer beside), unregister it."""
    site.client.unregister(TUNED_NAME)
    reply = site.client.call("management", "POST", f"/models?{query}", timeout=300)  # as the curl line does
    if reply.status != 200:
        raise SystemExit(f"registering {TUNED_NAME} from its YAML failed: HTTP {reply.status} {reply.text[:200]}")
    config = replace(winner, label="from YAML")
    with TorchServeModel(site, config, TUNED_NAME, registered=True) as target:
        described: dict[str, object] = site.client.call("management", "GET", f"/models/{TUNED_NAME}").json()[0]
        print(f"\n{config.name} on {config.workload_label}")
        job = ctx.resolver.job(config, check=False)
        return ctx.measurer.measure(job, target), described
