"""BGE-M3 (`handler.task: bgem3`): dense, sparse and ColBERT outputs of one forward pass, each as FlagEmbedding 1.4's
`BGEM3FlagModel.encode(return_dense=..., return_sparse=..., return_colbert_vecs=...)` answers it (the folder is read in
`folder`, the graph is `heads.M3Head`).

Every pass computes all three (the heads are two small layers over the encoder's states); right after it, each row
keeps those its request renders (`Encoded.outputs`, `Rows.outputs`; a request of 2,048 texts asking dense alone held
every pass's packed output until it was answered: +1.7 GB), and a request's `outputs` picks what its wire format
renders (`protocols.outputs`):
- dense: the CLS hidden state, L2-normalised (a request's `normalize`/`dimensions` as FlagEmbedding's
  `normalize_embeddings`/`truncate_dim`: cut, then normalised);
- sparse: `_process_token_weights`: each token's weight, the largest per token id, only positive ones, the tokenizer's
  cls, eos, pad and unk tokens dropped; ids ascending (`{"indices", "values"}`), with `sparse_tokens` each id's
  string as `convert_id_to_token` decodes it;
- colbert: `_process_colbert_vecs`: one vector per token after the first, L2-normalised (cut to `dimensions` first,
  as `truncate_dim` cuts them).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from bucketing.answers import Answer, Options
from bucketing.kinds.bgem3.folder import M3Spec, is_bgem3, read_bgem3
from bucketing.kinds.task import Rows, TaskHooks
from bucketing.model.chain import Chain
from bucketing.model.encoded import Encoded

NAME = "bgem3"
DEFAULT_OUTPUTS = ("dense",)  # `protocols.outputs.DEFAULT`
# FlagEmbedding drops these from the lexical weights (`_process_token_weights`: special_tokens_map's entries).
UNUSED_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")


def normalized(rows: Any) -> Any:
    """Each row L2-normalised as torch's `F.normalize` does (over a norm of at least 1e-12)."""
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    return rows / np.maximum(norms, np.float32(1e-12))


@dataclass(frozen=True)
class M3Answer(Answer):
    """One text's three outputs: `values` the CLS hidden state (the dense output before normalisation), its token
    ids and their weights, and its ColBERT vectors (before normalisation)."""

    ids: tuple[int, ...] = ()
    weights: Any = None  # [tokens] float32: each token's lexical weight
    colbert: Any = None  # [tokens - 1, colbert_dim] float32
    unused: frozenset[int] = frozenset()  # the ids FlagEmbedding leaves out of the lexical weights
    decode: Any = field(default=None, compare=False)  # id -> its string, as convert_id_to_token decodes it

    def lexical(self) -> dict[int, float]:
        """FlagEmbedding's lexical weights: {id: the id's largest positive weight}, special tokens left out."""
        out: dict[int, float] = {}
        for token, weight in zip(self.ids, np.asarray(self.weights, dtype=np.float32).tolist()):
            if token not in self.unused and weight > 0 and weight > out.get(token, 0.0):
                out[token] = weight
        return out

    def sparse_vector(self, max_active_dims: int | None = None) -> tuple[list[int], list[float]]:
        """The lexical weights as a sparse answer: ids ascending and their weights (what TEI's /embed_sparse and
        the sparse output carry); no cut (FlagEmbedding has none)."""
        weights = self.lexical()
        ids = sorted(weights)
        return ids, [weights[i] for i in ids]

    def vectors(self, options: Options | None = None) -> Any:
        """The ColBERT vectors [tokens - 1, colbert_dim]: cut to `dimensions`, normalised unless asked otherwise."""
        o = options or Options()
        rows = np.asarray(self.colbert, dtype=np.float32)[:, : o.dimensions]
        return normalized(rows) if (self.normalize if o.normalize is None else o.normalize) else rows

    def numbers(self, options: Options | None = None) -> int:
        """The asked outputs' numbers, counted before any is rendered (the lexical weights: ids and values)."""
        o = options or Options()
        count = 0
        for output in o.outputs or DEFAULT_OUTPUTS:
            if output == "dense":
                width = int(np.shape(self.values)[-1])
                count += min(width, o.dimensions or width)
            elif output == "sparse":
                count += 2 * len(self.lexical())
            elif output == "colbert":
                rows, width = np.shape(self.colbert)
                count += int(rows) * min(int(width), o.dimensions or int(width))
        return count

    def fields(self, options: Options | None = None) -> dict[str, Any]:
        """Our native answer object: `embedding` (dense), `sparse` ({"indices", "values"}, with `sparse_tokens`
        "tokens" too), `colbert` (an array [vectors, dim]), as the request's `outputs` ask; then `tokens` and
        `truncated`."""
        o = options or Options()
        head: dict[str, Any] = {}
        for output in o.outputs or DEFAULT_OUTPUTS:
            if output == "dense":
                vector = self.vector(o.dimensions, o.normalize)
                head["embedding"] = self.in_precision(vector, o).tolist()
            elif output == "sparse":
                indices, values = self.sparse_vector()
                head["sparse"] = {"indices": indices, "values": values}
                if o.sparse_tokens:
                    head["sparse"]["tokens"] = [self.decode(i) for i in indices]
            elif output == "colbert":
                head["colbert"] = self.vectors(o)  # one array to the wire format: its lists where it writes JSON
        return {**head, "tokens": self.tokens, "truncated": self.truncated}


@dataclass(frozen=True)
class M3Row:
    """One row's outputs after its pass: the CLS state, and its lexical weights and ColBERT vectors where its
    request renders them (else empty)."""

    values: np.ndarray  # [hidden]
    weights: np.ndarray  # [tokens] or [0]
    colbert: np.ndarray  # [tokens - 1, colbert_dim] or [0, colbert_dim]


class BgeM3Task(TaskHooks):
    """BGE-M3's packed per-token output (`heads.M3Head`) per row, one answer per text holding all three outputs."""

    name = NAME
    labels = None
    chunk_refusal = (
        "is not served for a BGE-M3 model: FlagEmbedding answers its dense, sparse and ColBERT outputs of one pass "
        "over a text's first max_length tokens, never of windows"
    )
    late_refusal = "is not served for a BGE-M3 model (FlagEmbedding has no late chunking)"

    @staticmethod
    def detects(folder: Path | str) -> bool:
        return is_bgem3(folder)

    @staticmethod
    def load(config: Any, model_dir: str, gpu_id: Any = None) -> BgeM3Task:
        """Its head on the configured engine (float32: its kind refuses others)."""
        from bucketing.engines import load_engine
        from bucketing.kinds.embedding import normalizes

        engine, info = load_engine(config, model_dir, gpu_id)
        return BgeM3Task(engine, info, read_bgem3(model_dir), normalizes(config.normalize, info.chain), model_dir)

    @staticmethod
    def read_settings(folder: Path) -> Chain:
        return read_bgem3(folder).chain

    @staticmethod
    def describe(folder: Path) -> dict[str, Any] | None:
        return read_bgem3(folder).describe()

    @staticmethod
    def load_head(model_dir: str, attention: str | None = None) -> tuple[Any, Any]:
        from bucketing.kinds.bgem3.heads import load_m3_head

        return load_m3_head(model_dir, attention)

    def __init__(self, engine: Any, info: Any, spec: M3Spec, normalize: bool, model_dir: str) -> None:
        from transformers import AutoTokenizer

        self.engine = engine
        self.max_positions = info.max_positions
        self.dimensions = spec.hidden_size
        self.spec = spec
        self.chain = spec.chain
        self.normalize = normalize
        tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
        specials: dict[str, Any] = dict(tokenizer.special_tokens_map)
        ids = [tokenizer.convert_tokens_to_ids(specials[name]) for name in UNUSED_TOKENS if name in specials]
        self.unused = frozenset(int(i) for i in ids)
        self.decode = functools.lru_cache(maxsize=65536)(lambda i: str(tokenizer.decode([int(i)])))
        width = 1 + max(spec.hidden_size, spec.colbert_dim)
        self.ready_note = (
            f", BGE-M3 outputs from one pass: dense ({spec.hidden_size}), sparse (lexical weights over "
            f"{info.vocab_size} ids), colbert ({spec.colbert_dim} per token); a pass holds rows x tokens x {width} "
            f'floats of them; a request asks them with "outputs" (default dense)'
        )

    @property
    def settings(self) -> Chain:
        """No prompts: FlagEmbedding reads none of the folder's (a request may send its own `prompt`)."""
        return self.chain

    def shape(self, encoded: Encoded, options: Options, ceiling: int, specials: tuple[int, int]) -> Encoded:
        """The outputs its request renders, which its answer keeps."""
        return replace(encoded, outputs=tuple(options.outputs) or DEFAULT_OUTPUTS)

    def numbers(self, encoded: Encoded, options: Options) -> int:
        """Its asked dense and ColBERT components, as its answer will count them (`M3Answer.numbers`); the lexical
        weights, known only after the pass, counted as none."""
        outputs, hidden, colbert = options.outputs or DEFAULT_OUTPUTS, self.spec.hidden_size, self.spec.colbert_dim
        dense = min(hidden, options.dimensions or hidden) if "dense" in outputs else 0
        vectors = max(len(encoded.ids) - 1, 0) * min(colbert, options.dimensions or colbert)
        return dense + (vectors if "colbert" in outputs else 0)

    def forward(self, rows: Rows) -> list[M3Row]:
        """Each row's outputs, cut right after the pass from its packed output (per token: its lexical weight, then
        the CLS state on the first token or its ColBERT vector), keeping those its request renders."""
        packed: np.ndarray = self.engine(rows.ids, rows.mask)
        hidden, colbert = self.spec.hidden_size, self.spec.colbert_dim
        out = []
        lengths = rows.mask.sum(axis=1)  # each row's tokens: the pass pads after them
        for r, (row, n) in enumerate(zip(packed, lengths.tolist())):
            keeps = rows.outputs[r] if rows.outputs else ("sparse", "colbert")
            weights = np.array(row[:n, 0], dtype=np.float32) if "sparse" in keeps else np.zeros(0, np.float32)
            vectors = row[1:n, 1 : 1 + colbert] if "colbert" in keeps else np.zeros((0, colbert))
            dense = np.array(row[0, 1 : 1 + hidden], dtype=np.float32)
            out.append(M3Row(dense, weights, np.array(vectors, dtype=np.float32)))
        return out

    def answer(self, output: M3Row, encoded: Encoded) -> Answer:
        """One text's answer, from what its row kept."""
        return M3Answer(
            output.values,
            len(encoded.ids),
            encoded.truncated,
            normalize=self.normalize,
            ids=encoded.ids,
            weights=output.weights,
            colbert=output.colbert,
            unused=self.unused,
            decode=self.decode,
        )
