"""SPLADE: an MLM transformer (`MLMTransformer`, or `Transformer` with `transformer_task: fill-mask`), then
`SpladePooling` with its pooling strategy (max or sum) and activation (relu or log1p_relu) over the logits. Its torch
engine is `SparseEngine` (the masked LM, then SPLADE pooling, in bounded row groups); on the graph engines, the graph
pools (`heads.SpladeHead`, run by `heads.OrtSpladeEngine`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bucketing.engine_registry import ENGINES, either
from bucketing.kinds.sparse.routes.base import Loaded, Route, RouteKind
from bucketing.model.chain import ChainError, json_mapping

MLM_MODULES = ("MLMTransformer", "Transformer")  # a Transformer serves here only with transformer_task fill-mask
SPLADE_POOLING = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")


def bytes_per_pass(max_batch_tokens: int, vocab_size: int) -> int:
    """The MLM logits one pass holds at most (float32): max_batch_tokens x vocabulary."""
    return max_batch_tokens * vocab_size * 4


def pools(routes: Mapping[str, Route]) -> tuple[tuple[str, str], ...]:
    """The (pooling, activation) pairs of the folder's SPLADE routes, in the graph's output order."""
    return tuple(sorted({(r.pooling, r.activation) for r in routes.values() if r.kind == SPLADE.name}))


class SparseEngine:
    """The MLM transformer, then SPLADE pooling, in row groups of at most `group_tokens` tokens (so the logits
    a pass holds stay within group_tokens x vocabulary floats), as sentence-transformers computes it."""

    name = "torch"
    fidelity = None
    shadow = None

    def __init__(self, model: Any, device: str, group_tokens: int) -> None:
        self.model = model.to(device).eval()
        self.device = device
        self.group_tokens = group_tokens

    def __call__(self, ids: np.ndarray, mask: np.ndarray, route: Route) -> np.ndarray:
        import torch

        rows = max(1, self.group_tokens // max(1, ids.shape[1]))
        out = []
        with torch.inference_mode():
            for start in range(0, ids.shape[0], rows):
                i = torch.from_numpy(ids[start : start + rows]).to(self.device)
                m = torch.from_numpy(mask[start : start + rows]).to(self.device)
                logits = self.model(input_ids=i, attention_mask=m, return_dict=False)[0].float()
                x = logits.mul_(m.unsqueeze(-1).to(logits.dtype)).relu_().log1p_()  # in place: one logits tensor
                if route.activation == "log1p_relu":
                    x = x.log1p_()
                out.append((torch.max(x, dim=1)[0] if route.pooling == "max" else torch.sum(x, dim=1)).cpu().numpy())
                del logits, x  # before the next group's logits are made
        return np.concatenate(out, axis=0)


class Splade(RouteKind):
    name = "splade"
    title = "SPLADE"
    chain = "MLMTransformer + SpladePooling"
    loaded_as = "AutoModelForMaskedLM"  # the masked-LM logits
    runs_as = "a masked LM"
    chunks = True  # its windows combine as its tokens pool: by max or sum

    def reads(self, names: Sequence[str]) -> bool:
        return len(names) == 2 and names[0] in MLM_MODULES and names[1] == "SpladePooling"

    def read(self, folder: Path, modules: Sequence[tuple[str, str]]) -> Route:
        names = [k for k, _ in modules]
        mlm, pooling = folder / modules[0][1], folder / modules[1][1]
        if names[0] == "Transformer":
            task = (
                json_mapping(mlm / "sentence_bert_config.json").get("transformer_task")
                if (mlm / "sentence_bert_config.json").is_file()
                else None
            )
            if task != "fill-mask":
                raise ChainError(
                    f"module Transformer in {mlm}: transformer_task {task!r} before SpladePooling; served: fill-mask"
                )
        cfg = json_mapping(pooling / "config.json")
        strategy, activation = cfg.get("pooling_strategy", "max"), cfg.get("activation_function", "relu")
        if strategy not in SPLADE_POOLING or activation not in SPLADE_ACTIVATIONS:
            raise ChainError(
                f"module SpladePooling in {pooling}: pooling_strategy {strategy!r} / activation_function "
                f"{activation!r} not served (served: {', '.join(SPLADE_POOLING)} / {', '.join(SPLADE_ACTIVATIONS)})"
            )
        return Route("splade", modules[0][1], str(strategy), str(activation), modules[1][1])

    def describe(self, route: Route) -> str:
        return f"splade {route.pooling} {route.activation}"

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
        """The masked LM on torch float32, its SPLADE pooling in row groups of max_batch_tokens tokens."""
        import torch
        from transformers import AutoModelForMaskedLM

        from bucketing.engines import select_device
        from bucketing.model.head import EngineError, load_pretrained, reduced_weights, usable_positions

        model = load_pretrained(AutoModelForMaskedLM, folder)
        saved = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        if saved != torch.float32:
            raise EngineError(reduced_weights(model_dir, str(saved).removeprefix("torch.")))
        vocab = int(model.config.vocab_size)
        weights = static_routes(vocab)
        device = select_device(gpu_id, torch.cuda.is_available())
        engine = SparseEngine(model, device, config.max_batch_tokens)
        return Loaded(engine, vocab, usable_positions(model.config), weights)

    def ready_note(self, engine: Any, size: int) -> str:
        """The MLM logits a pass holds at most (`bytes_per_pass`), in row groups of the engine's tokens."""
        per_pass = bytes_per_pass(engine.group_tokens, size) / 2**20
        return (
            f"MLM logits per pass at most {engine.group_tokens} tokens x "
            f"{size} ids x 4 bytes = {per_pass:.0f} MiB (handler.max_batch_tokens, in every strategy)"
        )

    def export_head(
        self, routes: Mapping[str, Route], model_dir: str, folder: str, extra: dict[str, Any]
    ) -> tuple[Any, int, Any]:
        """The masked LM and each of the folder's SPLADE poolings (`heads.SpladeHead`)."""
        from transformers import AutoModelForMaskedLM

        from bucketing.kinds.sparse.heads import SpladeHead
        from bucketing.model.head import load_pretrained

        model = load_pretrained(AutoModelForMaskedLM, folder, **extra)
        return SpladeHead(model, pools(routes)), int(model.config.vocab_size), model

    def graph_engine(self, task: Any, graph: Any, engine_name: str) -> tuple[Any, Any]:
        """The graph's pooled vectors in row groups (`heads.OrtSpladeEngine`); the ready line says what the graph
        holds beside the logits."""
        from bucketing.kinds.sparse.heads import OrtSpladeEngine

        torch_engine = task.engine
        engine = OrtSpladeEngine(graph, pools(task.spec.routes), torch_engine.group_tokens)
        summed = any(pooling == "sum" for pooling, _ in engine.pools)
        task.ready_note += f"; {engine_name}: the graph also holds activations the size of a group's logits" + (
            ", and a float64 copy of them for the sum (twice that size)" if summed else ""
        )
        return engine, torch_engine.model

    def engine_refusal(self, routes: Mapping[str, Route], engine: str) -> str | None:
        """A SPLADE summing over its tokens on an engine whose declaration `sums_in_float32` (OpenVINO's CPU plugin
        has no float64; measured 2.3e-5 off encode(), tests/handler/sparse/test_onnxruntime.py, large sums, past
        engines.base.TOLERANCE)."""
        if not ENGINES[engine].sums_in_float32 or not any(pooling == "sum" for pooling, _ in pools(routes)):
            return None
        exact = [e.name for e in ENGINES.values() if e.serves_sparse and not e.sums_in_float32]
        return (
            f"a SPLADE summing over its tokens is served on engine {either(exact)} only ({engine} runs the graph's "
            "float64 sum in float32, up to 2.3e-5 off encode())"
        )


SPLADE = Splade()
