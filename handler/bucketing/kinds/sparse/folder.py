"""A sparse encoder's folder (sentence-transformers' `SparseEncoder`), read from its files: what it computes
(`SparseSpec`: its MLM transformer, SPLADE pooling, a Router's routes), whether a folder is one, and what its
routes read (static weights, tokenizer). `sparse.py` runs it.

Served: SPLADE (`MLMTransformer`, or `Transformer` with `transformer_task: fill-mask`, then `SpladePooling` with its
pooling strategy, max or sum, and activation, relu or log1p_relu), and a `Router` whose routes are each SPLADE or a
`SparseStaticEmbedding` (inference-free: a weight per vocabulary id of the text's tokens, no special tokens), one
route chosen per request by its `input_type`; and CSR: a dense chain (Transformer, Pooling with or without the
prompt's tokens, Dense..., Normalize) then a `SparseAutoEncoder` (its top-k over the encoder's latents), alone or as
routes of a Router (beside a static route, or several over one shared Transformer). Every route runs the one
transformer the model has, if any, and answers vectors of one size. Anything else stops the build and the worker with
one line.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bucketing.kinds.sparse.routes import ROUTE_KINDS, Route, RouteKind, kind_of
from bucketing.kinds.sparse.routes.base import tokenizer_file
from bucketing.model.chain import (
    INPUT_TYPES,
    Chain,
    ChainError,
    json_mapping,
    module_path,
    read_prompts,
    transformer_settings,
)

__all__ = ["Route", "SparseSpec", "is_sparse", "read_sparse", "sparse_folders", "tokenizer_file"]

SPARSE_MODULES = ("MLMTransformer", "SpladePooling", "SparseStaticEmbedding", "SparseAutoEncoder")
MODALITY = "text"  # what sentence-transformers infers for a batch of strings, for a Router's route mappings


@dataclass(frozen=True)
class SparseSpec:
    """A SparseEncoder folder as read: its routes by name, how a request's input_type picks one, and its settings."""

    routes: Mapping[str, Route]
    default_route: str | None = None
    mappings: Mapping[tuple[str | None, Any], str] = field(default_factory=dict)  # a Router's (task, modality)
    max_active_dims: int | None = None
    chain: Chain = Chain()  # prompts, default prompt, the MLM transformer's max_seq_length and lower casing

    @property
    def mlm(self) -> str | None:
        """The one transformer's folder (relative; MLM, or csr's dense one), if a route runs one."""
        return next((r.folder for r in self.routes.values() if kind_of(r).runs_transformer), None)

    @property
    def transformer_kind(self) -> RouteKind:
        """The kind of its routes that run its one transformer (one kind: `read_sparse` refuses two)."""
        return next(kind_of(r) for r in self.routes.values() if kind_of(r).runs_transformer)

    @property
    def loaded_as(self) -> str:
        """The transformers class its transformer is loaded as: CSR's dense chain reads the hidden states
        (`AutoModel`), SPLADE the masked-LM logits (`AutoModelForMaskedLM`)."""
        return next(
            (kind_of(r).loaded_as for r in self.routes.values() if kind_of(r).runs_transformer), "AutoModelForMaskedLM"
        )

    def route(self, input_type: str | None) -> str:
        """The route `encode(task=input_type)` takes, as sentence-transformers' Router resolves it for text."""
        if len(self.routes) == 1 and not self.mappings and self.default_route is None:
            return next(iter(self.routes))
        for key in ((input_type, MODALITY), (input_type, None), (None, MODALITY), (None, None)):
            if key in self.mappings:
                return self.mappings[key]
        if input_type and input_type in self.routes:
            return input_type
        if MODALITY in self.routes:
            return MODALITY
        if input_type is not None or self.default_route is None:
            raise ChainError(f"no route for input_type {input_type!r}; routes: {', '.join(self.routes)}")
        return self.default_route

    def cut(self, input_type: str | None) -> int | None:
        """The max_active_dims encode() cuts this input type's answer at unless a request says one: the folder's;
        else, on a CSR route inside a Router, its SparseAutoEncoder's k (its own top-k; SparseEncoder takes k as
        max_active_dims only from a SparseAutoEncoder outside a Router, which `read_sparse` records)."""
        if self.max_active_dims is not None:
            return self.max_active_dims
        route = self.routes[self.route(input_type)]
        return kind_of(route).top_k(route)

    def describe(self) -> dict[str, Any]:
        """What was read, as plain data (the archive's model-config and the ready line)."""
        return {
            "routes": {name: kind_of(r).describe(r) + f" ({r.folder or '.'})" for name, r in self.routes.items()},
            "default_route": self.default_route,
            "max_active_dims": self.max_active_dims,
            "prompts": dict(self.chain.prompts),
            "default_prompt_name": self.chain.default_prompt_name,
            "max_seq_length": self.chain.max_seq_length,
        }


def kind(module: Mapping[str, Any]) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def is_sparse(model_dir: Path | str) -> bool:
    """Whether sentence-transformers loads this folder as a SparseEncoder (its saved model_type, or a sparse
    module in modules.json or a Router's config)."""
    folder = Path(model_dir)
    st = folder / "config_sentence_transformers.json"
    try:
        if st.is_file() and json.loads(st.read_text(encoding="utf-8")).get("model_type") == "SparseEncoder":
            return True
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, AttributeError):
        return False
    kinds = [kind(m) for m in modules if isinstance(m, Mapping)]
    if any(k in SPARSE_MODULES for k in kinds):
        return True
    if "Router" in kinds:
        router = next(m for m in modules if isinstance(m, Mapping) and kind(m) == "Router")
        try:
            types = json.loads((module_path(folder, router) / "router_config.json").read_text(encoding="utf-8"))
            return any(str(t).rsplit(".", 1)[-1] in SPARSE_MODULES for t in types.get("types", {}).values())
        except (OSError, ValueError, AttributeError, ChainError):
            return False
    return False


def read_sparse(model_dir: Path | str) -> SparseSpec:
    """The folder's sparse chain; ChainError in one line for one this handler cannot serve exactly."""
    folder = Path(model_dir)
    modules = _list(folder / "modules.json")
    kinds = [kind(m) for m in modules]
    prompts = read_prompts(folder)
    st = (
        json_mapping(folder / "config_sentence_transformers.json")
        if (folder / "config_sentence_transformers.json").is_file()
        else {}
    )
    max_active = st.get("max_active_dims")
    if max_active is not None and (isinstance(max_active, bool) or not isinstance(max_active, int) or max_active < 1):
        raise ChainError(f"{folder / 'config_sentence_transformers.json'}: max_active_dims must be a positive integer")
    if kinds == ["Router"]:
        routes, default, mappings = _router(folder, module_path(folder, modules[0]))
    else:
        routes, default, mappings = (
            {"": _route(folder, [(k, str(m.get("path", ""))) for k, m in zip(kinds, modules)])},
            None,
            {},
        )
    # as SparseEncoder sets it from its SparseAutoEncoder (not from one in a Router)
    if max_active is None and kinds != ["Router"]:
        max_active = next((k for r in routes.values() if (k := kind_of(r).top_k(r)) is not None), None)
    mlm = {r.folder for r in routes.values() if kind_of(r).runs_transformer}
    if len(mlm) != 1:
        raise ChainError(
            f"{folder}: a sparse model with {len(mlm)} transformers (MLM or CSR's) is not served (served: exactly "
            "one, which routes of a Router may share); this model cannot be served exactly"
        )
    running = [k for k in ROUTE_KINDS.values() if k.runs_transformer and any(kind_of(r) is k for r in routes.values())]
    if len(running) > 1:
        raise ChainError(
            f"{folder}: a Router with both {' and '.join(k.title for k in running)} routes is not served (its one "
            f"transformer runs as {' or as '.join(k.runs_as for k in running)}, not both); this model cannot be "
            "served exactly"
        )
    sized = any(kind_of(r).own_size for r in routes.values())
    sizes = {n: kind_of(r).size(folder, r) for n, r in routes.items()} if sized else {}
    if len(set(sizes.values())) > 1:  # (a SPLADE route's vocabulary is checked against the MLM's at load)
        raise ChainError(
            f"{folder}: its routes answer vectors of different sizes ("
            + ", ".join(f"{name}: {size}" for name, size in sizes.items())
            + "); served: one size for every route (a SparseAutoEncoder's hidden_dim, a static route's vocabulary)"
        )
    max_seq_length, lower = transformer_settings(folder / next(iter(mlm)))
    chain = Chain(
        "sentence-transformers",
        (running[0].name,),
        all(r.dense.include_prompt for r in routes.values() if r.dense is not None),  # False: prompt tokens skipped
        (),
        False,
        prompts.prompts,
        prompts.default_prompt_name,
        max_seq_length,
        lower,
    )
    spec = SparseSpec(routes, default, mappings, max_active, chain)
    for input_type in (None, *INPUT_TYPES):
        try:
            spec.route(input_type)
        except ChainError:
            if input_type is None:
                raise ChainError(f"{folder}: its Router has no default route; encode() cannot choose one") from None
    return spec


def _list(path: Path) -> list[Mapping[str, Any]]:
    try:
        modules = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ChainError(f"{path}: not readable JSON ({type(e).__name__})") from None
    if not isinstance(modules, list) or not modules or not all(isinstance(m, Mapping) for m in modules):
        raise ChainError(f"{path}: expected a list of modules")
    return modules


def _route(folder: Path, modules: Sequence[tuple[str, str]]) -> Route:
    """One route's modules: [MLM transformer, SpladePooling], [SparseStaticEmbedding] or a CSR chain."""
    return replace(_route_kind(folder, modules), modules=tuple(path for _, path in modules))


def _route_kind(folder: Path, modules: Sequence[tuple[str, str]]) -> Route:
    names = [k for k, _ in modules]
    kind = next((k for k in ROUTE_KINDS.values() if k.reads(names)), None)
    if kind is not None:
        return kind.read(folder, modules)
    served = ", ".join(k.chain for k in ROUTE_KINDS.values() if k.chain)
    raise ChainError(
        f"{folder}: sparse module chain {', '.join(names)} is not served (served: {served}, or a Router of those); "
        "this model cannot be served exactly"
    )


def _router(folder: Path, path: Path) -> tuple[dict[str, Route], str | None, dict[tuple[str | None, Any], str]]:
    cfg = json_mapping(path / "router_config.json")
    types, structure = cfg.get("types") or {}, cfg.get("structure") or {}
    params = cfg.get("parameters") or {}
    if not isinstance(types, Mapping) or not isinstance(structure, Mapping) or not structure:
        raise ChainError(f"{path / 'router_config.json'}: expected its types and structure")
    rel = path.relative_to(folder)
    routes = {}
    for name, ids in structure.items():
        for module_id in ids:
            if ".." in Path(str(module_id)).parts or Path(str(module_id)).is_absolute():
                raise ChainError(
                    f"{path / 'router_config.json'}: module {module_id!r} leaves the model folder; refused"
                )
        routes[str(name)] = _route(folder, [(str(types.get(i, "")).rsplit(".", 1)[-1], str(rel / str(i))) for i in ids])
    default = params.get("default_route")
    if default is None and params.get("allow_empty_key", True):
        default = next(iter(routes))
    mappings: dict[tuple[str | None, Any], str] = {}
    for key, target in (params.get("route_mappings") or {}).items():
        try:
            parsed = ast.literal_eval(key)
        except (ValueError, SyntaxError):
            raise ChainError(
                f"{path / 'router_config.json'}: route mapping {key!r} is not a (task, modality) pair"
            ) from None
        task, modality = parsed
        modality = tuple(sorted(modality)) if isinstance(modality, tuple) else modality
        mappings[(task, modality)] = str(target)
    return routes, default, mappings


def sparse_folders(model_dir: Path | str) -> list[str]:
    """The folders (relative) a sparse Router's routes read, for the archive to carry (none for another model)."""
    folder = Path(model_dir)
    if not is_sparse(folder):
        return []
    spec = read_sparse(folder)
    return sorted({f for r in spec.routes.values() for f in (r.folder, r.pooling_folder, *r.modules) if f})
