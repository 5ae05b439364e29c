"""Seeded, offline text workloads with realistic token-length distributions (pure: no model, no I/O).

Texts are made of common English words that are single WordPiece tokens in BERT's uncased vocabulary, with
sentence punctuation, so a text of `n` target tokens tokenizes to about `n` tokens ([CLS] and [SEP] included): the
generator is the archive builder's (`model_store.calibration_texts`, whose default calibration texts are this
module's long-tail texts, seed 0).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from model_store.archives import SERVED
from model_store.calibration_texts import WORDS, generate, longtail_sampler, text_of

__all__ = ["WORDS", "text_of"]  # the generator's, read here (and by the tests) as the workloads' own

SHORT = (6, 14)
SENTENCE_MEAN, SENTENCE_SD, SENTENCE_RANGE = 25.0, 6.0, (12, 45)
PASSAGE = (80, 200)

WORKLOADS = ("short", "sentences", "passages", "mixed", "longtail")  # texts, one a request (`make_workload`)
RERANK = "rerank"  # a request: one short query and `docs_per_request` long-tail documents (text pairs)
SPARSE = "sparse"  # a request: one long-tail text, to a SPLADE model (sparse answers)
LONG = "long"  # a request: one document of 1k-8k tokens, answered whole, chunked and late-chunked (kind `long`)
BENCH_WORKLOADS = (*WORKLOADS, RERANK, SPARSE, LONG)  # what `bench/compare.py --workload` takes
NOT_EMBEDDINGS = (RERANK, SPARSE)  # answers are not dense embeddings: no peer, tune, exact-length or cosine check
TEXTS_OF = {SPARSE: "longtail"}  # a workload that sends another's generated texts
DOCS_PER_REQUEST = 20
LONG_TOKENS = (1000, 8000)  # the long workload's document lengths, special tokens included
LONG_DOCS = 16


@dataclass(frozen=True)
class Workload:
    """Texts to send, in order, with the token count each was generated for."""

    name: str
    texts: tuple[str, ...]
    target_tokens: tuple[int, ...]
    seed: int
    short_frac: float | None = None

    @property
    def label(self) -> str:
        return self.name if self.short_frac is None else f"{self.name}(short_frac={self.short_frac:g})"


def _sampler(name: str, max_length: int, short_frac: float) -> Callable[[random.Random], int]:
    def short(rng: random.Random) -> int:
        return rng.randint(*SHORT)

    def passage(rng: random.Random) -> int:
        return rng.randint(*PASSAGE)

    def sentence(rng: random.Random) -> int:
        return int(min(max(round(rng.gauss(SENTENCE_MEAN, SENTENCE_SD)), SENTENCE_RANGE[0]), SENTENCE_RANGE[1]))

    def mixed(rng: random.Random) -> int:
        return short(rng) if rng.random() < short_frac else passage(rng)

    samplers = {
        "short": short,
        "sentences": sentence,
        "passages": passage,
        "mixed": mixed,
        "longtail": longtail_sampler(max_length),
    }
    if name not in samplers:
        raise ValueError(f"unknown workload {name!r}; allowed: {', '.join(WORKLOADS)}")
    return samplers[name]


def make_workload(
    name: str, n: int, seed: int = 0, short_frac: float = 0.5, max_length: int = SERVED.max_length
) -> Workload:
    """`n` texts of workload `name`, the same for the same arguments."""
    if not 0.0 <= short_frac <= 1.0:
        raise ValueError(f"short_frac: got {short_frac}; allowed: 0 to 1")
    sample = _sampler(name, max_length, short_frac)
    texts, targets = generate(name, n, seed, short_frac, sample, max_length)
    return Workload(name, texts, targets, seed, short_frac if name == "mixed" else None)


def rerank_requests(
    n: int, docs_per_request: int = DOCS_PER_REQUEST, seed: int = 0
) -> list[tuple[str, tuple[str, ...]]]:
    """`n` rerank requests: a short query and `docs_per_request` documents of long-tail lengths each."""
    queries = make_workload("short", n, seed).texts
    documents = make_workload("longtail", n * docs_per_request, seed).texts
    return [(q, documents[i * docs_per_request : (i + 1) * docs_per_request]) for i, q in enumerate(queries)]


def long_documents(
    n: int = LONG_DOCS, seed: int = 0, low: int = LONG_TOKENS[0], high: int = LONG_TOKENS[1]
) -> Workload:
    """`n` documents of `low` to `high` tokens ([CLS] and [SEP] included), the same for the same arguments: one
    length drawn in each of `n` equal slices of the range (spread over it, none twice), in a shuffled order; each
    document the bench's passages (`PASSAGE` tokens each, `text_of`) joined as paragraphs by a blank line, which
    costs no token."""
    if not 1 <= n or not 2 < low <= high:
        raise ValueError(f"long documents: got n={n}, {low} to {high} tokens; allowed: n >= 1, 3 <= low <= high")
    rng = random.Random(f"{LONG}:{seed}")
    width = (high - low) / n
    targets = [min(high, int(low + (k + rng.random()) * width)) for k in range(n)]
    rng.shuffle(targets)
    return Workload(LONG, tuple(_document(t, rng) for t in targets), tuple(targets), seed)


def _document(tokens: int, rng: random.Random) -> str:
    """Paragraphs of `PASSAGE` tokens each (the last one what is left, at least a short text's) holding `tokens`
    tokens in all, [CLS] and [SEP] counted once."""
    left, paragraphs = tokens - 2, []
    while left > 0:
        own = rng.randint(*PASSAGE) - 2
        own = left if left - own < SHORT[1] else own
        paragraphs.append(text_of(own + 2, rng))
        left -= own
    return "\n\n".join(paragraphs)
