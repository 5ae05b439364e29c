"""A sparse encoder's route (`Route`: one way to a sparse vector, as its folder was read) and what a route kind does
(`RouteKind`: the defaults, for a route whose rows run the model's one transformer). Each kind is a module of this
package, registered in `ROUTE_KINDS` (`routes/__init__.py`), which is how the modules above find a route's kind
(`routes.kind_of`); a kind is handed what it needs (the folder's routes, the task) and imports none of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from bucketing.model.chain import Chain, ChainError

RouteKindName = Literal["splade", "static", "csr"]  # SPLADE over an MLM, a static weight per token, CSR over a chain


@dataclass(frozen=True)
class Route:
    """One way to a sparse vector: SPLADE over an MLM transformer's logits, or a static weight per token id."""

    kind: RouteKindName
    folder: str  # the MLM transformer's, the SparseStaticEmbedding's or (csr) the Transformer's folder (relative)
    pooling: str = "max"  # splade: max or sum over the tokens
    activation: str = "relu"  # splade: relu (log1p(relu(x))) or log1p_relu (log1p(log1p(relu(x))))
    pooling_folder: str = ""  # splade: the SpladePooling module's folder; csr: the SparseAutoEncoder's
    dense: Chain | None = None  # csr: the dense chain before the SparseAutoEncoder (pooling, Dense, Normalize)
    k: int = 0  # csr: the SparseAutoEncoder's k (its top-k, and encode()'s max_active_dims unless saved)
    hidden_dim: int = 0  # csr: its latents (the answer's dimensions)
    layer_norm: bool = False  # csr: its `normalize` (a layer norm of the input before the encoder)
    modules: tuple[str, ...] = ()  # every module folder the route reads (relative), for the archive to carry


class Loaded(NamedTuple):
    """What a route kind's `load` hands the sparse task: its torch engine, the size of the vectors answered, the
    transformer's usable positions, and each static route's weights (checked against that size)."""

    engine: Any
    size: int
    max_positions: int
    weights: Mapping[str, np.ndarray]


class RouteKind:
    """A route kind: how its modules are read from the folder, what it answers and how (its torch engine, its
    exported graph) and what it refuses. The defaults are a route whose rows run the model's transformer."""

    name: RouteKindName
    title = ""  # how a line names it: SPLADE, CSR
    chain = ""  # the module chain it reads, as the line for an unserved chain lists them ("": a line of its own)
    runs_transformer = True  # its rows run the model's one transformer
    loaded_as = ""  # the transformers class that transformer is loaded as
    runs_as = ""  # how that transformer runs, in a line ("a masked LM")
    own_size = False  # answers vectors of a size of its own, not the vocabulary's: the routes' sizes checked at read
    chunks = False  # its windows' vectors combine as its tokens pool (a chunked text is served)
    tokenizer_cut = False  # its texts are cut where its own tokenizer cuts them, not at max_length

    def reads(self, names: Sequence[str]) -> bool:
        """Whether a route of these modules (their class names) is of this kind."""
        raise NotImplementedError

    def read(self, folder: Path, modules: Sequence[tuple[str, str]]) -> Route:
        """The route of these (class name, folder) modules, checked; ChainError in one line."""
        raise NotImplementedError

    def describe(self, route: Route) -> str:
        """The route as the model-config and the ready line say it."""
        return self.name

    def top_k(self, route: Route) -> int | None:
        """The max_active_dims its own module cuts at (None: none)."""
        return None

    def size(self, folder: Path, route: Route) -> int:
        """The size of the vectors it answers, as read from its files (0: not known there)."""
        return 0

    def own_cut(self, model_dir: str, route: Route) -> int | None:
        """Where its own tokenizer cuts a text (`tokenizer_cut`; None: nowhere)."""
        return None

    def weights(self, model_dir: str, name: str, route: Route, size: int, tokenizer: bytes) -> np.ndarray | None:
        """Its weights read at load (checked against the model's answer `size` and the transformer's `tokenizer`);
        None: none of its own. ChainError in one line."""
        return None

    def load(
        self,
        routes: Mapping[str, Route],
        route: Route,
        config: Any,
        model_dir: str,
        folder: str,
        gpu_id: Any,
        static_routes: Callable[[int], Mapping[str, np.ndarray]],
    ) -> Loaded:
        """The model of these `routes` on torch float32, `route` (of this kind) running the transformer in `folder`;
        `static_routes(size)` reads and checks the static routes' weights against the size it answers."""
        raise NotImplementedError

    def ready_note(self, engine: Any, size: int) -> str:
        """What the ready line says of its torch `engine` (a pass's memory), answering vectors of `size`."""
        raise NotImplementedError

    def forward(self, task: Any, name: str, route: Route, rows: Any, picked: list[int], out: np.ndarray) -> None:
        """Its rows' vectors (`picked` of the padded `rows`) into `out`: on the task's engine, padded only to their
        own longest beside another route's rows."""
        ids, mask = rows.ids, rows.mask
        width = ids.shape[1] if len(picked) == ids.shape[0] else int(mask[picked].sum(axis=1).max())
        mine = rows.take(picked, width)
        skips = route.dense is not None and not route.dense.include_prompt  # its Pooling leaves prompts out
        extra = {"pool_mask": mine.pool_mask()} if skips else {}
        out[picked] = task.engine(mine.ids, mine.mask, route, **extra)

    def export_head(
        self, routes: Mapping[str, Route], model_dir: str, folder: str, extra: dict[str, Any]
    ) -> tuple[Any, int, Any]:
        """What the graph engines export for a model whose transformer it runs: its head, the answer's width, and
        the transformers model."""
        raise NotImplementedError

    def graph_engine(self, task: Any, graph: Any, engine_name: str) -> tuple[Any, Any]:
        """The task's engine with the exported graph in its place, and the transformers model (its vocabulary)."""
        raise NotImplementedError

    def probe_extras(self, pool_mask: np.ndarray) -> tuple[tuple[Any, ...], ...]:
        """The extra inputs its engine is checked with against torch's."""
        return ((),)

    def graph_refusal(self, routes: Mapping[str, Route]) -> str | None:
        """Why this model is not served on a graph engine, for its routes of this kind; None when it is."""
        return None

    def engine_refusal(self, routes: Mapping[str, Route], engine: str) -> str | None:
        """Why this model is not served on `engine`, for its routes of this kind; None when it is."""
        return None


def tokenizer_file(model_dir: str, folder: str) -> bytes:
    path = Path(model_dir) / folder / "tokenizer.json"
    if not path.is_file():
        raise ChainError(f"{path.parent}: no tokenizer.json (a fast tokenizer is required)")
    return path.read_bytes()
