"""The command's flags, parsed once into a typed, frozen `Options` (`python bench/compare.py --help`).

One declaration per flag: a dataclass field carries its default, its type (the annotation: bool, str, int, float or
Path, each `| None` or not), its choices and its help; the parser is built from the declarations and the parsed
values read back into them, so a flag is declared nowhere else. The bench's own flags are the fields of `Options`;
each run kind declares its own in its module (its `FLAGS` dataclass, `kinds.RUN_KINDS`), listed in --help where
`Options.kinds` stands and read back with `options.of(ThatKindsFlags)`. `plan_from_args` turns the flags into the
run plan.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bench import peers
from bench.harness import capacity
from bench.harness.run_plan import (
    AXES,
    SUITES,
    RunPlan,
    csv_list,
    engine_runs_dtype,
    expand,
    load_suite,
    one_worker_if_continuous,
    served,
    suites,
)
from bench.inputs import traffic
from bench.inputs.engines import engine_names
from bench.inputs.workloads import BENCH_WORKLOADS, DOCS_PER_REQUEST
from model_store.archives import ROOT

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Flags = TypeVar("_Flags", bound="DataclassInstance")
CASTS: dict[str, Callable[[str], object]] = {"str": str, "int": int, "float": float, "Path": Path}


def flag(default: Any, help: str | None = None, *, choices: Sequence[str] | None = None) -> Any:
    """A flag: its default, its help (None: listed bare, its default unshown) and the values it allows."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class Options:
    """The bench's flags, as parsed (`--strategies` and the other comma lists as given: `plan_from_args` reads
    them); `kinds` holds each run kind's own flags."""

    suite: str | None = flag(None, f"named suite from {SUITES.name} (default: default)")
    list_suites: bool = flag(False, "print the suites and exit")
    strategies: str | None = flag(None, "comma list of bucketed,dynamic,static (makes a matrix with the flags below)")
    batch_sizes: str | None = flag(None, "comma list, e.g. 1,4,8,16,32")
    delays: str | None = flag(None, "comma list of max_batch_delay in ms")
    rates: str | None = flag(None, "comma list of open-loop rates (req/s); implies --mode open")
    short_fracs: str | None = flag(None, "comma list for the mixed workload")
    workload: str | None = flag(None, choices=BENCH_WORKLOADS)
    docs_per_request: int = flag(
        DOCS_PER_REQUEST, "--workload rerank: documents per request, each scored with the query"
    )
    texts: Path | None = flag(None, "your own traffic: .txt (a text a line), .jsonl or .csv")
    text_field: str = flag("text", "the JSON field or CSV column holding the text")
    sample: int | None = flag(None, "send N texts drawn from --texts (seeded by --seed)")
    p99_ms: float | None = flag(None, "also find each configuration's capacity: req/s with p99 <= this")
    capacity_steps: int | None = flag(
        None, f"open-loop steps per capacity search, at most (default {capacity.MAX_STEPS})"
    )
    step_s: float | None = flag(None, f"seconds per capacity step, at least (default {capacity.STEP_S:g})")
    # Read by tune alone, but checked with the capacity settings whatever the kind (a matrix run with --p99-ms
    # refuses --budget-min 0): the bench's.
    budget_min: float = flag(15.0, "--suite tune: minutes for the whole suite")
    # Each run kind's own flags (its FLAGS, in RUN_KINDS order), listed here in --help.
    kinds: tuple[DataclassInstance, ...] = field(default=(), metadata={"kinds": True})
    peer: str | None = flag(None, "also measure this server on the same texts and load", choices=sorted(peers.PEERS))
    peer_dtypes: str | None = flag(
        None,
        f"comma list of {','.join(peers.PEER_DTYPES)}: the peer's precision, each its own rows (default: the dtypes "
        "of our configurations, --dtypes, so each peer row has ours of the same precision beside it); bfloat16 "
        "where the CPU multiplies it natively",
    )
    mode: str | None = flag(None, choices=("closed", "open"))
    duration: float | None = flag(None, "seconds of measured load per configuration")
    concurrency: int | None = flag(None, "closed-loop clients")
    workers: int | None = flag(None)
    threads: int | None = flag(None, "threads per worker")
    engines: str | None = flag(None, f"comma list of {','.join(engine_names())} (a configuration axis)")
    schedules: str | None = flag(None, "comma list of batch,continuous (handler.schedule; a configuration axis)")
    dtypes: str | None = flag(
        None,
        "comma list of float32,bfloat16 (handler.dtype; a configuration axis; bfloat16 runs on torch or openvino, "
        "where the CPU multiplies it natively)",
    )
    model_dir: Path | None = flag(None, "bench your own encoder folder (embedding) instead of MiniLM")
    bound: bool = flag(False, "also measure exact-length grouping in process (a reference rate, not a bound)")
    offline: bool = flag(False, "only the offline padded-token sweep (no server)")
    seed: int = flag(0)
    out: Path = flag(ROOT / "bench" / "results", "results parent folder")
    inference_url: str | None = flag(None, "use a running TorchServe (with the two URLs below)")
    management_url: str | None = flag(None)
    metrics_url: str | None = flag(None)
    token_file: Path | None = flag(None, "that server's key_file.json (omit if its auth is off)")
    no_progress: bool = flag(False)

    @property
    def peer_dtype_list(self) -> list[str]:
        """`--peer-dtypes` as a list (empty: not given)."""
        return csv_list(self.peer_dtypes, str) or []

    def of(self, kind_flags: type[_Flags]) -> _Flags:
        """A run kind's own flags: as parsed, or their defaults (options built without that kind's, in a test)."""
        for flags in self.kinds:
            if isinstance(flags, kind_flags):
                return flags
        return kind_flags()


def parser(description: str, kinds: Sequence[type[DataclassInstance]] = ()) -> argparse.ArgumentParser:
    """The parser of `Options` and the run kinds' flags (in --help where `Options.kinds` stands)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in fields(Options):
        for declared in [g for k in kinds for g in fields(k)] if f.metadata.get("kinds") else [f]:
            _add(p, declared)
    return p


def _add(p: argparse.ArgumentParser, f: Field[Any]) -> None:
    name = f"--{f.name.replace('_', '-')}"
    declared = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    declared = declared.removesuffix(" | None")
    if declared == "bool":
        p.add_argument(name, action="store_true", default=f.default, help=f.metadata["help"])
        return
    if declared not in CASTS:
        raise TypeError(f"{name}: declared {f.type}; a flag is one of bool, {', '.join(CASTS)} (or that | None)")
    p.add_argument(
        name, type=CASTS[declared], default=f.default, choices=f.metadata["choices"], help=f.metadata["help"]
    )


def parse(argv: Sequence[str] | None, description: str, kinds: Sequence[type[DataclassInstance]] = ()) -> Options:
    """The command line into `Options`, each kind's flags into its own dataclass (argparse's usage errors as
    ever: exit 2)."""
    values = vars(parser(description, kinds).parse_args(argv))
    own = tuple(_read(k, values) for k in kinds)
    return replace(_read(Options, values), kinds=own)


def _read(cls: type[_Flags], values: dict[str, Any]) -> _Flags:
    return cls(**{f.name: values[f.name] for f in fields(cls) if not f.metadata.get("kinds")})


def plan_from_args(options: Options, suite_of: Mapping[str, str] | None = None) -> RunPlan:
    """The suite (default `default`, or the suite of the run kind that owns `--workload`: `suite_of`, workload to
    suite, from the run kinds' WORKLOADS), with flags overriding its defaults; matrix flags replace its configs."""
    flags = {
        "strategy": csv_list(options.strategies, str),
        "batch_size": csv_list(options.batch_sizes, int),
        "max_batch_delay": csv_list(options.delays, int),
        "rate": csv_list(options.rates, float),
        "short_frac": csv_list(options.short_fracs, float),
    }
    matrix: dict[str, list[Any]] = {k: v for k, v in flags.items() if v}
    model = str(options.model_dir) if options.model_dir else None
    overrides: dict[str, Any] = {  # Configuration fields of several types
        k: v
        for k, v in {
            "duration": options.duration,
            "mode": options.mode,
            "concurrency": options.concurrency,
            "workers": options.workers,
            "threads": options.threads,
            "model": model,
            "workload": traffic.workload_name(options.texts) if options.texts else options.workload,
        }.items()
        if v is not None
    }
    own_suite = (suite_of or {}).get(options.workload or "") if options.suite is None else None
    base = load_suite(options.suite or own_suite or "default")
    if matrix:
        own_defaults = suites()[own_suite].get("defaults", {}) if own_suite else {}
        defaults = {"strategy": "bucketed", "batch_size": 16, **own_defaults, **overrides}
        if "rate" in matrix and "mode" not in overrides:
            defaults["mode"] = "open"
        configs = tuple(expand(defaults, [], matrix))
        # `--suite NAME` (or a workload's own suite) with matrix flags: its kind on the flags' configurations
        named = options.suite is not None or own_suite is not None
        plan = RunPlan(
            "custom",
            "configurations from flags",
            configs,
            options.bound,
            base.sweep if named else None,
            base.kind if named else "matrix",
            base.options if named else {},
        )
    else:
        configs = tuple(replace(c, **overrides) for c in base.configs)
        bound = base.bound or options.bound
        plan = RunPlan(base.name, base.description, configs, bound, base.sweep, base.kind, base.options)
    for flag_name, (key, allowed) in AXES.items():
        values = csv_list(getattr(options, flag_name), str)
        if not values:
            continue
        bad = sorted(set(values) - set(allowed))
        if bad:
            raise SystemExit(f"--{flag_name}: got {', '.join(bad)}; allowed: {' | '.join(allowed)}")
        plan = replace(plan, configs=tuple(replace(c, **{key: v}) for c in plan.configs for v in values))
    configs = tuple(one_worker_if_continuous(served(c)) for c in plan.configs)
    kept = tuple(c for c in configs if engine_runs_dtype(c))
    if not kept:
        pairs = ", ".join(sorted({f"{c.engine} {c.dtype}" for c in configs}))
        raise SystemExit(f"--engines/--dtypes: no engine here runs its dtype ({pairs}): see README, Engines")
    for c in configs:
        if c not in kept:
            print(f"left out: {c.name} (the {c.engine} engine does not run {c.dtype})")
    return replace(plan, configs=kept)
