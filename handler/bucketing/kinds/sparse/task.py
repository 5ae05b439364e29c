"""Sparse encoders (sentence-transformers' `SparseEncoder`): the task that runs one exactly as
`SparseEncoder(dir).encode()`, `encode_query()` and `encode_document()` do (the folder is read in `folder`).

One route is chosen per request by its `input_type` as `encode_query` (`"query"`), `encode_document` (`"document"`)
and `encode()` (none) choose it. The answer is the vocabulary-size vector, cut to the model's `max_active_dims` (or
the request's) by torch's top-k of absolute values as sentence-transformers cuts it (`answers.keep_top`).

The torch engines (SPLADE in bounded row groups, CSR) are in `engines`; onnxruntime's in `onnx`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bucketing.answers import Answer, SparseRow
from bucketing.kinds.sparse.engines import CsrEngine, SparseEngine
from bucketing.kinds.sparse.folder import SparseSpec, is_sparse, read_sparse, tokenizer_file
from bucketing.kinds.sparse.routes import kind_of
from bucketing.kinds.task import Rows, TaskHooks
from bucketing.model.chain import Chain, ChainError
from bucketing.model.encoded import recut


class SparseTask(TaskHooks):
    """A SparseEncoder: each row's route (its request's input_type), its vocabulary-size vector, and one answer
    per text (the non-zero ids and values, cut to max_active_dims)."""

    name = "sparse"
    labels = None
    routed = True  # the pipeline passes each row's input_type to `forward`

    @staticmethod
    def detects(folder: Path | str) -> bool:
        return is_sparse(folder)

    @staticmethod
    def load(config: Any, model_dir: str, gpu_id: Any = None) -> SparseTask:
        from bucketing.kinds.sparse.onnx import open_engine

        task = load_sparse_task(config, model_dir, gpu_id)
        task.engine = open_engine(task, config, model_dir)  # on onnxruntime: the graph, checked against torch
        return task

    @staticmethod
    def load_head(model_dir: str, attention: str | None = None) -> tuple[Any, Any]:
        """What the onnxruntime engine's graph is exported from (`onnx`)."""
        from bucketing.kinds.sparse.onnx import load_head

        return load_head(model_dir, attention)

    @staticmethod
    def read_settings(folder: Path) -> Chain:
        return read_sparse(folder).chain

    @staticmethod
    def encoder_folder(folder: Path) -> tuple[Path, int | None, str] | None:
        """Its transformer's folder, the tokens its chain cuts at, and the class the transformer is loaded as."""
        spec = read_sparse(folder)
        return folder / (spec.mlm or ""), spec.chain.max_seq_length, spec.loaded_as

    @staticmethod
    def describe(folder: Path) -> dict[str, Any] | None:
        return read_sparse(folder).describe()

    @staticmethod
    def engine_refusal(folder: Path, engine: str) -> str | None:
        """A summing SPLADE on an engine that sums in float32 (`onnx.summed_in_float32`)."""
        from bucketing.kinds.sparse.onnx import summed_in_float32

        return summed_in_float32(read_sparse(folder), engine)

    def __init__(
        self,
        spec: SparseSpec,
        engine: SparseEngine | CsrEngine,
        vocab_size: int,
        max_positions: int,
        specials: tuple[int, int],
        weights: Mapping[str, np.ndarray],
        model_dir: str,
    ) -> None:
        self.spec = spec
        self.chain = spec.chain
        self.engine = engine
        self.dimensions = vocab_size
        self.max_positions = max_positions
        self.specials = specials  # special tokens before and after a text's own (a static route leaves them out)
        self.weights = dict(weights)
        self.tokenizer_dir = str(Path(model_dir) / (spec.mlm or ""))
        # Each static route's own cut (its tokens, without special tokens): its tokenizer's model_max_length
        self.static_cuts = {
            n: kind_of(r).own_cut(model_dir, r) for n, r in spec.routes.items() if kind_of(r).tokenizer_cut
        }
        # what a pass holds, as the kind that runs the transformer says of its engine
        self.ready_note = f", sparse model {spec.describe()}, " + spec.transformer_kind.ready_note(engine, vocab_size)
        for name, cut in self.static_cuts.items():  # where a static route's texts are cut, which max_length is not
            said = "unset" if cut is None else f"{cut}"
            served = "" if cut is not None and cut <= STATIC_REACH else f", texts served up to {STATIC_REACH} (413)"
            self.ready_note += f", static route {name!r} cut at its tokenizer's model_max_length ({said}){served}"

    @property
    def settings(self) -> Chain:
        """The folder's prompts (and max_seq_length) live on its chain."""
        return self.chain

    def forward(self, rows: Rows) -> list[SparseRow]:
        """The sparse vectors of a padded sub-batch, each row by its route: computed vocabulary-size (a pass's rows,
        which max_batch_tokens bounds) and kept as their non-zeros (`SparseRow`) before the next pass runs."""
        ids = rows.ids
        names = [self.spec.route(t) for t in (rows.input_types or (None,) * ids.shape[0])]
        out = np.zeros((ids.shape[0], self.dimensions), dtype=np.float32)
        for name in dict.fromkeys(names):
            picked = [r for r, n in enumerate(names) if n == name]
            route = self.spec.routes[name]
            kind_of(route).forward(self, name, route, rows, picked, out)
        types = rows.input_types or (None,) * ids.shape[0]
        cuts = rows.cuts or (None,) * ids.shape[0]
        return [SparseRow.of(row, self._keeps(t, c)) for row, t, c in zip(out, types, cuts)]

    def _keeps(self, input_type: str | None, cut: int | None | bool) -> int | None:
        """How many of a row's non-zeros its answer can render: its request's max_active_dims, else the model's
        cut for its input type (None: all); a window of a chunked text keeps all (its windows combine first)."""
        if cut is False:
            return None
        return cut if isinstance(cut, int) and not isinstance(cut, bool) else self.spec.cut(input_type)

    def _static(self, input_type: str | None) -> tuple[str, int | None] | None:
        """The static route this input type takes and where sentence-transformers cuts its texts (None: nowhere);
        None for a route that runs the transformer (or an input type no route takes)."""
        try:
            name = self.spec.route(input_type)
        except ChainError:
            return None
        return (name, self.static_cuts[name]) if name in self.static_cuts else None

    def cut(self, input_type: str | None, ceiling: int) -> int:
        """Where a text of this input type is cut: at max_length (`ceiling`) on a route that runs the transformer; on
        a static route, where SparseStaticEmbedding cuts it (its tokenizer's model_max_length of the text's own
        tokens; here with the special tokens the static route then leaves out), past max_length where that is
        longer, as no transformer runs it; at most STATIC_REACH of its own tokens (`refuse` says the rest)."""
        static = self._static(input_type)
        if static is None:
            return ceiling
        limit = static[1]
        return min(STATIC_REACH if limit is None else limit, STATIC_REACH) + sum(self.specials)

    def shape(self, encoded: Any, options: Any, ceiling: int, specials: tuple[int, int]) -> Any:
        """A text's tokens cut where its input type is (texts are tokenized as far as any input type reaches:
        `task.reach`)."""
        if encoded.unbounded:
            return encoded
        cut = self.cut(options.input_type, ceiling)
        return recut(encoded, cut, specials, options.truncation_direction == "left")

    def planned(self, encoded: Any) -> int:
        """A static route's row is planned as one token (no transformer runs it: a weight per id, in numpy); any
        other row as its length."""
        return 1 if self._static(encoded.input_type) is not None else len(encoded.ids)

    def refuse(self, encoded: Any, where: str, max_length: int) -> str | None:
        """Why a text cut on a static route is not served: sentence-transformers cuts it further than STATIC_REACH
        tokens (or not at all); None when served."""
        static = self._static(encoded.input_type)
        if not encoded.truncated or static is None:
            return None
        name, limit = static
        if limit is not None and limit <= STATIC_REACH:
            return None
        where_st = "does not cut" if limit is None else f"cuts at {limit} tokens"
        return (
            f"{where} has more than {STATIC_REACH} tokens: input_type {encoded.input_type!r} takes the model's static "
            f"route {name!r}, which sentence-transformers {where_st} (its tokenizer's model_max_length), and this "
            f"handler reads a static route's text up to {STATIC_REACH} tokens; send a shorter text"
        )

    @property
    def chunk_refusal(self) -> str | None:  # type: ignore[override]
        """Chunked: served where every route is SPLADE (its windows' vectors pool as its tokens do: max or sum)."""
        other = next((n for n, r in self.spec.routes.items() if not kind_of(r).chunks), None)
        if other is None:
            return None
        return (
            f"is served for SPLADE models (their windows combine as their tokens pool, by max or sum); route {other!r} "
            "of this one is not SPLADE"
        )

    def combine(self, vectors: Sequence[SparseRow], weights: Sequence[int], input_type: str | None) -> SparseRow:
        """A SPLADE route's windows combined as its pooling combines tokens: their maximum, or their sum (in
        float64, rounded once)."""
        stacked = np.asarray([v.dense() for v in vectors], dtype=np.float64)
        route = self.spec.routes[self.spec.route(input_type)]
        pooled = stacked.max(axis=0) if route.pooling == "max" else stacked.sum(axis=0)
        return SparseRow.of(np.asarray(pooled, dtype=np.float32))

    def answer(self, output: SparseRow, encoded: Any) -> Any:

        return Answer(
            output, len(encoded.ids), encoded.truncated, sparse=True, max_active_dims=self.spec.cut(encoded.input_type)
        )


def load_sparse_task(config: Any, model_dir: str, gpu_id: Any = None) -> SparseTask:
    """The sparse model on torch (float32: its kind refuses others), checked, as the kind of its routes that run the
    transformer loads it; EngineError in one line for what is not served."""
    from bucketing.model.head import EngineError

    try:
        spec = read_sparse(model_dir)
    except ChainError as e:
        raise EngineError(f"{model_dir}: {e}") from None
    folder = str(Path(model_dir) / (spec.mlm or ""))
    route = next(r for r in spec.routes.values() if kind_of(r).runs_transformer)
    loaded = kind_of(route).load(
        spec.routes, route, config, model_dir, folder, gpu_id, lambda size: static_routes(spec, model_dir, size)
    )
    return SparseTask(
        spec, loaded.engine, loaded.size, loaded.max_positions, specials(folder), loaded.weights, model_dir
    )


def static_routes(spec: SparseSpec, model_dir: str, size: int) -> dict[str, np.ndarray]:
    """Each static route's weights, checked: its tokenizer is the transformer's, and every route of the model
    answers vectors of one size (`size`: the MLM's vocabulary, or a CSR route's latents); EngineError in one line."""
    from bucketing.model.head import EngineError

    weights = {}
    try:
        mlm_tokenizer = tokenizer_file(model_dir, spec.mlm or "")
        for name, route in spec.routes.items():
            own = kind_of(route).weights(model_dir, name, route, size, mlm_tokenizer)
            if own is not None:
                weights[name] = own
    except ChainError as e:
        raise EngineError(f"{model_dir}: {e}") from None
    if weights and spec.chain.do_lower_case:
        raise EngineError(
            f"{model_dir}: its transformer lower-cases texts (do_lower_case) and its static route does not; "
            "one tokenization for both routes is served only without do_lower_case"
        )
    return weights


STATIC_REACH = 8192  # the most tokens of its own a static route's text is read to (every text is tokenized that far)


def specials(folder: str) -> tuple[int, int]:
    """How many special tokens the tokenizer puts before and after a text's own."""
    from transformers import AutoTokenizer

    backend = AutoTokenizer.from_pretrained(folder).backend_tokenizer
    backend.no_padding()  # a saved tokenizer.json may pad (sentence-transformers saves its padding)
    bare, full = backend.encode("a b", add_special_tokens=False).ids, backend.encode("a b").ids
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return start, len(full) - start - len(bare)
    raise ChainError(f"{folder}: cannot locate a text's tokens among its special tokens")
