"""The `openvino` engine: the graph the archive's build exported for onnxruntime (`model.onnx`, dynamic batch and
sequence axes), compiled by OpenVINO for the CPU per worker: the worker's threads, one stream, no core pinning
(workers share the cores), and its inference precision always stated (`PRECISIONS`; OpenVINO picks bf16 by itself on
a CPU with bf16 when none is given, this one included: never left to it).

float32 is checked at load against the torch model on padded inputs, as onnxruntime's graph is: a difference over
1e-5, or any failure, stops the worker in one line. bfloat16 (on a CPU that multiplies it natively, as for torch) is
measured against the float32 torch model on the probe set (`torch_engine.fidelity_gate`: the ready line, the gauge,
`handler.min_cosine`, `handler.fidelity_sample`), and refused in one line where OpenVINO would not run its matrix
products in bf16 (`bf16_refusal`: the compiled model's own runtime precisions say so).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bucketing.config import HandlerConfig
from bucketing.engines import precision
from bucketing.engines.base import TOLERANCE, Engine, graph_feed, probe_diff
from bucketing.engines.onnx_engine import ONNX_ATTENTION, STATES, check_export, export_onnx, exported_graph
from bucketing.engines.shadow import Shadow
from bucketing.engines.torch_engine import TorchEngine, fidelity_gate
from bucketing.model.head import EngineError, Head, ModelInfo, load_head

logger = logging.getLogger(__name__)

# handler.dtype -> OpenVINO's INFERENCE_PRECISION_HINT (always given; float16 has no CPU worker)
PRECISIONS = {"float32": "f32", "bfloat16": "bf16"}
# The compiled model's layers that carry its matrix products (what bf16 is for).
PRODUCTS = ("FullyConnected", "MatMul")
# `infer` reads our arrays in place (it copies one only if it is not C-contiguous or of another dtype) and returns
# views: by default it copied every input in, and every output (the token embeddings too) into arrays it returned
# and we dropped. The answer is still copied once out of the request's output tensor, which the next pass reuses.
SHARED = {"share_inputs": True, "share_outputs": True}


class OvEngine:
    """The exported graph compiled by OpenVINO for the CPU, in one inference precision."""

    name = "openvino"
    device = "cpu"
    fidelity: precision.Fidelity | None = None  # bf16's, measured against float32 at load
    shadow: Shadow | None = None  # bf16's shadow checks (`handler.fidelity_sample`), with `reference`
    reference: TorchEngine | None = None

    def __init__(self, path: Path, threads: int, dtype: str) -> None:
        import openvino as ov

        core = ov.Core()
        model = core.read_model(str(path))
        self.compiled = core.compile_model(
            model,
            "CPU",
            {
                "INFERENCE_PRECISION_HINT": PRECISIONS[dtype],
                "INFERENCE_NUM_THREADS": threads,
                "NUM_STREAMS": 1,
                "PERFORMANCE_HINT": "LATENCY",
                "ENABLE_CPU_PINNING": False,
            },
        )
        self.precision = str(self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name())  # f32, bf16
        self.request = self.compiled.create_infer_request()
        self.inputs = [i.get_any_name() for i in model.inputs]
        self.outputs = [o.get_any_name() for o in model.outputs]

    @property
    def has_states(self) -> bool:
        """Whether the graph gives token embeddings (`states`): an embedding model's, exported since late chunking."""
        return STATES in self.outputs

    def states(self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None) -> tuple[Any, Any]:
        """The pooled outputs and the encoder's token embeddings of one pass."""
        self.request.infer(graph_feed(self.inputs, ids, mask, pool_mask), **SHARED)
        pooled, tokens = (self.request.get_tensor(self.compiled.output(n)).data for n in ("output", STATES))
        return np.array(pooled, dtype=np.float32, copy=True), np.array(tokens, dtype=np.float32, copy=True)

    def runtime_precisions(self) -> Counter[str]:
        """How many of the compiled model's matrix-product layers (`PRODUCTS`) run in each precision."""
        found: Counter[str] = Counter()
        for op in self.compiled.get_runtime_model().get_ops():
            info = op.get_rt_info()
            if str(info["layerType"].astype(str)) in PRODUCTS:
                found[str(info["runtimePrecision"].astype(str))] += 1
        return found

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
    ) -> np.ndarray:
        self.request.infer(graph_feed(self.inputs, ids, mask, pool_mask, types), **SHARED)
        out: np.ndarray = np.array(self.request.get_tensor(self.compiled.output("output")).data, dtype=np.float32)
        if self.shadow is not None and self.reference is not None:
            TorchEngine._check(self.shadow, self.reference, out, ids, mask, pool_mask, types)
        return out


def bf16_refusal(capabilities: list[str], hint: str, products: Counter[str]) -> str | None:
    """Why a bfloat16 worker must not start on OpenVINO (one line), or None: OpenVINO does not list BF16 among the
    CPU's capabilities, the compiled model's precision is not bf16, or none of its matrix products runs in bf16 (it
    would run float32 and call it bfloat16)."""
    if "BF16" not in capabilities:
        why = f"OpenVINO lists no BF16 among this CPU's capabilities ({', '.join(capabilities)})"
    elif hint != "bf16":
        why = f"OpenVINO compiled the graph in {hint}, not bf16"
    elif not products.get("bf16"):
        ran = ", ".join(f"{n} in {p}" for p, n in sorted(products.items())) or "none found"
        why = f"none of the compiled graph's matrix products runs in bf16 ({ran})"
    else:
        return None
    return f"handler.dtype bfloat16 on engine openvino: {why}; use dtype float32, or engine torch"


def export_openvino(task: str, model_dir: str, path: Path) -> Path:
    """onnxruntime's export (`onnx_engine.export_onnx`: the same graph), then that graph compiled by OpenVINO in f32
    and checked against the torch head as the export checks it on ONNX Runtime (an EngineError past TOLERANCE)."""
    export_onnx(task, model_dir, path)
    head, info = load_head(task, model_dir, ONNX_ATTENTION)
    window = getattr(head.model.config, "sliding_window", None)
    check_export(head, info, path, window, lambda p: OvEngine(p, 1, "float32"), "openvino")
    return path


def open_openvino(
    head: Head, info: ModelInfo, config: HandlerConfig, model_dir: str, device: str, dtype: Any
) -> Engine:
    """The exported graph on OpenVINO: float32 checked against the torch model on padded inputs (an EngineError past
    TOLERANCE); bfloat16 through `bf16_refusal` and the fidelity gate."""
    import openvino as ov

    path = exported_graph(model_dir, "openvino")
    if device != "cpu":
        logger.warning("a GPU worker, but the openvino engine runs on the CPU: running on the CPU")
    reference = TorchEngine(head, "cpu", torch.float32, False, info.vocab_size)
    if dtype != torch.float32:
        engine = OvEngine(path, config.torch_threads, config.dtype)
        refusal = bf16_refusal(
            list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")),
            engine.precision,
            engine.runtime_precisions(),
        )
        if refusal:
            raise EngineError(refusal)
        gated: Engine = fidelity_gate(lambda: engine, reference, info, config, model_dir)
        return gated
    try:
        engine = OvEngine(path, config.torch_threads, "float32")
        diff = probe_diff(engine, reference, info.vocab_size)
    except Exception as e:
        raise EngineError(
            f"handler.engine openvino: {path} could not be checked against the torch model "
            f"({type(e).__name__}: {' '.join(str(e).split())[:300]})"
        ) from e
    if engine.precision != "f32" or not diff <= TOLERANCE:
        raise EngineError(
            f"handler.engine openvino: {path} compiled in {engine.precision} differs from the torch model by "
            f"{diff:.2e} on padded inputs (allowed: {TOLERANCE:g}); use engine onnxruntime or torch"
        )
    logger.info("openvino engine checked against torch: max abs diff %.1e", diff)
    return engine


def sparse_graph(path: Path, threads: int, device: str) -> OvEngine:
    """The sparse kind's exported graph compiled by OpenVINO (`kinds.sparse.onnx`), in float32: sparse models are
    served in float32 only."""
    return OvEngine(path, threads, "float32")
