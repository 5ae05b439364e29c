"""A tokenized text as a pass takes it (`Encoded`: its ids, special tokens included, and what its request asked of
it), a text's tokens cut to a shorter length as the tokenizer would cut them, and the padded arrays of a pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class Encoded:
    """One tokenized text: its ids (special tokens included) and whether max_length cut it. `unbounded`: a text
    too long to read whose first `max_cut_chars` characters did not settle its tokens (no ids; refused)."""

    ids: tuple[int, ...]
    truncated: bool
    unbounded: bool = False
    skip: int = 0  # leading tokens (a prompt's, with the first special token) the pooling leaves out
    type_ids: tuple[int, ...] | None = None  # a text pair's token types (None: all 0, a single text)
    attention: tuple[int, ...] | None = None  # the row's attention mask where not all ones (query expansion)
    input_type: str | None = None  # its request's query/document choice (a sparse Router's route)
    max_active: int | None = None  # a sparse answer's cut its request asked (max_active_dims; None: the model's)
    outputs: tuple[str, ...] = ()  # the outputs its request renders (BGE-M3: what its answer keeps; (): every one)
    chunks: tuple[Encoded, ...] = ()  # `on_overflow: chunk`, a text over max_length: its windows, each a row
    weights: tuple[int, ...] = ()  # the text's own tokens in each of its windows
    chunking: bool = False  # its request pools windows (`on_overflow: chunk`): its answer says `chunks`
    spans: tuple[tuple[int, int], ...] | None = None  # late chunking: its character spans (None: off)
    pools: tuple[tuple[int, ...], ...] = ()  # late chunking: the positions of each span's tokens in `ids`


def recut(encoded: Encoded, length: int, specials: tuple[int, int], left: bool = False) -> Encoded:
    """Tokens cut to `length` as the tokenizer cuts a text at that max_length: its own tokens (between the leading
    and trailing special tokens) cut, the special tokens kept."""
    if len(encoded.ids) <= length:
        return encoded
    head, tail = specials
    body = encoded.ids[head : len(encoded.ids) - tail]
    room = max(length - head - tail, 0)
    kept = body[len(body) - room :] if left else body[:room]
    return replace(encoded, ids=encoded.ids[:head] + kept + encoded.ids[len(encoded.ids) - tail :], truncated=True)


def collate(rows: Sequence[Sequence[int]], padded_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Pad rows to `padded_len`: int64 ids and attention mask, [rows, padded_len]."""
    ids = np.full((len(rows), padded_len), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), padded_len), dtype=np.int64)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = row
        mask[r, : len(row)] = 1
    return ids, mask
