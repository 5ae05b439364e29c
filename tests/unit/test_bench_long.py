"""The long workload (`--workload long`): its documents (lengths spread over 1k-8k tokens, the same per seed), the
long-context geometry's config (no weights), how the command line becomes the `long` kind's plan, and the kind's
request bodies, expected answers, flags and report section."""

from __future__ import annotations

import json

import pytest

from bench import compare
from bench.harness.options import Options
from bench.harness.run_plan import load_suite
from bench.inputs import models
from bench.inputs.workloads import BENCH_WORKLOADS, LONG, LONG_TOKENS, long_documents
from bench.kinds import RUN_KINDS
from bench.kinds import long as long_kind
from bucketing.chunks import sentences


def test_long_documents_spread_over_the_range_and_are_the_same_per_seed():
    docs = long_documents(24, seed=0)
    assert docs == long_documents(24, seed=0) and docs.texts != long_documents(24, seed=1).texts
    low, high = LONG_TOKENS
    targets = docs.target_tokens
    assert len(targets) == len(docs.texts) == 24 and all(low <= t <= high for t in targets)
    width = (high - low) / 24  # one length in each of 24 equal slices of the range, in a shuffled order
    assert sorted(int((t - low) // width) for t in targets) == list(range(24))
    assert list(targets) != sorted(targets)
    assert all("\n\n" in d for d in docs.texts)  # paragraphs of the bench's passages
    with pytest.raises(ValueError, match="long documents"):
        long_documents(0)


def test_long_documents_are_their_target_tokens_under_the_long_models_tokenizer():
    from bucketing.model.tokenizer import Tokenizer
    from model_store.archives import minilm_dir

    docs = long_documents(6, seed=3, low=1000, high=3000)
    encoded = Tokenizer(str(minilm_dir()), 8192).encode(list(docs.texts))  # the long model's: MiniLM's tokenizer
    assert [len(e.ids) for e in encoded] == list(docs.target_tokens)


def test_the_long_geometry_is_a_bert_of_8192_positions_an_8k_pass_of_which_is_mostly_attention():
    config = models.long_config()
    assert config.max_position_embeddings == models.LONG_POSITIONS == 8192
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (2, 256, 4)
    assert config.hidden_size // config.num_attention_heads == 64 and config.vocab_size == 30522
    assert models.long_config(2048).max_position_embeddings == 2048
    linear, attention = models.long_flops(8192)
    assert linear == pytest.approx(2 * 2 * (4 * 256**2 + 2 * 256 * 1024) * 8192)
    assert attention == pytest.approx(2 * 4 * 8192**2 * 256)
    assert attention / (linear + attention) > 0.8  # quadratic: at 8k tokens attention is the pass
    short_linear, short_attention = models.long_flops(512)
    assert short_attention / (short_linear + short_attention) < 0.3


def test_the_long_model_is_archived_at_its_own_limit_on_torch():
    assert models.archive_max_length(models.LONG_MODEL) is None  # the model's own 8,192
    assert models.archive_max_length(models.BERT_BASE) == 256
    served = models.served_as(LONG)
    assert (served.task, served.model, served.engine) == ("embedding", models.LONG_MODEL, "torch")
    assert models.archive_settings(models.LONG_MODEL) == {"torchscript": False}  # eager, as late chunking's pass
    assert models.archive_settings(None) is None and models.archive_settings(models.BERT_BASE) is None


def test_an_archive_specs_settings_are_set_in_its_model_config():
    from model_store.build import ArchiveSpec

    (config,) = ArchiveSpec(strategies=("bucketed",), settings={"torchscript": False}).configs().values()
    assert config["handler"]["torchscript"] is False and config["handler"]["strategy"] == "bucketed"


def test_workload_long_runs_the_long_suite_and_its_kind():
    assert LONG in BENCH_WORKLOADS and "long" in RUN_KINDS
    plan = compare.plan_from_args(compare.parse_args(["--workload", "long"]))
    assert (plan.name, plan.kind) == ("long", "long")
    (config,) = plan.configs
    assert (config.workload, config.model, config.engine) == ("long", models.LONG_MODEL, "torch")
    assert (config.concurrency, config.batch_size, config.workers) == (2, 1, 2)
    custom = compare.plan_from_args(compare.parse_args(["--workload", "long", "--strategies", "bucketed,dynamic"]))
    assert custom.kind == "long" and [c.strategy for c in custom.configs] == ["bucketed", "dynamic"]
    assert {(c.concurrency, c.batch_size) for c in custom.configs} == {(2, 1)}  # the long suite's defaults
    options = compare.parse_args(["--workload", "long", "--long-docs", "4"])
    assert options.of(long_kind.LongFlags).long_docs == 4
    compare.check_args(options, compare.plan_from_args(options))


def test_workload_long_is_refused_by_other_kinds_and_its_flags_elsewhere():
    options = compare.parse_args(["--suite", "default", "--workload", "long"])
    with pytest.raises(SystemExit, match="--workload long: measured by its own kind"):
        compare.check_args(options, compare.plan_from_args(options))
    options = compare.parse_args(["--chunk-length", "256"])
    with pytest.raises(SystemExit, match="--chunk-length: only with --workload long"):
        compare.check_args(options, compare.plan_from_args(options))


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (long_kind.LongFlags(long_docs=0), "--long-docs: got 0; allowed: 1 to 1000"),
        (long_kind.LongFlags(long_cycles=0), "--long-cycles: got 0"),
        (long_kind.LongFlags(chunk_length=2000), "--chunk-length: got 2000; allowed: 16 to 1000"),
    ],
)
def test_bad_long_flags_are_refused_in_one_line(flags, words):
    with pytest.raises(SystemExit, match=words):
        long_kind.check(Options(kinds=(flags,)), load_suite("long"))
    with pytest.raises(SystemExit, match="--peer: not with --workload long"):
        long_kind.check(Options(peer="infinity"), load_suite("long"))


def test_each_modes_body_and_expected_answer():
    doc = "One two three. Four five!\n\nSix seven?"
    assert json.loads(long_kind.body(doc, "truncate")) == {"texts": [doc]}
    assert json.loads(long_kind.body(doc, "chunk")) == {"texts": [doc], "on_overflow": "chunk"}
    assert json.loads(long_kind.body(doc, "late")) == {"texts": [doc], "chunking": "late", "spans": "sentences"}
    assert long_kind.vectors(doc, "late") == len(sentences(doc)) == 3
    assert long_kind.vectors(doc, "truncate") == long_kind.vectors(doc, "chunk") == 1
    assert long_kind.windows(512, 512) == 1 and long_kind.windows(513, 512) == 2
    assert long_kind.windows(8000, 512) == 16  # 7,998 own tokens in windows of 510
    assert long_kind.REGISTRATION == {"truncate": "own", "late": "own", "chunk": "windows"}


def row(mode: str, docs_per_s: float, tokens: float, p50: float, cut: bool = False) -> long_kind.LongRow:
    return long_kind.LongRow(
        config="bucketed bs1",
        mode=mode,
        max_length=512 if mode == "chunk" else 8192,
        requests=24,
        errors=0,
        cut=cut,
        wall_s=10.0,
        docs_per_s=docs_per_s,
        tokens_per_doc=tokens,
        rows_per_doc=9.5 if mode == "chunk" else 1.0,
        vectors_per_doc=300.0 if mode == "late" else 1.0,
        p50_ms=p50,
        p99_ms=2 * p50,
    )


def test_the_report_section_holds_each_modes_figures_and_their_ratios_to_truncate():
    rows = [row("truncate", 2.0, 4500.0, 1000.0), row("late", 1.6, 4500.0, 1250.0), row("chunk", 8.0, 4517.0, 250.0)]
    docs = long_documents(3)
    text = long_kind.section(rows, docs, long_kind.LongFlags())
    assert text.startswith("## Long documents\n\n3 documents of ")
    assert "| bucketed bs1 | chunk | 512 | 8.0 | 4,517.0 | 9.5 | 1.0 | 250.0 | 500.0 | 24 | 0 |" in text
    assert "| bucketed bs1 | truncate | 1.00x | 1.00x | 1.00x | 1.00x |" in text
    assert "| bucketed bs1 | late | 0.80x | 1.00x | 1.25x | 1.25x |" in text
    assert "| bucketed bs1 | chunk | 4.00x | 1.00x | 0.25x | 0.25x |" in text
    cut = long_kind.section([row("truncate", 2.0, 4500.0, 1000.0, cut=True)], docs, long_kind.LongFlags())
    assert "| 24 (cut) |" in cut
    assert "cut at 10 s" in long_kind.line(row("truncate", 2.0, 4500.0, 1000.0, cut=True))


class FakeClient:
    """A TorchServe client that registers, describes and counts: each model's handler counters move by one request
    and `tokens` real tokens (a row per document, or `rows` for the 512 registration) per document answered."""

    def __init__(self, docs) -> None:
        from tsctl import Endpoints

        self.endpoints = Endpoints("http://fake:1", "http://fake:2", "http://fake:3")
        self.events: list[str] = []
        self.docs = docs
        self.answered: dict[str, list[int]] = {}  # model name -> indexes of the documents it answered

    class keys:  # noqa: N801 - as the client's attribute
        @staticmethod
        def headers(api: str) -> dict[str, str]:
            return {}

    def register(self, archive, name, batch_size, delay, workers) -> None:
        self.events.append(f"register {name} from {archive}")

    def unregister(self, name) -> None:
        self.events.append(f"unregister {name}")

    def call(self, api, method, path):
        class Reply:
            status = 200

            @staticmethod
            def json():
                return [{"workers": [{"gpu": False}]}]

        return Reply()

    def metrics(self) -> str:
        lines = []
        for name, done in self.answered.items():
            rows = (
                sum(long_kind.windows(self.docs.target_tokens[k], 512) for k in done) if "-l512" in name else len(done)
            )
            tokens = sum(self.docs.target_tokens[k] for k in done)
            for metric, value in (
                ("bucket_requests_total", len(done)),
                ("bucket_texts_total", rows),
                ("bucket_real_tokens_total", tokens),
            ):
                lines.append(f'{metric}{{ModelName="{name}",Level="Model"}} {value}')
        return "\n".join(lines)


def test_the_long_kind_registers_both_warms_each_mode_then_runs_the_modes_in_turn(tmp_path, monkeypatch):
    import tsctl.client
    from bench.harness.load import LoadResult, Sample
    from bench.harness.measure import Load, Measurer
    from bench.harness.results import ReportInputs
    from bench.harness.run_plan import RunPlan
    from bench.harness.targets import TorchServeSite
    from bench.inputs.configuration import Configuration
    from bench.kinds import RunContext
    from tests.unit.test_bench_run_loop import FakeResolver
    from tsctl.client import Reply

    docs = long_documents(3, seed=0)
    client = FakeClient(docs)
    warmed: list[tuple[str, dict]] = []

    def request(url, method, body, headers, timeout):
        sent = json.loads(body)
        warmed.append((url.rsplit("/", 1)[1], {k: v for k, v in sent.items() if k != "texts"}))
        (doc,) = sent["texts"]
        answer: dict[str, object] = {"tokens": 1, "truncated": False}
        if sent.get("chunking") == "late":
            answer["chunks"] = [{"span": [0, 1], "embedding": [1.0]} for _ in sentences(doc)]
        elif sent.get("on_overflow") == "chunk":
            k = docs.texts.index(doc)
            answer.update(embedding=[1.0], chunks=long_kind.windows(docs.target_tokens[k], 512))
        else:
            answer["embedding"] = [1.0]
        return Reply(200, json.dumps([answer]).encode(), {})

    monkeypatch.setattr(tsctl.client, "request", request)
    monkeypatch.setattr(long_kind, "served_tokens", lambda config, d: (8192, list(d.target_tokens)))
    loads: list[Load] = []

    def send(spec: Load) -> LoadResult:
        loads.append(spec)
        name = spec.url.rsplit("/", 1)[1]
        samples = tuple(Sample(0.0, 100.0 * (k + 1), 200, k) for k in range(spec.max_requests))
        client.answered.setdefault(name, []).extend(range(spec.max_requests))
        return LoadResult("closed", spec.clients, None, samples, 1.0, 0.0)

    config = Configuration("bucketed", 1, workload=LONG, concurrency=2, duration=30, model=models.LONG_MODEL)
    plan = RunPlan("long", "fake", (config,), False, None, kind="long")
    ctx = RunContext(
        plan=plan,
        resolver=FakeResolver(),  # the long kind resolves no jobs
        target=lambda job: None,  # type: ignore[arg-type,return-value]
        measurer=Measurer(send, warmup_s=0.0),
        inputs=ReportInputs(RUN_KINDS["long"].TITLE, {"command": "fake"}),
        record=lambda summary: None,
        out=tmp_path,
        t0=0.0,
        site=TorchServeSite(client, None),  # type: ignore[arg-type]  # someone else's server: its store has them
        options=Options(kinds=(long_kind.LongFlags(long_docs=3, long_cycles=2),)),
    )
    assert compare.measure_all(ctx) == 0
    own, windows = "bench-bucketed-bs1-d10-2x1-bert-long-random", "bench-bucketed-bs1-d10-2x1-bert-long-random-l512"
    registered = [e for e in client.events if e.startswith("register")]
    assert registered == [
        f"register {own} from bert-long-random-bucketed.mar",
        f"register {windows} from bert-long-random-l512-bucketed.mar",
    ]
    assert client.events[-2:] == [f"unregister {windows}", f"unregister {own}"]  # both left when done
    assert [name for name, _ in warmed] == [own] * 4 + [windows] * 2  # 2 documents a mode, answers checked
    assert [spec.label for spec in loads] == ["truncate 1", "late 1", "chunk 1", "truncate 2", "late 2", "chunk 2"]
    assert all(spec.max_requests == 3 and spec.duration_s == 15 and spec.clients == 2 for spec in loads)
    assert json.loads(loads[2].bodies[0]) == {"texts": [docs.texts[0]], "on_overflow": "chunk"}
    rows = {r["mode"]: r for r in json.loads((tmp_path / "long.json").read_text())}
    assert rows["truncate"]["docs_per_s"] == 3.0 and rows["truncate"]["requests"] == 6
    assert rows["truncate"]["tokens_per_doc"] == round(sum(docs.target_tokens) / 3, 1)
    assert rows["chunk"]["rows_per_doc"] == round(sum(long_kind.windows(t, 512) for t in docs.target_tokens) / 3, 2)
    assert rows["late"]["vectors_per_doc"] == round(sum(len(sentences(d)) for d in docs.texts) / 3, 1)
    assert rows["late"]["p50_ms"] == 200.0 and not rows["chunk"]["cut"]
    assert "## Long documents" in (tmp_path / "report.md").read_text()
