"""bench.inputs.workloads: generated texts per seed and distribution, and the rerank requests."""

from __future__ import annotations

import statistics

import pytest

from bench.inputs.workloads import WORDS, WORKLOADS, make_workload, text_of


@pytest.mark.parametrize("name", WORKLOADS)
def test_workloads_are_deterministic_per_seed(name):
    assert make_workload(name, 50, seed=3) == make_workload(name, 50, seed=3)
    assert make_workload(name, 50, seed=3).texts != make_workload(name, 50, seed=4).texts


@pytest.mark.parametrize(
    "name, low, high",
    [("short", 8, 12), ("sentences", 22, 28), ("passages", 130, 150), ("longtail", 45, 80)],
)
def test_workload_means_match_their_distribution(name, low, high):
    targets = make_workload(name, 2000, seed=0).target_tokens
    assert low <= statistics.mean(targets) <= high
    assert max(targets) <= 256 and min(targets) >= 4


def test_longtail_is_long_tailed():
    targets = sorted(make_workload("longtail", 4000, seed=0).target_tokens)
    median, p90 = targets[2000], targets[3600]
    assert 22 <= median <= 34 and p90 >= 4 * median


def test_mixed_short_fraction():
    targets = make_workload("mixed", 4000, seed=0, short_frac=0.3).target_tokens
    assert sum(t <= 14 for t in targets) / len(targets) == pytest.approx(0.3, abs=0.03)
    with pytest.raises(ValueError, match="short_frac"):
        make_workload("mixed", 1, short_frac=1.5)


def test_texts_are_words_with_the_target_token_count():
    import random

    rng = random.Random(0)
    for tokens in (3, 4, 10, 57, 200):
        text = text_of(tokens, rng)
        pieces = text.replace(".", " .").split()
        assert len(pieces) + 2 == tokens
        assert all(p == "." or p.lower() in WORDS for p in pieces)


def test_minilm_tokenizes_workloads_to_their_targets(minilm_dir):
    from bucketing.model.tokenizer import Tokenizer

    w = make_workload("longtail", 200, seed=1)
    real = [len(e.ids) for e in Tokenizer(str(minilm_dir), 256).encode(w.texts)]
    assert all(0 <= r - t <= 4 for r, t in zip(real, w.target_tokens, strict=True))


def test_rerank_requests_are_a_short_query_and_long_tail_documents():
    from bench.inputs.workloads import rerank_requests

    requests = rerank_requests(5, docs_per_request=20, seed=1)
    assert len(requests) == 5 and all(len(docs) == 20 for _, docs in requests)
    assert requests == rerank_requests(5, docs_per_request=20, seed=1)  # seeded
    assert max(len(q.split()) for q, _ in requests) < min(max(len(d.split()) for d in docs) for _, docs in requests)


def test_the_sparse_workload_sends_the_long_tail_texts():
    from bench.inputs.workloads import BENCH_WORKLOADS, NOT_EMBEDDINGS, TEXTS_OF

    assert "sparse" in BENCH_WORKLOADS and TEXTS_OF["sparse"] == "longtail"
    assert set(NOT_EMBEDDINGS) == {"rerank", "sparse"}  # no peer, tune, exact-length grouping or cosine check
