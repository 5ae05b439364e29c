"""Long texts. `on_overflow: chunk`: where a long text's windows lie, and how their vectors become one; late
chunking: a text's sentences, and which of its tokens each character span holds. Pure.

A text over max_length is split into windows of its own tokens, `tokens` each (the last may hold fewer), each
starting `tokens - overlap` after the one before, the last ending at the text's end; each window is run as its own
row (wrapped in the special tokens and the prompt, as a text is) and pooled as the model pools, and the text's vector
is the mean of its windows' pooled vectors weighted by the text's own tokens in each (`pool`), then normalised as any
embedding is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Windows:
    """How a text is cut: `tokens` of its own per window, `overlap` repeated from the window before, at most
    `most` windows."""

    tokens: int
    overlap: int
    most: int

    @property
    def stride(self) -> int:
        """Tokens between the starts of two windows."""
        return self.tokens - self.overlap

    @property
    def reach(self) -> int:
        """The most tokens of a text `most` windows hold: a text with more is refused."""
        return (self.most - 1) * self.stride + self.tokens

    def spans(self, length: int) -> list[tuple[int, int]]:
        """The `[start, end)` of each window over a text of `length` own tokens (one empty span for none)."""
        if self.stride < 1:
            raise ValueError(f"a window of {self.tokens} tokens cannot overlap the one before by {self.overlap}")
        starts = [0]
        while starts[-1] + self.tokens < length:
            starts.append(starts[-1] + self.stride)
        return [(s, min(s + self.tokens, length)) for s in starts]


def pool(vectors: Sequence[np.ndarray], weights: Sequence[int]) -> np.ndarray:
    """The windows' vectors averaged, each weighted by its text tokens (summed in float64), as float32."""
    stacked = np.asarray(vectors, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    return np.asarray((w[:, None] * stacked).sum(axis=0) / w.sum(), dtype=np.float32)


# Late chunking's "sentences": a run of sentence-ending marks before white space or the end, a CJK full stop, or a
# newline ends a sentence; each span is trimmed of white space, and empty ones dropped.
SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)|[\u3002\uff01\uff1f]+|\n")


def sentences(text: str) -> list[tuple[int, int]]:
    """The `[start, end)` character spans of a text's sentences (`SENTENCE_END`), in order."""
    cuts = [m.end() for m in SENTENCE_END.finditer(text)]
    out = []
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if a < b:
            out.append((a, b))
    return out


def span_tokens(
    offsets: Sequence[tuple[int, int]], special: Sequence[bool], shift: int, spans: Sequence[tuple[int, int]]
) -> tuple[tuple[int, ...], ...]:
    """For each character span of a text, the positions of its tokens: those whose character offsets (in the text
    after a prompt of `shift` characters; trimmed of leading white space, `Tokenizer.offsets`) lie inside
    `[start, end)`; special and prompt tokens, and tokens of white space alone (empty), are in none."""
    own = [(k, a - shift, b - shift) for k, ((a, b), s) in enumerate(zip(offsets, special)) if not s and shift <= a < b]
    return tuple(tuple(k for k, a, b in own if start <= a and b <= end) for start, end in spans)
