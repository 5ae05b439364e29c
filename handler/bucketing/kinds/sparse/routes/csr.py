"""CSR: a dense chain (Transformer, Pooling with or without the prompt's tokens, Dense..., Normalize) then a
`SparseAutoEncoder` (its top-k over the encoder's latents), alone or as routes of a Router (beside a static route, or
several over one shared Transformer). Its torch engine is `CsrEngine`; on the graph engines, the dense
chain is the graph (`heads.OrtHead`) and the autoencoder stays on torch. A Router of several CSR routes is served on
torch only (`graph_refusal`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bucketing.kinds.sparse.routes.base import Loaded, Route, RouteKind
from bucketing.model.chain import ChainError, chain_of, json_mapping, read_prompts


class CsrEngine:
    """CSR: the dense chain's pooled embedding (`Head`, over the pooling mask: prompt tokens left out where its
    Pooling says `include_prompt: false`), Normalize if the chain has it, then the SparseAutoEncoder's encoder, in
    sentence-transformers' order of operations; relu of the latents (the cut is the answer's). One such chain per
    CSR route of a Router (`add`), keyed by the route's module folders (two routes may share an autoencoder and
    differ in pooling), all over one transformer."""

    name = "torch"
    fidelity = None
    shadow = None

    def __init__(self, head: Any, weights: Mapping[str, Any], route: Route, device: str) -> None:
        self.device = device
        self.parts: dict[tuple[str, ...], tuple[Any, bool, bool, Any, Any, Any]] = {}
        self.add(head, weights, route)

    def add(self, head: Any, weights: Mapping[str, Any], route: Route) -> None:
        """Another CSR route's dense chain (its own Head over the shared transformer) and autoencoder weights."""
        self.parts[route.modules] = (
            head.to(self.device).eval(),
            bool(route.dense is not None and route.dense.normalize),
            route.layer_norm,
            weights["pre_bias"].to(self.device),
            weights["encoder"].to(self.device),
            weights["latent_bias"].to(self.device),
        )

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, route: Route, pool_mask: np.ndarray | None = None
    ) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        head, normalize, layer_norm, pre_bias, encoder, latent_bias = self.parts[route.modules]
        with torch.inference_mode():
            i = torch.from_numpy(ids).to(self.device)
            m = torch.from_numpy(mask).to(self.device)
            x = head(i, m, None if pool_mask is None else torch.from_numpy(pool_mask).to(self.device))
            if normalize:
                x = F.normalize(x, p=2, dim=-1)
            if layer_norm:  # SparseAutoEncoder.LN, eps 1e-5
                x = x - x.mean(dim=-1, keepdim=True)
                x = x / (x.std(dim=-1, keepdim=True) + 1e-5)
            x = x - pre_bias
            latents = F.linear(x, encoder, latent_bias)
            return np.ascontiguousarray(F.relu(latents).cpu().numpy())


class Csr(RouteKind):
    name = "csr"
    title = "CSR"
    loaded_as = "AutoModel"  # the dense chain reads the hidden states
    runs_as = "an encoder"
    own_size = True  # its SparseAutoEncoder's hidden_dim

    def reads(self, names: Sequence[str]) -> bool:
        return "SparseAutoEncoder" in names

    def read(self, folder: Path, modules: Sequence[tuple[str, str]]) -> Route:
        """A dense chain (Transformer, Pooling, Dense..., Normalize) then one SparseAutoEncoder, last."""
        names = [k for k, _ in modules]
        where = folder / modules[-1][1]
        if names.count("SparseAutoEncoder") != 1 or names[-1] != "SparseAutoEncoder" or len(names) < 3:
            raise ChainError(
                f"{folder}: sparse module chain {', '.join(names)} is not served (served for CSR: Transformer, "
                "Pooling, Dense..., Normalize, then one SparseAutoEncoder); this model cannot be served exactly"
            )
        prompts = read_prompts(folder)
        dense = chain_of(
            folder, [{"type": k, "path": p} for k, p in modules[:-1]], prompts.prompts, prompts.default_prompt_name
        )
        cfg = json_mapping(where / "config.json")
        k, hidden, input_dim = cfg.get("k", 8), cfg.get("hidden_dim", 512), cfg.get("input_dim")
        for name, value in (("k", k), ("hidden_dim", hidden), ("input_dim", input_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ChainError(f"module SparseAutoEncoder in {where}: {name} must be a positive integer")
        if k > hidden:
            raise ChainError(f"module SparseAutoEncoder in {where}: k {k} over hidden_dim {hidden}")
        if not (where / "model.safetensors").is_file():
            raise ChainError(f"module SparseAutoEncoder in {where}: no model.safetensors; not served")
        return Route(
            "csr",
            modules[0][1],
            pooling_folder=modules[-1][1],
            dense=dense,
            k=k,
            hidden_dim=hidden,
            layer_norm=bool(cfg.get("normalize", False)),
        )

    def describe(self, route: Route) -> str:
        if route.dense is None:
            return "static"
        d = route.dense.describe()
        return (
            f"csr: pooling {'+'.join(d['pooling'])}, dense {d['dense']}, normalize {d['normalize']}, "
            f"SparseAutoEncoder top-{route.k} of {route.hidden_dim} (layer norm {route.layer_norm}, "
            f"{route.pooling_folder})"
        )

    def top_k(self, route: Route) -> int | None:
        return route.k

    def size(self, folder: Path, route: Route) -> int:
        return route.hidden_dim

    def weights(self, model_dir: str, name: str, route: Route, size: int, tokenizer: bytes) -> np.ndarray | None:
        if route.hidden_dim != size:
            raise ChainError(
                f"its routes answer vectors of different sizes (route {name!r}: {route.hidden_dim}, another: "
                f"{size}); served: one size for every route"
            )
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
        """CSR on torch float32: the dense chain's Head, then the SparseAutoEncoder's weights, checked; one chain
        per CSR route's modules over the one transformer."""
        import torch
        from safetensors.torch import load_file
        from transformers import AutoModel

        from bucketing.engines import select_device
        from bucketing.model.head import (
            EngineError,
            Head,
            dense_layers,
            load_pretrained,
            reduced_weights,
            usable_positions,
        )

        model = load_pretrained(AutoModel, folder)
        saved = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        if saved != torch.float32:
            raise EngineError(reduced_weights(model_dir, str(saved).removeprefix("torch.")))
        device = select_device(gpu_id, torch.cuda.is_available())
        engine: CsrEngine | None = None
        mine = {r.modules: r for r in routes.values() if r.kind == self.name}  # a chain per route's modules
        for csr in mine.values():
            assert csr.dense is not None
            head = Head(model, pooled=True, chain=csr.dense, dense=dense_layers(model_dir, csr.dense))
            where = Path(model_dir) / csr.pooling_folder
            state = load_file(str(where / "model.safetensors"))
            encoder = state.get("encoder.weight", state.get("decoder.linear.weight"))
            width = csr.dense.dimensions(int(model.config.hidden_size))
            shapes = {
                "pre_bias": [width],
                "encoder": [csr.hidden_dim, width],
                "latent_bias": [csr.hidden_dim],
            }
            held = {"pre_bias": state.get("pre_bias"), "encoder": encoder, "latent_bias": state.get("latent_bias")}
            found = {name: (list(t.shape) if t is not None else None) for name, t in held.items()}
            if found != shapes or any(t is not None and t.dtype != torch.float32 for t in held.values()):
                raise EngineError(
                    f"{model_dir}: module SparseAutoEncoder in {where}: expected float32 {shapes} for its config, "
                    f"holds {found}"
                )
            if engine is None:
                engine = CsrEngine(head, held, csr, device)
            else:
                engine.add(head, held, csr)
        assert engine is not None
        weights = static_routes(route.hidden_dim)
        return Loaded(engine, route.hidden_dim, usable_positions(model.config), weights)

    def ready_note(self, engine: Any, size: int) -> str:
        """No vocabulary logits: a pass holds its latents after the dense encoder's own activations."""
        return (
            f"CSR: no vocabulary logits; a pass holds rows x {size} "
            f"latents x 4 bytes ({size * 4} bytes a row) after the dense encoder's own activations"
        )

    def export_head(
        self, routes: Mapping[str, Route], model_dir: str, folder: str, extra: dict[str, Any]
    ) -> tuple[Any, int, Any]:
        """The dense chain's pooled embedding (`head.Head`, exported as the embedding kind's is)."""
        from transformers import AutoModel

        from bucketing.model.head import Head, dense_layers, load_pretrained

        route = next(r for r in routes.values() if r.kind == self.name)
        assert route.dense is not None
        model = load_pretrained(AutoModel, folder, **extra)
        head = Head(model, pooled=True, chain=route.dense, dense=dense_layers(model_dir, route.dense))
        return head, route.dense.dimensions(int(model.config.hidden_size)), model

    def graph_engine(self, task: Any, graph: Any, engine_name: str) -> tuple[Any, Any]:
        """The one CSR route's dense chain on the graph (`heads.OrtHead`), its autoencoder on torch."""
        import copy

        from bucketing.kinds.sparse.heads import OrtHead

        torch_engine = task.engine
        engine = copy.copy(torch_engine)
        engine.parts = {k: (OrtHead(graph), *v[1:]) for k, v in torch_engine.parts.items()}
        return engine, next(iter(torch_engine.parts.values()))[0].model

    def probe_extras(self, pool_mask: np.ndarray) -> tuple[tuple[Any, ...], ...]:
        return ((), (pool_mask,))  # a prompt left out of pooling, and not

    def graph_refusal(self, routes: Mapping[str, Route]) -> str | None:
        """A Router of several CSR routes (one dense chain each, one graph exported)."""
        csr = [name for name, r in routes.items() if r.kind == self.name]
        if len(csr) < 2:
            return None
        return (
            f"a Router of {len(csr)} CSR routes ({', '.join(csr)}) is served on engine torch only (the onnxruntime "
            "graph holds one dense chain); build it with --engine torch"
        )


CSR = Csr()
