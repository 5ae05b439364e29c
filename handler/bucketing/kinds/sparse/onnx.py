"""Sparse encoders on the graph engines (onnxruntime; openvino, the same graph compiled by OpenVINO): the graph
exported at build (`load_head`: what `onnx_engine.export_onnx` exports for the sparse kind) and the engine that runs
it at worker start (`open_engine`), checked against the torch engine (`engines.SparseEngine` / `engines.CsrEngine`)
on padded inputs (OpenVINO has no float64: a summing SPLADE is refused on it, its engine declaring
`sums_in_float32`). Each graph engine runs the graph by its declaration's `sparse_graph` (`engine_registry`).

What the graph is and what runs it in the torch engine's place is each route kind's (`routes`), over the torch
modules of `heads`: SPLADE's `SpladeHead` (the masked LM and its poolings, run by `OrtSpladeEngine`), CSR's dense
chain (`head.Head`, run by `OrtHead` before its SparseAutoEncoder on torch); `heads` says how the graph computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bucketing.engine_registry import ENGINES
from bucketing.kinds.sparse.folder import SparseSpec, read_sparse
from bucketing.kinds.sparse.routes import ROUTE_KINDS, kind_of
from bucketing.model.chain import ChainError


def load_head(model_dir: str, attention: str | None = None) -> tuple[Any, Any]:
    """What the sparse kind exports, as the kind of its routes that run the transformer says (SPLADE's
    `SpladeHead`, or CSR's dense chain, `head.Head`); and the facts `onnx_engine.export_onnx` reads (its
    vocabulary, its positions)."""
    from bucketing.model.head import EngineError, ModelInfo, usable_positions

    try:
        spec = read_sparse(model_dir)
    except ChainError as e:
        raise EngineError(f"{model_dir}: {e}") from None
    folder = str(Path(model_dir) / (spec.mlm or ""))
    extra = {"attn_implementation": attention} if attention else {}
    refusal = graph_refusal(spec)
    if refusal:
        raise EngineError(f"{model_dir}: {refusal}")
    head, width, model = spec.transformer_kind.export_head(spec.routes, model_dir, folder, extra)
    cfg = model.config
    info = ModelInfo(usable_positions(cfg), width, (), int(cfg.vocab_size), chain=spec.chain)
    return head.eval(), info


def graph_refusal(spec: SparseSpec) -> str | None:
    """Why this folder is not served on a graph engine (a Router of several CSR routes: one dense chain each, one
    graph exported), as its route kinds say; None when it is."""
    return next((r for k in ROUTE_KINDS.values() if (r := k.graph_refusal(spec.routes)) is not None), None)


def open_graph(task: Any, config: Any, model_dir: str) -> Any:
    """The exported graph on the configured graph engine (its `sparse_graph`) in the task's engine's place, checked
    against it on padded inputs for every route that runs the transformer (an EngineError in one line past
    engines.base.TOLERANCE, or on any failure)."""
    from bucketing.engines.base import TOLERANCE, probe
    from bucketing.engines.onnx_engine import exported_graph
    from bucketing.model.head import EngineError

    torch_engine = task.engine
    several = graph_refusal(task.spec)
    if several:
        raise EngineError(f"handler.engine {config.engine}: {model_dir}: {several}")
    path = exported_graph(model_dir, config.engine)
    routes = [r for r in task.spec.routes.values() if kind_of(r).runs_transformer]
    float32_sum = summed_in_float32(task.spec, config.engine)
    if float32_sum:
        raise EngineError(f"handler.engine {config.engine}: {model_dir}: {float32_sum}")
    try:
        graph = ENGINES[config.engine].graph(path, config.torch_threads, torch_engine.device)
        engine, model = kind_of(routes[0]).graph_engine(task, graph, config.engine)
        engine.name = config.engine
        ids, mask, pool_mask = probe(int(model.config.vocab_size))  # pool_mask: a prompt left out of pooling
        diff = max(
            float(np.abs(engine(ids, mask, r, *extra) - torch_engine(ids, mask, r, *extra)).max())
            for r in routes
            for extra in kind_of(r).probe_extras(pool_mask)
        )
    except Exception as e:
        raise EngineError(
            f"handler.engine {config.engine}: {path} could not be checked against the torch model "
            f"({type(e).__name__}: {' '.join(str(e).split())[:300]})"  # one line, whatever the error says
        ) from e
    if not diff <= TOLERANCE:
        raise EngineError(
            f"handler.engine {config.engine}: {path} differs from the torch model by {diff:.2e} on padded "
            f"inputs (allowed: {TOLERANCE:g}); rebuild the archive from this model"
        )
    return engine


def summed_in_float32(spec: SparseSpec, engine: str) -> str | None:
    """Why this folder is not served on `engine`, as its route kinds say (a SPLADE summing over its tokens on an
    engine that sums in float32: `Splade.engine_refusal`); None otherwise."""
    return next((r for k in ROUTE_KINDS.values() if (r := k.engine_refusal(spec.routes, engine)) is not None), None)


def open_engine(task: Any, config: Any, model_dir: str) -> Any:
    """The sparse task's engine on the configured engine: the task's own torch engine, or the exported graph."""
    if not ENGINES[config.engine].exports_graph:
        return task.engine
    return open_graph(task, config, model_dir)
