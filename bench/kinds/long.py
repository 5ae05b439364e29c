"""`long` (`--workload long`, `--suite long`): long documents answered three ways through TorchServe, on a
long-context model (`bert-long-random` by default: 8,192 positions, served at its own limit). Per configuration,
the long workload's documents (`--long-docs`, 1k-8k tokens, `workloads.long_documents`), one a request:

- **truncate**: `{"texts": [doc]}` to the model registered at its own limit: the whole document in one pass (it
  fits), one vector;
- **late**: `{"texts": [doc], "chunking": "late", "spans": "sentences"}` to the same registration: one pass, one
  vector per sentence;
- **chunk**: `{"texts": [doc], "on_overflow": "chunk"}` to the same model registered again at `--chunk-length`
  tokens (512: a 512-token encoder, as most are): windows of 510 of its tokens each (the special tokens make 512),
  pooled, combined by a token-weighted mean, one vector. A request's `on_overflow` splits only a text over the
  registration's max_length, so on the 8k registration a document would be one window: chunking at 512 is served
  as a user serves it, a registration that reads 512 tokens.

Both registrations are up at once. Each mode first sends its first documents once (`concurrency` of them, at least
2) as a warm-up whose answers are checked (status, vectors, windows); then, `--long-cycles` times, each mode in turn
sends every document once in the workload's order, `concurrency` clients in a closed loop, within `duration` /
cycles seconds (a cut load says so): drift on a shared machine falls on every mode alike. A mode's figures over its
loads: documents/s, the tokens and the rows the model ran per document (the handler's counters), vectors per
document (one, or a late request's sentences: each document's `chunks.sentences`, checked against the warm-up's
answers), p50 and p99 per request; the report's section holds them and their ratios to truncate's, and `long.json`
in the run's folder.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.harness import report, stats
from bench.harness.load import LoadResult
from bench.harness.measure import Load
from bench.harness.options import Options, flag
from bench.harness.run_plan import RunPlan
from bench.harness.targets import TorchServeModel, TorchServeSite, model_name
from bench.inputs import models
from bench.inputs.configuration import TORCHSERVE, Configuration
from bench.inputs.workloads import LONG, LONG_DOCS, LONG_TOKENS, Workload, long_documents
from bench.kinds.context import RunContext
from bucketing import chunks
from bucketing.metrics import BatchStats
from model_store import archives
from model_store import build as archive_build

NAME = "long"
TITLE = "Long documents: truncate, chunk and late chunking"
WORKLOADS: tuple[str, ...] = (LONG,)  # `--workload long` runs this kind (its suite, `long`), and no other
REQUEST_TIMEOUT_S = 300.0  # one warm-up request's limit (an 8k document takes seconds on 2 cores)

# Each mode's request body beside its document, and the registration it goes to (`own`: the model's own limit).
MODES: dict[str, dict[str, Any]] = {
    "truncate": {},
    "late": {"chunking": "late", "spans": "sentences"},
    "chunk": {"on_overflow": "chunk"},
}
OWN, WINDOWS = "own", "windows"
REGISTRATION = {"truncate": OWN, "late": OWN, "chunk": WINDOWS}


@dataclass(frozen=True)
class LongFlags:
    """long's own flags (`options.flag` declarations, as the bench's in `options.Options`)."""

    long_docs: int = flag(LONG_DOCS, "--workload long: documents of 1k-8k tokens (seeded by --seed), one a request")
    long_cycles: int = flag(
        2, "--workload long: times each document is sent per mode, modes in turn (within --duration)"
    )
    chunk_length: int = flag(512, "--workload long: max_length of the chunk mode's registration (its windows)")


FLAGS = LongFlags


@dataclass(frozen=True)
class LongRow:
    """One mode's figures on one configuration."""

    config: str
    mode: str
    max_length: int  # of the registration it ran on
    requests: int
    errors: int
    cut: bool  # the load reached its time limit before every document was sent
    wall_s: float
    docs_per_s: float
    tokens_per_doc: float  # tokens the model ran (the handler's real tokens)
    rows_per_doc: float  # rows the model ran: one, or a chunked document's windows
    vectors_per_doc: float
    p50_ms: float
    p99_ms: float


def check(options: Options, plan: RunPlan) -> None:
    """The long workload alone (no peer, capacity search, exact-length bound or host other than TorchServe); flags
    within their ranges."""
    flags = options.of(LongFlags)
    if options.peer:
        raise SystemExit("--peer: not with --workload long (it measures TorchServe registrations)")
    if options.p99_ms is not None:
        raise SystemExit("--p99-ms: not with --workload long (it reports each mode's p50 and p99)")
    if plan.bound:
        raise SystemExit("--bound: not with --workload long")
    for c in plan.configs:
        if c.workload != LONG:
            raise SystemExit(f"--suite long: got --workload {c.workload}; allowed: long")
        if c.mode != "closed":
            raise SystemExit("--workload long: runs a closed loop (--mode closed, no --rates)")
        if c.host != TORCHSERVE:
            raise SystemExit(f"--hosts {c.host}: not with --workload long (it registers on TorchServe itself)")
    if not 1 <= flags.long_docs <= 1000:
        raise SystemExit(f"--long-docs: got {flags.long_docs}; allowed: 1 to 1000")
    if not 1 <= flags.long_cycles <= 100:
        raise SystemExit(f"--long-cycles: got {flags.long_cycles}; allowed: 1 to 100")
    if not 16 <= flags.chunk_length <= LONG_TOKENS[0]:
        raise SystemExit(
            f"--chunk-length: got {flags.chunk_length}; allowed: 16 to {LONG_TOKENS[0]} (below the shortest document)"
        )


def refuse(options: Options) -> None:
    """long's flags are refused where another kind runs."""
    given = [name for name, value in asdict(options.of(LongFlags)).items() if value != getattr(LongFlags(), name)]
    if given:
        raise SystemExit(f"--{given[0].replace('_', '-')}: only with --workload long")


def body(doc: str, mode: str) -> bytes:
    """A mode's request: one document, in our JSON body."""
    return json.dumps({"texts": [doc], **MODES[mode]}).encode()


def vectors(doc: str, mode: str) -> int:
    """The vectors a mode answers for a document that fits the model: one, or one per sentence (late)."""
    return len(chunks.sentences(doc)) if mode == "late" else 1


def windows(tokens: int, length: int, specials: int = 2) -> int:
    """The windows `on_overflow: chunk` cuts a text of `tokens` tokens (special tokens included) into at max_length
    `length` (no overlap): one for a text that fits."""
    return 1 if tokens <= length else math.ceil((tokens - specials) / (length - specials))


def run(ctx: RunContext) -> list[str]:
    """Each configuration: its two registrations at once, each mode warmed up, then the modes in turn, cycle after
    cycle (drift on a shared machine falls on each alike); the report section of them all."""
    flags = ctx.options.of(LongFlags)
    if ctx.site is None:
        raise SystemExit("--workload long: needs a TorchServe")
    docs = long_documents(flags.long_docs, ctx.options.seed)
    rows: list[LongRow] = []
    for i, config in enumerate(ctx.plan.configs, 1):
        limit, tokens = served_tokens(config, docs)
        print(
            f"\n[{i}/{len(ctx.plan.configs)}] {config.name}: {len(docs.texts)} documents of {min(tokens)}-"
            f"{max(tokens)} tokens; truncate and late at max_length {limit}, chunk at {flags.chunk_length}"
        )
        lengths = {OWN: limit, WINDOWS: flags.chunk_length}
        with target(ctx.site, config, OWN, limit) as own, target(ctx.site, config, WINDOWS, flags.chunk_length) as cut:
            targets = {OWN: own, WINDOWS: cut}
            loads = {m: Loads(targets[r], lengths[r]) for m, r in REGISTRATION.items()}
            for mode, each in loads.items():
                warm(each.target, docs.texts, tokens, mode, each.length, max(2, config.concurrency))
            for cycle in range(flags.long_cycles):
                for mode, each in loads.items():
                    each.add(ctx, config, docs, mode, config.duration / flags.long_cycles, f"{mode} {cycle + 1}")
        for mode, each in loads.items():
            rows.append(each.row(config, docs, mode))
            print(line(rows[-1]))
        (ctx.out / "long.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return [section(rows, docs, flags)]


@dataclass
class Loads:
    """One mode's loads on its registration, and what the handler's counters moved by during them."""

    target: TorchServeModel
    length: int  # the registration's max_length
    results: list[LoadResult] = field(default_factory=list)
    sent: int = 0  # requests each load was to send, in all
    handler: list[BatchStats] = field(default_factory=list)

    def add(
        self, ctx: RunContext, config: Configuration, docs: Workload, mode: str, seconds: float, label: str
    ) -> None:
        """Every document once, `concurrency` clients in a closed loop, within `seconds`."""
        bodies = [body(d, mode) for d in docs.texts]
        t = self.target
        spec = Load(t.url, bodies, t.headers, "closed", config.concurrency, 1.0, seconds, label, len(bodies))
        before = t.counters()
        result = ctx.measurer.send(spec)
        self.results.append(result)
        self.handler.append(stats.handler_delta(before, t.counters()))
        self.sent += len(bodies)
        errors = sum(s.status != 200 for s in result.samples)
        print(f"  {label}: {len(result.samples)} of {len(bodies)} documents in {result.wall_s:.1f} s, {errors} errors")

    def row(self, config: Configuration, docs: Workload, mode: str) -> LongRow:
        samples = [s for r in self.results for s in r.samples]
        ok = [s for s in samples if s.status == 200]
        latencies = [s.latency_ms for s in ok]
        wall = sum(r.wall_s for r in self.results)
        answered = max(sum(d.requests for d in self.handler), 1)
        return LongRow(
            config=config.name,
            mode=mode,
            max_length=self.length,
            requests=len(samples),
            errors=len(samples) - len(ok),
            cut=len(samples) < self.sent,
            wall_s=round(wall, 2),
            docs_per_s=round(len(ok) / wall, 3) if wall else 0.0,
            tokens_per_doc=round(sum(d.real_tokens for d in self.handler) / answered, 1),
            rows_per_doc=round(sum(d.texts for d in self.handler) / answered, 2),
            vectors_per_doc=round(sum(vectors(docs.texts[s.body_index], mode) for s in ok) / max(len(ok), 1), 1),
            p50_ms=round(stats.percentile(latencies, 50), 1),
            p99_ms=round(stats.percentile(latencies, 99), 1),
        )


def served_tokens(config: Configuration, docs: Workload) -> tuple[int, list[int]]:
    """The model's own limit and each document's tokens under it; a model that cannot read the longest document
    whole is refused in one line (truncate is meant as the whole document in one pass)."""
    tokenizer = models.tokenizer(config.model)
    encoded = tokenizer.encode(list(docs.texts))
    if any(e.truncated for e in encoded):
        raise SystemExit(
            f"--workload long: documents up to {max(docs.target_tokens)} tokens; {models.label(config.model)} reads "
            f"{tokenizer.max_length} (a long-context model, as {models.LONG_MODEL}, reads them whole)"
        )
    return tokenizer.max_length, [len(e.ids) for e in encoded]


def target(site: TorchServeSite, config: Configuration, registration: str, length: int) -> TorchServeModel:
    """The model registered at its own limit (`own`), or again at `length` tokens (`windows`, the chunk mode's)."""
    if registration == OWN:
        return TorchServeModel(site, config, model_name(config))  # registered when entered
    name = f"{model_name(config)}-l{length}"
    archive = windows_archive(site, config, length)
    site.client.unregister(name)
    try:
        site.client.register(archive, name, config.batch_size, config.max_batch_delay, config.workers)
    except BaseException:
        site.client.unregister(name)
        raise
    return TorchServeModel(site, config, name, registered=True)  # unregistered when left


def windows_archive(site: TorchServeSite, config: Configuration, length: int) -> str:
    """The archive of the configuration's model at max_length `length` (built first, when the store is ours)."""
    prefix = f"{models.prefix(config.model, config.engine, config.schedule, config.dtype)}-l{length}"
    name = archives.name(config.strategy, config.threads, prefix)
    if site.store is not None:
        spec = archive_build.ArchiveSpec(
            strategies=(config.strategy,),
            threads=config.threads,
            engine=config.engine,
            model_dir=models.model_dir(config.model) if config.model is not None else None,
            task="embedding" if config.model is not None else None,
            prefix=prefix,
            schedule=config.schedule,
            max_length=length,
            dtype=config.dtype,
            settings=models.archive_settings(config.model),
        )
        try:
            archive_build.build_archives(site.store, spec, if_stale=True)
        except (archive_build.BuildError, archives.ModelFolderError) as e:
            raise SystemExit(f"building the chunk mode's archive failed: {e}") from None
    return f"{name}.mar"


def warm(t: TorchServeModel, texts: Sequence[str], tokens: Sequence[int], mode: str, length: int, count: int) -> None:
    """The first `count` documents once, `count` at a time; each answer checked: a 200, nothing truncated, its
    vectors (`vectors`) and, chunked, its windows (`windows`). A wrong answer ends the run in one line."""
    from tsctl.client import request

    def one(k: int) -> None:
        headers = {"Content-Type": "application/json", **t.headers()}
        reply = request(t.url, "POST", body(texts[k], mode), headers, timeout=REQUEST_TIMEOUT_S)
        if reply.status != 200:
            raise SystemExit(f"{mode}: document {k} got HTTP {reply.status}: {reply.body[:200]!r}")
        (answer,) = json.loads(reply.body)
        got = len(answer["chunks"]) if mode == "late" else 1
        expected = (vectors(texts[k], mode), windows(tokens[k], length) if mode == "chunk" else None)
        if answer.get("truncated") or (got, answer.get("chunks") if mode == "chunk" else None) != expected:
            raise SystemExit(
                f"{mode}: document {k} ({tokens[k]} tokens) answered {got} vectors, chunks {answer.get('chunks')}, "
                f"truncated {answer.get('truncated')}; expected {expected[0]} vectors, chunks {expected[1]}"
            )

    with ThreadPoolExecutor(count) as pool:
        list(pool.map(one, range(min(count, len(texts)))))


def line(row: LongRow) -> str:
    cut = f"; cut at {row.wall_s:g} s" if row.cut else ""
    return (
        f"  {row.mode}: {row.docs_per_s:g} documents/s, {row.tokens_per_doc:,.0f} tokens and {row.rows_per_doc:g} "
        f"rows a document, {row.vectors_per_doc:g} vectors, p50 {row.p50_ms:,.0f} ms, p99 {row.p99_ms:,.0f} ms; "
        f"{row.requests} requests, {row.errors} errors{cut}"
    )


COLUMNS: tuple[tuple[str, str], ...] = (
    ("config", "config"),
    ("mode", "mode"),
    ("max_length", "registered max_length"),
    ("docs_per_s", "documents/s"),
    ("tokens_per_doc", "tokens run per document"),
    ("rows_per_doc", "rows per document"),
    ("vectors_per_doc", "vectors per document"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("requests", "requests"),
    ("errors", "errors"),
)
RATIOS: tuple[tuple[str, str], ...] = (
    ("docs_per_s", "documents/s"),
    ("tokens_per_doc", "tokens run"),
    ("p50_ms", "p50"),
    ("p99_ms", "p99"),
)


def ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}x" if baseline else "-"


def section(rows: Sequence[LongRow], docs: Workload, flags: LongFlags) -> str:
    """The report's section: each mode's figures, then their ratios to truncate's on the same configuration."""
    lengths = docs.target_tokens
    head = (
        f"## Long documents\n\n{len(lengths)} documents of {min(lengths):,}-{max(lengths):,} tokens (seed "
        f"{docs.seed}), one a request, each sent {flags.long_cycles} time(s) per mode: truncate (the whole document "
        "in one pass) and late chunking (one pass, a vector per sentence) to the model at its own limit, chunk "
        f"(windows of {flags.chunk_length} tokens, one combined vector) to the same model registered at "
        f"{flags.chunk_length} (`bench/kinds/long.py`).\n\n"
    )
    shown = []
    for r in rows:
        values: dict[str, Any] = asdict(r)
        shown.append(
            [
                (f"{values[k]:,}" if isinstance(values[k], (int, float)) and k != "max_length" else str(values[k]))
                + (" (cut)" if k == "requests" and r.cut else "")
                for k, _ in COLUMNS
            ]
        )
    table = report.table([h for _, h in COLUMNS], shown).splitlines()
    ratios = [
        "| config | mode | " + " | ".join(f"{h} vs truncate" for _, h in RATIOS) + " |",
        "|" + "---|" * (2 + len(RATIOS)),
    ]
    for r in rows:
        base = next((b for b in rows if b.config == r.config and b.mode == "truncate"), None)
        if base is None:
            continue
        cells = [ratio(getattr(r, k), getattr(base, k)) for k, _ in RATIOS]
        ratios.append(f"| {r.config} | {r.mode} | " + " | ".join(cells) + " |")
    return head + "\n".join(table) + "\n\n" + "\n".join(ratios) + "\n"
