"""bfloat16's fidelity: the start-up probe covers every kind of token a vocabulary holds (a model whose bfloat16
error sits in tokens plain English lacks no longer starts), and shadow checking (`handler.fidelity_sample`)
observes served texts in float32 without changing a single answer."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from bucketing.engines import precision
from bucketing.engines.shadow import sampled
from bucketing.engines.torch_engine import TorchEngine
from bucketing.metrics import SAMPLES, SAMPLES_MIN
from bucketing.model.head import EngineError, load_head
from bucketing.model.tokenizer import Tokenizer
from tests.handler.test_handler import make_handler, serve

# The 16 English texts the probe was before issue 38: a model whose error sits in other tokens passed them.
OLD_PROBE = (
    "TorchServe hands the handler a list of requests.",
    "Short text.",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "How do I reset my password if I no longer have access to my email account?",
    "Bucketing sorts texts by length and pads each sub-batch only to its own longest text, so short texts do not "
    "pay for long ones.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "What is the capital of Australia?",
    "Canberra is the capital city of Australia, chosen as a compromise between Sydney and Melbourne.",
    "The stock market fell sharply on Tuesday after the central bank raised interest rates by half a point.",
    "A transformer encoder maps a sequence of tokens to a sequence of vectors, one per token; pooling then turns "
    "them into one vector per text, and a dense layer may project it to fewer dimensions before normalisation.",
    "I loved this film: the acting was superb and the ending made me cry.",
    "Terrible service, cold food, and we waited an hour for the bill.",
    "Water boils at 100 degrees Celsius at sea level.",
    "The patient presented with a persistent cough, mild fever and fatigue lasting two weeks.",
    "def add(a, b): return a + b",
    "Mount Everest is the highest mountain above sea level, on the border between Nepal and China; climbers "
    "usually attempt it in May, when the jet stream moves north and the winds at the summit drop.",
)
UNSEEN = "zebra"  # a word in no probe: its error is what only shadow checking can see


def tokens_of(tokenizer: Tokenizer, texts) -> set[int]:
    return {i for e in tokenizer.encode(list(texts)) for i in e.ids}


def with_fragile_tokens(source: Path, target: Path, ids: list[int]) -> Path:
    """The model with these tokens' embeddings at 1000 plus small noise: exact in float32 (its LayerNorm keeps the
    noise), flattened to a constant by bfloat16's 8-bit mantissa (spacing 4 near 1000)."""
    import torch
    from transformers import BertModel

    model = BertModel.from_pretrained(source)
    with torch.no_grad():
        rows = model.embeddings.word_embeddings.weight
        generator = torch.Generator().manual_seed(0)
        rows[ids] = 1000.0 + 0.5 * torch.randn(len(ids), rows.shape[1], generator=generator)
    model.save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).exists():
            (target / name).write_bytes((source / name).read_bytes())
    return target


@pytest.fixture(scope="module")
def tokenizer(tiny_embedder_dir) -> Tokenizer:
    return Tokenizer(str(tiny_embedder_dir), 128, lower_case=True)


def test_the_probe_set_covers_each_kind_of_token(tokenizer):
    probes = precision.probe_set(tokenizer)
    assert probes == precision.probe_set(tokenizer)  # deterministic: the same inputs on every start
    kinds = {p.kind for p in probes}
    assert kinds == {"prose", "digits", "punctuation", "scripts", "unknown", "word pieces", "long"}
    by_kind = {k: [p.encoded.ids for p in probes if p.kind == k] for k in kinds}
    vocab = {i: t for t, i in tokenizer._backend.get_vocab().items()}
    pieces = {k: {vocab[i] for ids in rows for i in ids} for k, rows in by_kind.items()}
    assert sum(t.isdigit() for t in pieces["digits"]) >= 10
    assert {"!", "?", "(", "[", "{", "@", "#", "%", "&", "|", "~"} <= pieces["punctuation"]
    assert sum("\u4e00" <= t[:1] <= "\u9fff" for t in pieces["scripts"]) >= 10  # CJK ideographs, one token each
    assert any("\u0400" <= t[:1] <= "\u04ff" for t in pieces["scripts"])  # and other scripts: Cyrillic, ...
    unknown = [ids.count(tokenizer.unk_id) / len(ids) for ids in by_kind["unknown"]]
    assert min(unknown) >= 0.3 and max(unknown) >= 0.8  # [UNK]-heavy
    assert all(len(ids) == tokenizer.max_length for ids in by_kind["long"])  # cut at max_length
    spread = sorted({i for ids in by_kind["word pieces"] for i in ids} - tokenizer.special_ids)
    assert len(spread) >= 300 and spread[0] < 500 and spread[-1] > tokenizer.vocab_size - 500
    assert sum(vocab[i].startswith("##") for i in spread) >= 50  # rare word pieces among them
    assert not tokens_of(tokenizer, OLD_PROBE) >= {i for ids in by_kind["scripts"] for i in ids}
    paired = precision.probe_set(tokenizer, pairs=True)
    assert len(paired) == len(probes) + 15 and {p.kind for p in paired} == kinds | {"pair"}


def test_a_model_whose_bfloat16_error_sits_in_tokens_english_lacks_fails_the_probe(
    tiny_embedder_dir, tokenizer, tmp_path, bf16_cpu
):
    """Issue 38: such a model passed the 16 English texts (cosine about 1) and then answered CJK at cosine near
    0 with 200s; the probe's CJK now stops it at start, naming the figure."""
    cjk = sorted(tokens_of(tokenizer, precision.SCRIPTS[:1]) - tokens_of(tokenizer, OLD_PROBE) - tokenizer.special_ids)
    assert cjk and tokenizer.unk_id not in cjk
    fragile = with_fragile_tokens(tiny_embedder_dir, tmp_path / "fragile", cjk)
    head, info = load_head("embedding", str(fragile))
    reference = TorchEngine(copy.deepcopy(head), "cpu", torch.float32, False, info.vocab_size)
    engine = TorchEngine(head, "cpu", torch.bfloat16, False, info.vocab_size)

    def fidelity(probes):
        expected, got = (precision.run_probes(e, probes, tokenizer.pad_id) for e in (reference, engine))
        return precision.measure("bfloat16", expected, got)

    old = [precision.Probe("prose", t, e) for t, e in zip(OLD_PROBE, tokenizer.encode(list(OLD_PROBE)))]
    assert fidelity(old).cosine_min >= 0.999  # what the old probe said
    assert fidelity(precision.probe_set(tokenizer)).cosine_min < 0.9  # what the probe set says now
    with pytest.raises(
        EngineError, match=r"^handler.dtype bfloat16: cosine min -?0\.\d+ \(on scripts\) to float32 on 26 probe"
    ):
        make_handler(fragile, max_length=128, dtype="bfloat16")


@pytest.fixture(scope="module")
def unseen_model(tiny_embedder_dir, tmp_path_factory) -> Path:
    """A model whose bfloat16 error sits in one word no probe holds: it starts, and only samples see the error."""
    tokenizer = Tokenizer(str(tiny_embedder_dir), 128, lower_case=True)
    (word,) = tokenizer.encode([UNSEEN])[0].ids[1:-1]
    assert all(word not in p.encoded.ids for p in precision.probe_set(tokenizer))
    return with_fragile_tokens(tiny_embedder_dir, tmp_path_factory.mktemp("unseen"), [word])


def sample_metrics(context) -> dict[tuple[str, str], float]:
    return {
        (name, ",".join(d.value for d in dims)): value
        for name, value, _, dims in context.metrics.added
        if name.startswith(SAMPLES)
    }


def test_shadow_checks_record_cosines_and_never_change_answers(unseen_model, bf16_cpu, caplog):
    texts = [f"the {UNSEEN} ran", "a short query", "a longer passage about serving models", f"{UNSEEN} {UNSEEN}"]
    rows = [{"body": {"texts": texts[:2]}}, {"body": {"text": texts[2]}}, {"body": {"texts": texts[3:]}}]
    plain, plain_context = make_handler(unseen_model, max_length=128, dtype="bfloat16")
    shadowed, context = make_handler(unseen_model, max_length=128, dtype="bfloat16", fidelity_sample=1.0)
    assert plain.task.engine.fidelity.cosine_min >= 0.999  # the probe passes: the worker starts
    with caplog.at_level(logging.WARNING):
        answers = serve(shadowed, context, rows)
    assert answers == serve(plain, plain_context, rows)  # every answer the same, to the last digit
    assert not sample_metrics(plain_context)
    got = sample_metrics(context)
    assert got[f"{SAMPLES}_count", ""] == 4
    low = got[SAMPLES_MIN, ""]
    assert low < 0.9 and got[f"{SAMPLES}_bucket", "0.999"] == 2 and got[f"{SAMPLES}_bucket", "+Inf"] == 4
    warnings = [r.getMessage() for r in caplog.records if "shadow check" in r.getMessage()]
    assert len(warnings) == 2 and f"cosine {low:.6f} to float32, below handler.min_cosine 0.999" in "".join(warnings)
    context.metrics.added.clear()
    serve(shadowed, context, [{"body": {"text": "nothing unusual here"}}])
    after = sample_metrics(context)
    assert after[f"{SAMPLES}_count", ""] == 1 and after[SAMPLES_MIN, ""] == low  # the minimum since start


def test_a_share_samples_the_same_texts_whatever_their_batch(unseen_model, bf16_cpu):
    handler, context = make_handler(unseen_model, max_length=128, dtype="bfloat16", fidelity_sample=0.5)
    texts = [f"text number {i}" for i in range(24)]
    chosen = [sampled(np.array(e.ids), 0.5) for e in handler.tokenizer.encode(texts)]
    assert 4 <= sum(chosen) <= 20
    serve(handler, context, [{"body": {"texts": texts}}])
    assert sample_metrics(context)[f"{SAMPLES}_count", ""] == sum(chosen)
    context.metrics.added.clear()
    serve(handler, context, [{"body": {"text": t}} for t in reversed(texts)])
    assert sample_metrics(context)[f"{SAMPLES}_count", ""] == sum(chosen)


def test_shadow_checks_start_with_serving_not_with_calibration(unseen_model, bf16_cpu, caplog):
    """Calibration's timed passes are no served texts: the first call's samples are its own texts only."""
    with caplog.at_level(logging.INFO):
        handler, context = make_handler(
            unseen_model, max_length=32, dtype="bfloat16", fidelity_sample=1.0, cost={"calibrate": True}
        )
    assert "shadow-checking a share of 1 of served texts in float32" in caplog.text  # the ready line says so
    serve(handler, context, [{"body": {"texts": ["one", "two"]}}])
    assert sample_metrics(context)[f"{SAMPLES}_count", ""] == 2
