"""Seeded, offline text workloads with realistic token-length distributions (pure: no model, no I/O).

Texts are made of common English words that are single WordPiece tokens in BERT's uncased vocabulary, with
sentence punctuation, so a text of `n` target tokens tokenizes to about `n` tokens ([CLS] and [SEP] included).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from model_store.archives import SERVED

WORDS = tuple(
    """
    the of and to in is was for on that with as by at from his her they this which are be have had not were
    but one all their an has been more also when who will there can its after first new other some time into
    two only would her most them may city over such three year years made many these during team between
    about world under state while then where him both later before system work well school season through
    family number used known life since film part high national based called music during own each four
    five game group people history against early several second local however public war area including
    government final country major old series team album river million small same another among order left
    member young house club water power station church league village population form place home name land
    police party center service council company court university student market model server request answer
    short long text query passage batch worker queue length token memory speed cost network data
    report result value table figure plan price light night morning evening road street bridge garden field
    forest mountain island lake sea coast valley north south east west winter summer spring autumn river
    doctor teacher writer player leader officer artist farmer driver worker engineer scientist manager
    building library museum hospital theater market office airport harbor castle tower temple palace
    simple quick large strong clear open free full real true good great best better little big small
    """.split()
)

SHORT = (6, 14)
SENTENCE_MEAN, SENTENCE_SD, SENTENCE_RANGE = 25.0, 6.0, (12, 45)
PASSAGE = (80, 200)
LONGTAIL_MEDIAN, LONGTAIL_SIGMA = 28.0, 1.44  # measured traffic: median 28, p90 about 177 tokens
MIN_TOKENS = 4

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


def text_of(tokens: int, rng: random.Random) -> str:
    """A text of sentences that tokenizes to `tokens` tokens, [CLS] and [SEP] included."""
    budget = max(1, tokens - 2)
    sentences: list[str] = []
    while budget > 0:
        # a sentence of k words and a period costs k + 1 tokens
        k = min(budget - 1, rng.randint(6, 18)) if budget > 1 else 0
        words = [rng.choice(WORDS) for _ in range(max(k, 1))]
        if k == 0:
            sentences.append(words[0])
            break
        words[0] = words[0].capitalize()
        sentences.append(" ".join(words) + ".")
        budget -= k + 1
    return " ".join(sentences)


def _sampler(name: str, max_length: int, short_frac: float) -> Callable[[random.Random], int]:
    def short(rng: random.Random) -> int:
        return rng.randint(*SHORT)

    def passage(rng: random.Random) -> int:
        return rng.randint(*PASSAGE)

    def sentence(rng: random.Random) -> int:
        return int(min(max(round(rng.gauss(SENTENCE_MEAN, SENTENCE_SD)), SENTENCE_RANGE[0]), SENTENCE_RANGE[1]))

    def mixed(rng: random.Random) -> int:
        return short(rng) if rng.random() < short_frac else passage(rng)

    def longtail(rng: random.Random) -> int:
        return int(
            min(max(round(rng.lognormvariate(math.log(LONGTAIL_MEDIAN), LONGTAIL_SIGMA)), MIN_TOKENS), max_length)
        )

    samplers = {"short": short, "sentences": sentence, "passages": passage, "mixed": mixed, "longtail": longtail}
    if name not in samplers:
        raise ValueError(f"unknown workload {name!r}; allowed: {', '.join(WORKLOADS)}")
    return samplers[name]


def make_workload(
    name: str, n: int, seed: int = 0, short_frac: float = 0.5, max_length: int = SERVED.max_length
) -> Workload:
    """`n` texts of workload `name`, the same for the same arguments."""
    if not 0.0 <= short_frac <= 1.0:
        raise ValueError(f"short_frac: got {short_frac}; allowed: 0 to 1")
    rng = random.Random(f"{name}:{seed}:{short_frac}")
    sample = _sampler(name, max_length, short_frac)
    targets = [min(sample(rng), max_length) for _ in range(n)]
    texts = tuple(text_of(t, rng) for t in targets)
    return Workload(name, texts, tuple(targets), seed, short_frac if name == "mixed" else None)


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
