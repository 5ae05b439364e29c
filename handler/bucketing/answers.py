"""What the model answered for one input (`Answer`), and what a request asked of its answers (`Options`): the one
type the kinds' tasks make and every wire format (`protocols`) reads."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bucketing.quantize import PRECISIONS, Ranges

ACTIVATIONS = ("softmax", "sigmoid", "identity")  # how a classifier's logits become its scores


def activate(logits: Any, activation: str) -> list[float]:
    """A classifier's scores from its logits: softmax over labels, sigmoid per label, or the logits themselves."""
    x = [float(v) for v in logits]
    if activation == "identity":
        return x
    if activation == "sigmoid":
        return [1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v)) for v in x]
    top = max(x)
    exp = [math.exp(v - top) for v in x]
    return [e / sum(exp) for e in exp]


@dataclass(frozen=True, eq=False)
class SparseRow:
    """A vocabulary-size vector kept as its non-zeros: a sparse model's row, made so right after its pass, so a batch
    holds no vocabulary-size row while the rest of it runs (2,048 short texts held 273 MB of rows until answered)."""

    indices: Any  # int32, ascending; None: `values` is the whole vector (over half of it is non-zero)
    values: Any  # float32, one per index
    size: int  # the vector's length (the vocabulary's)

    @classmethod
    def of(cls, row: Any, keep: int | None = None) -> SparseRow:
        """A dense 1-D row as the most its answer can render: its `keep` largest (`keep_top`, as its answer will cut
        it; None: every non-zero), as indices and values where that is smaller than the row."""
        if keep is not None and np.count_nonzero(row) > keep:
            row = keep_top(row, keep)
        indices = np.flatnonzero(row)
        if 2 * len(indices) > row.shape[-1]:
            return cls(None, np.array(row, dtype=np.float32), int(row.shape[-1]))
        return cls(indices.astype(np.int32), np.array(row[indices], dtype=np.float32), int(row.shape[-1]))

    @property
    def active(self) -> int:
        """Its non-zeros."""
        return int(np.count_nonzero(self.values)) if self.indices is None else len(self.indices)

    def dense(self) -> Any:
        """The vector, vocabulary-size again (one at a time, while its answer is rendered)."""
        if self.indices is None:
            return self.values
        out = np.zeros(self.size, dtype=np.float32)
        out[self.indices] = self.values
        return out


@dataclass(frozen=True)
class Answer:
    """The result for one input: the model's vector (an embedding before normalisation, or a classifier's
    logits) and its tokens."""

    values: Any  # a 1-D float32 numpy array
    tokens: int
    truncated: bool
    labels: tuple[str, ...] | None = None  # class names (classification); None for embeddings
    activation: str = "softmax"  # classification: how the logits become scores (ACTIVATIONS)
    normalize: bool = False  # embeddings: L2-normalised unless a request says otherwise
    sparse: bool = False  # a sparse model's: `values` is the vocabulary-size vector
    max_active_dims: int | None = None  # sparse: the model's cut (its config_sentence_transformers.json)
    chunks: int | None = None  # under `on_overflow: chunk`: the windows its vector pools (1: the text fit)
    spans: tuple[tuple[int, int], ...] | None = None  # late chunking: the character spans, one row of `values` each
    truncate_dim: int | None = None  # embeddings: the model's cut, as sentence-transformers' (not re-normalised)

    def sparse_vector(self, max_active_dims: int | None = None) -> tuple[list[int], list[float]]:
        """A sparse answer's non-zero ids (ascending) and their values, cut to the request's max_active_dims (else
        the model's) as sentence-transformers cuts them."""
        row = self.values.dense() if isinstance(self.values, SparseRow) else np.asarray(self.values, dtype=np.float32)
        k = max_active_dims if max_active_dims is not None else self.max_active_dims
        if k is not None and np.count_nonzero(row) > k:
            row = keep_top(row, k)
        ids = np.flatnonzero(row)
        return ids.tolist(), row[ids].tolist()

    def vector(self, dimensions: int | None = None, normalize: bool | None = None) -> Any:
        """The embedding as answered: its first `dimensions` components, L2-normalised (after the cut) when
        `normalize` says so (None: the model's default). Neither asked, the model's `truncate_dim` cuts it as
        sentence-transformers does: after its normalisation, not re-normalised."""
        vector = np.asarray(self.values, dtype=np.float32)
        if dimensions is None and normalize is None and self.truncate_dim is not None and self.normalize:
            return (vector / np.maximum(np.linalg.norm(vector), np.float32(1e-12)))[: self.truncate_dim]
        vector = vector[: dimensions or self.truncate_dim]
        if self.normalize if normalize is None else normalize:
            vector = vector / np.maximum(np.linalg.norm(vector), np.float32(1e-12))
        return vector

    def renormalizes(self, dimensions: int | None = None, normalize: bool | None = None) -> bool:
        """Whether `vector` L2-normalises what it answers after any cut (as `vector` decides it)."""
        if dimensions is None and normalize is None and self.truncate_dim is not None and self.normalize:
            return False
        return self.normalize if normalize is None else normalize

    def in_precision(self, vector: Any, options: Options, precision: str | None = None) -> Any:
        """`vector` (this answer's, as `options` asked it) in `precision` (None: the options'): int8/uint8 with
        the ranges of what is quantized (`quantize.Ranges.fit`: a re-normalised cut's own)."""
        p = PRECISIONS[precision or options.precision]
        ranges = options.ranges
        if p.ranged and isinstance(ranges, Ranges):
            ranges = ranges.fit(len(vector), self.renormalizes(options.dimensions, options.normalize))
        return p.apply(vector, ranges)

    def numbers(self, options: Options | None = None) -> int:
        """How many numbers the answer renders (its vectors' components, a sparse answer's ids and values, a
        classifier's scores), known before it is rendered: what bounds its size from below (`least_bytes`)."""
        o = options or Options()
        if self.sparse:
            values = self.values
            active = values.active if isinstance(values, SparseRow) else int(np.count_nonzero(values))
            cut = o.max_active_dims if o.max_active_dims is not None else self.max_active_dims
            return 2 * (active if cut is None else min(active, cut))
        if self.labels is not None:
            return 2 * len(self.labels)
        rows = len(self.spans) if self.spans is not None else 1
        width = int(np.shape(self.values)[-1]) if np.ndim(self.values) else 1
        return rows * min(width, o.dimensions or self.truncate_dim or width)

    def fields(self, options: Options | None = None) -> dict[str, Any]:
        """Our native answer object: `embedding`; or a one-label model's `score`; or `label` (the top one) and
        `scores` by label; then `tokens`, under `on_overflow: chunk` `chunks`, and `truncated` (`kinds.answer_fields`
        names them). `options`: the request's."""
        o = options or Options()
        if self.sparse:
            indices, values = self.sparse_vector(o.max_active_dims)
            head: dict[str, Any] = {"embedding": {"indices": indices, "values": values}}
        elif self.spans is not None:
            vectors = [replace(self, values=row, spans=None).vector(o.dimensions, o.normalize) for row in self.values]
            head = {
                "chunks": [
                    {"span": list(span), "embedding": self.in_precision(v, o).tolist()}
                    for span, v in zip(self.spans, vectors)
                ]
            }
        elif self.labels is None:
            vector = self.vector(o.dimensions, o.normalize)
            head = {"embedding": self.in_precision(vector, o).tolist()}
        else:
            scores = activate(self.values, "identity" if o.raw_scores else self.activation)
            if len(self.labels) == 1:
                head = {"score": scores[0]}
            else:
                best = max(range(len(scores)), key=scores.__getitem__)
                head = {"label": self.labels[best], "scores": dict(zip(self.labels, scores))}
        chunks = {} if self.chunks is None else {"chunks": self.chunks}
        return {**head, "tokens": self.tokens, **chunks, "truncated": self.truncated}


@dataclass(frozen=True)
class Options:
    """What a request may ask of its answers besides its inputs (each wire format reads its own fields)."""

    normalize: bool | None = None  # None: the model's default
    dimensions: int | None = None  # keep the first components (then re-normalised if normalised)
    raw_scores: bool = False  # classification: logits instead of scores
    prompt: str = ""  # put before each text (a named prompt of the model's, resolved; or the request's own)
    truncate: bool | None = None  # a text over max_length: cut (true) or a 413 (false); None: handler.on_overflow
    chunk: bool = False  # a text over max_length: split into windows, their vectors pooled (`on_overflow: chunk`)
    truncation_direction: str = "right"  # which end of a text over max_length is cut: right or left
    input_type: str | None = None  # "query" | "document": as encode_query / encode_document; None: as encode()
    max_active_dims: int | None = None  # sparse: keep this many non-zeros (None: the model's max_active_dims)
    precision: str = "float"  # a dense embedding's values: float32, or packed as `quantize.PRECISIONS` says
    ranges: Ranges | None = field(default=None, compare=False)  # int8/uint8: the model's fixed ranges
    spans: Any = None  # late chunking: "sentences", or one text's ((start, end), ...) character spans; None: off
    outputs: tuple[str, ...] = ()  # a multi-output model's (BGE-M3) outputs asked (`protocols.outputs`); (): dense
    sparse_tokens: bool = False  # with its sparse output, each id's token string


def least_bytes(answers: Sequence[Answer], options: Options) -> int:
    """The fewest bytes the answers can render to in any format (`numbers_bytes`)."""
    return numbers_bytes(sum(a.numbers(options) for a in answers), options)


def numbers_bytes(numbers: int, options: Options) -> int:
    """The fewest bytes `numbers` numbers render to in any format: each at least 4 bytes as a float (`0.0,` in
    JSON, 4 in a binary FP32 tensor, more in base64), 1 in an integer precision (an INT8 tensor's byte), an eighth
    where 8 components pack into one (binary, ubinary)."""
    precision = PRECISIONS[options.precision]
    each = 0.125 if precision.packed else 1.0 if precision.ranged else 4.0
    return int(each * numbers)


def keep_top(row: Any, k: int) -> Any:
    """The row with all but its k largest absolute values set to zero, by torch's top-k (its order among equal
    values is torch's), as sentence-transformers' `select_max_active_dims` keeps them."""
    import torch

    vector = torch.from_numpy(np.ascontiguousarray(row, dtype=np.float32))
    _, top = torch.topk(torch.abs(vector), k=min(k, vector.shape[-1]), dim=-1)
    kept = torch.zeros_like(vector)
    kept.scatter_(-1, top, vector.gather(-1, top))
    return kept.numpy()
