"""The build's default calibration texts, and the seeded text generator they come from (pure: no model, no I/O).

Texts are made of common English words that are single WordPiece tokens in BERT's uncased vocabulary, with
sentence punctuation, so a text of `n` target tokens tokenizes to about `n` tokens ([CLS] and [SEP] included).
The bench's workloads (`bench/inputs/workloads.py`) are drawn by the same generator (`generate`), so the default
calibration texts are the bench's long-tail texts (seed 0), bit for bit; the bench reads this module, never the
other way round.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

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

LONGTAIL = "longtail"
LONGTAIL_MEDIAN, LONGTAIL_SIGMA = 28.0, 1.44  # measured traffic: median 28, p90 about 177 tokens
MIN_TOKENS = 4
DEFAULT_TEXTS = 128  # the build's default calibration texts: this many long-tail texts (seed 0)
DEFAULT_SHORT_FRAC = 0.5  # part of a generated workload's seed (`generate`), whatever its distribution
DESCRIPTION = (  # how the build line names them
    "the bench's long-tail texts (model_store/calibration_texts.py, seed 0; --calibration-texts FILE for your own)"
)

Sampler = Callable[[random.Random], int]  # a text's target tokens, drawn from the workload's generator


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


def longtail_sampler(max_length: int) -> Sampler:
    """The long-tail distribution of real traffic (log-normal: median 28 tokens, a tail cut at `max_length`)."""

    def longtail(rng: random.Random) -> int:
        return int(
            min(max(round(rng.lognormvariate(math.log(LONGTAIL_MEDIAN), LONGTAIL_SIGMA)), MIN_TOKENS), max_length)
        )

    return longtail


def generate(
    name: str, n: int, seed: int, short_frac: float, sample: Sampler, max_length: int
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """`n` texts of workload `name` and the token count each was generated for, the same for the same arguments:
    each target drawn by `sample` (cut at `max_length`), then each text, from one generator seeded by the name, the
    seed and the short fraction."""
    rng = random.Random(f"{name}:{seed}:{short_frac}")
    targets = [min(sample(rng), max_length) for _ in range(n)]
    texts = tuple(text_of(t, rng) for t in targets)
    return texts, tuple(targets)


def default_texts(n: int = DEFAULT_TEXTS, max_length: int = SERVED.max_length) -> list[str]:
    """The build's calibration texts when none are given: `n` long-tail texts, seed 0 (the bench's `longtail`
    workload: median 28 tokens, a tail to max_length)."""
    texts, _ = generate(LONGTAIL, n, 0, DEFAULT_SHORT_FRAC, longtail_sampler(max_length), max_length)
    return list(texts)
