"""`--suite tune` on a server: calibrate the cost model, rank the candidates offline, measure what the budget
allows (`tune.explore`), re-measure the top two, write the winner's model-config and the commands that deploy it,
then build that archive and measure it again from the YAML."""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import yaml

from model_store import archives
from model_store import build as archive_build
from model_store.archives import ROOT
from tsctl import Endpoints, ServerError, read_properties
from tsctl.process import DEFAULT_PROPERTIES

from . import models, stats
from . import tune_search as tune
from .configuration import Configuration
from .run_plan import RunPlan
from .runner import WARMUP_S, Runner

TUNED_NAME = "minilm-tuned"
START_S = 25.0  # a configuration's registration and worker start, before its first measurement


def deploy_commands(yaml_shown: str, management_url: str, name: str = TUNED_NAME) -> tuple[str, str, str]:
    """The query that registers the tuned archive, and the two commands that build and register it."""
    query = urllib.parse.urlencode({"url": f"{name}.mar", "model_name": name, "synchronous": "true"})
    build = f".venv/bin/python -m model_store.build --config {yaml_shown} --name {name}"
    register = (
        f'curl -X POST -H "Authorization: Bearer $(.venv/bin/python -m tsctl token --api management)" '
        f'"{management_url}/models?{query}"'
    )
    return query, build, register


def run_tune(
    runner: Runner,
    plan: RunPlan,
    budget_min: float,
    record: Callable[[stats.Summary], None],
    t0: float,
    out: Path,
    min_cosine: float | None = None,
) -> tune.TuneResult:
    """Rank candidates offline, measure what fits the budget (delays around the best), recommend, re-measure.
    `min_cosine`: the fidelity floor that lets bfloat16 compete (where the CPU multiplies it natively)."""
    from bench.calibration import calibrated_cost
    from bucketing import precision

    space, settings = plan.tune or {}, runner.capacity_settings
    assert settings is not None
    base = plan.configs[0]
    engine = base.engine or archives.default_engine()
    print(f"\ntune: calibrating the cost model on {engine}, one thread ...")
    cost = calibrated_cost(str(models.model_dir(base.model)), engine)
    print(f"  {cost}")
    reduced, considered = tune.reduced_dtypes(min_cosine, precision.native_bf16(precision.cpu_info()))
    print(f"tune: {considered}")
    reduced_costs = {}
    for dtype in reduced:
        print(f"tune: calibrating the cost model on torch in {dtype}, one thread ...")
        reduced_costs[dtype] = calibrated_cost(str(models.model_dir(base.model)), "torch", dtype=dtype)
        print(f"  {reduced_costs[dtype]}")
    batch_sizes = space.get("batch_sizes", tune.BATCH_SIZES)
    schedules = space.get("schedules", ("batch",))
    ranked = tune.candidates(
        base,
        runner.bodies(base).tokens,
        cost,
        settings.target_ms,
        os.cpu_count() or 1,
        batch_sizes=batch_sizes,
        schedules=schedules,
        reduced_costs=reduced_costs,
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
            summary = runner.measure(config)
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
                measured.append(runner.measure(again))
                record(measured[-1])
            except ServerError as e:
                skipped.append((again, f"failed: {str(e)[:120]}"))
            budget_left -= time.monotonic() - started
    why = tune.dtype_choice(measured, min_cosine, considered)
    return recommend(runner, measured, skipped, ranked, record, t0, out, budget_min * 60, min_cosine, why)


def recommend(
    runner: Runner,
    measured: list[stats.Summary],
    skipped: list[tuple[Configuration, str]],
    ranked: list[tune.Candidate],
    record: Callable[[stats.Summary], None],
    t0: float,
    out: Path,
    budget_s: float,
    min_cosine: float | None = None,
    dtype_why: str = "",
) -> tune.TuneResult:
    """Write the winner's model-config YAML and the commands that deploy it; measure it again from that YAML."""
    settings = runner.capacity_settings
    assert settings is not None
    ranking = tune.rank(measured, min_cosine)
    if not ranking:
        raise SystemExit("tune: no measured configuration is eligible (see above)")
    winner = ranking[0]
    cfg = tune.model_config(winner.config, archives.model_config(winner.config.strategy), min_cosine)
    yaml_path = out / "tuned-model-config.yaml"
    shown = yaml_path.relative_to(ROOT) if yaml_path.is_relative_to(ROOT) else yaml_path
    cap = winner.capacity.rate if winner.capacity else 0.0
    # where the user applies it: the server given by URL, else the one `make serve` runs
    mgmt = (
        runner.client.endpoints.management
        if not runner.server
        else Endpoints.from_properties(read_properties(DEFAULT_PROPERTIES)).management
    )
    query, *commands = deploy_commands(str(shown), mgmt)
    comment = (
        f"# Tuned by `bench/compare.py --suite tune` on {winner.config.workload_label}: "
        f"{tune.fmt_rate(cap)} at p99 <= {settings.target_ms:g} ms on this machine.\n"
        + (f"# {dtype_why}\n" if dtype_why else "")
        + "# Deploy it (from the repository, with `make serve` running):\n"
        + "".join(f"#   {c}\n" for c in commands)
    )
    yaml_path.write_text(comment + yaml.safe_dump(cfg, sort_keys=False))
    result = tune.TuneResult(
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
    if not runner.server:
        return replace(result, elapsed_s=time.monotonic() - t0)
    print(f"\nrecommended: {winner.config.name}; building {TUNED_NAME}.mar from {yaml_path.name} ...")
    store = Path(runner.server.properties["model_store"])
    try:
        archive_build.from_config(yaml_path, TUNED_NAME, store)
    except archive_build.BuildError as e:
        raise SystemExit(f"building {TUNED_NAME}.mar from {yaml_path} failed: {e}") from None
    runner.client.unregister(TUNED_NAME)
    reply = runner.client.call("management", "POST", f"/models?{query}", timeout=300)  # as the curl line does
    if reply.status != 200:
        raise SystemExit(f"registering {TUNED_NAME} from its YAML failed: HTTP {reply.status} {reply.text[:200]}")
    try:
        described = runner.client.call("management", "GET", f"/models/{TUNED_NAME}").json()[0]
        config = replace(winner.config, label="from YAML")
        print(f"\n{config.name} on {config.workload_label}")
        remeasured = runner.measure_target(config, runner.torchserve_target(config, TUNED_NAME), None)
    finally:
        runner.client.unregister(TUNED_NAME)
    record(remeasured)
    applied = tuple(tune.describe_mismatches(described, cfg))
    return replace(result, remeasured=remeasured, applied=applied, elapsed_s=time.monotonic() - t0)
