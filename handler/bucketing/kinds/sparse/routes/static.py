"""Static (inference-free): a `SparseStaticEmbedding`, a weight per vocabulary id of the text's tokens (no special
tokens), beside a transformer route in a Router; no transformer runs its rows (a weight per id, in numpy). Its texts
are cut where its own tokenizer cuts them (`own_cut`), and its weights must answer the model's one size, over the
transformer's tokenizer (`weights`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bucketing.kinds.sparse.routes.base import Route, RouteKind, tokenizer_file
from bucketing.model.chain import ChainError, safetensors_shapes

LARGE_INTEGER = 10**20  # transformers truncates at a tokenizer's model_max_length only up to this (its LARGE_INTEGER)


def static_weights(model_dir: str, route: Route) -> np.ndarray:
    """A SparseStaticEmbedding's weight per vocabulary id, float32."""
    from safetensors.numpy import load_file

    weights = load_file(str(Path(model_dir) / route.folder / "model.safetensors"))
    if set(weights) != {"weight"} or weights["weight"].ndim != 1:
        raise ChainError(f"module SparseStaticEmbedding in {Path(model_dir) / route.folder}: expected one 1-D weight")
    return weights["weight"].astype(np.float32)


class Static(RouteKind):
    name = "static"
    title = "static"
    chain = "SparseStaticEmbedding"
    runs_transformer = False
    tokenizer_cut = True

    def reads(self, names: Sequence[str]) -> bool:
        return list(names) == ["SparseStaticEmbedding"]

    def read(self, folder: Path, modules: Sequence[tuple[str, str]]) -> Route:
        path = modules[0][1]
        if not (folder / path / "model.safetensors").is_file():
            raise ChainError(f"module SparseStaticEmbedding in {folder / path}: no model.safetensors; not served")
        return Route("static", path)

    def size(self, folder: Path, route: Route) -> int:
        """Its weights (its output size) as its safetensors header says, without reading them."""
        shape = safetensors_shapes(folder / route.folder / "model.safetensors").get("weight", [])  # ChainError: 1 line
        return int(shape[0]) if len(shape) == 1 else 0

    def own_cut(self, model_dir: str, route: Route) -> int | None:
        """Where SparseStaticEmbedding cuts a text (its own tokens, no special tokens): `tokenizer(...,
        truncation=True)` cuts at the route's tokenizer's model_max_length, or nowhere when that is unset (over
        LARGE_INTEGER)."""
        from transformers import AutoTokenizer

        limit = int(AutoTokenizer.from_pretrained(str(Path(model_dir) / route.folder)).model_max_length)
        return limit if limit <= LARGE_INTEGER else None

    def weights(self, model_dir: str, name: str, route: Route, size: int, tokenizer: bytes) -> np.ndarray | None:
        if tokenizer_file(model_dir, route.folder) != tokenizer:
            raise ChainError(
                f"route {name!r} ({route.folder}) has a tokenizer other than the transformer's; served: "
                "one tokenizer for every route"
            )
        weights = static_weights(model_dir, route)
        if weights.shape[0] != size:
            raise ChainError(
                f"route {name!r}: {weights.shape[0]} weights for another route's output size of {size}; "
                "served: one size for every route"
            )
        return weights

    def forward(self, task: Any, name: str, route: Route, rows: Any, picked: list[int], out: np.ndarray) -> None:
        """Each row's own tokens (between its special tokens) get their id's weight, once per id."""
        ids, mask = rows.ids, rows.mask
        (before, after), weight = task.specials, task.weights[name]
        ends = mask[picked].sum(axis=1, keepdims=True) - after
        columns = np.arange(ids.shape[1])
        row, column = np.nonzero((columns >= before) & (columns < ends))
        which = np.asarray(picked)[row]
        tokens = ids[which, column]
        out[which, tokens] = weight[tokens]


STATIC = Static()
