"""The `onnxruntime` engine: the graph exported when the archive was built (`model.onnx`, dynamic batch and
sequence axes), checked at load against the torch model on padded inputs; a difference over 1e-5, or any failure,
stops the worker with a start-up error (never a silent switch to another numeric path)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bucketing.config import HandlerConfig
from bucketing.engine_registry import ONNX_FILE as ONNX_FILE  # the file the build exports
from bucketing.engines.base import TOLERANCE, Engine, graph_feed, head_inputs, probe, probe_diff, probe_types
from bucketing.engines.torch_engine import TorchEngine
from bucketing.model.head import EngineError, Head, ModelInfo, WithStates, load_head

logger = logging.getLogger(__name__)

STATES = "token_embeddings"  # an embedding graph's second output: the encoder's token embeddings
# The attention the ONNX graph is exported from: eager has no IsNaN/Where mask subgraph, and measured 1.05x the
# SDPA export's req/s through TorchServe (README; `python -m bench.attention_export`).
ONNX_ATTENTION = "eager"
# ONNX Runtime's thread pools spin while waiting for work by default: with more than one thread a pass burnt CPU on
# the waiting threads, taken from the other workers on the same cores, and bought no latency here (a 4x32 pass on 2
# threads without it: 0.62x the CPU time in one run, 1.04x in another; README, "Engines", `bench.pass_cost --cuts`).
# With one thread (the default) there is no pool and nothing spins.
SPIN_OFF = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


class OrtEngine:
    """The exported graph on ONNX Runtime: the CUDA provider on a GPU worker when it is there, else the CPU's."""

    name = "onnxruntime"
    fidelity = None  # float32 only
    shadow = None

    def __init__(self, path: Path, threads: int, device: str) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        for pool in SPIN_OFF:  # threads that wait for work sleep: a spinning thread takes the core from other workers
            options.add_session_config_entry(pool, "0")
        options.log_severity_level = 3
        providers: list[Any] = ["CPUExecutionProvider"]
        if device.startswith("cuda"):
            if "CUDAExecutionProvider" in ort.get_available_providers():
                providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(device.split(":")[1])}))
            else:
                logger.warning("a GPU worker, but this onnxruntime has no CUDA provider: running on the CPU")
                device = "cpu"
        self.device = device
        self.session = ort.InferenceSession(str(path), options, providers=providers)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
    ) -> np.ndarray:
        first: np.ndarray = self.session.run(["output"], graph_feed(self.inputs, ids, mask, pool_mask, types))[0]
        return first

    @property
    def has_states(self) -> bool:
        """Whether the graph gives token embeddings (`states`): an embedding model's, exported since late chunking."""
        return STATES in self.outputs

    def states(self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None) -> tuple[Any, Any]:
        """The pooled outputs and the encoder's token embeddings of one pass."""
        pooled, tokens = self.session.run(["output", STATES], graph_feed(self.inputs, ids, mask, pool_mask))
        return pooled, tokens


def export_onnx(task: str, model_dir: str, path: Path) -> Path:
    """Export the task's head to ONNX with dynamic batch and sequence axes (done when an archive is built), from
    the model loaded with `ONNX_ATTENTION` (the worker checks the graph against torch within TOLERANCE)."""
    head, info = load_head(task, model_dir, ONNX_ATTENTION)
    config: Any = head.model.config
    masks = EXPORT_MASKS.get(config.model_type)
    head.masks = partial(masks, config) if masks is not None else None
    ids, mask, pool_mask = probe(info.vocab_size)
    inputs = head_inputs(head, ids, mask, pool_mask, probe_types(mask))
    names = list(head.inputs)
    axes = {
        **{name: {0: "batch", 1: "sequence"} for name in names},
        "output": getattr(head, "output_axes", {0: "batch"}),
    }
    outputs = ["output"]
    module: torch.nn.Module = head
    if isinstance(head, Head) and head.pooled:  # an embedding model: its token embeddings too (late chunking)
        module, outputs = WithStates(head).eval(), [*outputs, STATES]  # eval: export restores its mode
        axes[STATES] = {0: "batch", 1: "sequence"}
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                tuple(torch.from_numpy(a) for a in inputs),
                str(path),
                input_names=names,
                output_names=outputs,
                dynamic_axes=axes,
                opset_version=17,
                dynamo=False,
            )
    except Exception as e:  # noqa: BLE001 - a model the exporter cannot take: one line, and what serves it
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise EngineError(
            f"{model_dir}: the ONNX export of this {config.model_type} model failed ({type(e).__name__}: {first}); "
            "build it with --engine torch, which serves it exactly"
        ) from None
    head.masks = None  # the reference: transformers' own masks
    check_export(head, info, path, getattr(config, "sliding_window", None))
    return path


def check_export(
    head: Head,
    info: ModelInfo,
    path: Path,
    window: int | None,
    runner: Callable[[Path], Any] | None = None,
    engine: str = "onnxruntime",
) -> None:
    """The exported graph (run by `runner`, for `engine`: ONNX Runtime's unless told) against the torch head on
    padded rows long enough to cross the model's sliding window (if any), so the graph's masks are checked where the
    window bites; an EngineError past TOLERANCE."""
    length = min(info.max_positions, 2 * window + 8) if window else 24
    rng = np.random.default_rng(1)
    ids = rng.integers(min(1000, info.vocab_size // 2), info.vocab_size, size=(3, length), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, length // 2 :] = 0
    mask[2, length - 3 :] = 0
    try:
        got = (runner or (lambda p: OrtEngine(p, 1, "cpu")))(path)(ids, mask, mask, probe_types(mask))
        diff = float(
            np.abs(
                got
                - TorchEngine(head, "cpu", torch.float32, False, info.vocab_size)(ids, mask, mask, probe_types(mask))
            ).max()
        )
    except Exception as e:  # noqa: BLE001 - reported in one line
        diff, why = float("nan"), f" ({type(e).__name__}: {str(e).strip()[:160]})"
    else:
        why = ""
    if not diff <= TOLERANCE:
        raise EngineError(
            f"the exported ONNX graph on {engine} differs from the torch model by {diff:.2e} at {length} tokens{why}; "
            "build it with --engine torch, which serves it exactly"
        )


def window_masks(config: Any, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gemma3's attention masks by layer type, from plain tensor ops (transformers' mask functions do not export to
    ONNX): every real token (causal: every earlier one) for full attention, those within `sliding_window` for
    sliding attention; additive float32 masks, as eager attention takes them."""
    n = attention_mask.shape[1]
    positions = torch.arange(n, device=attention_mask.device)
    distance = positions.view(-1, 1) - positions.view(1, -1)  # query - key
    keep = attention_mask.bool().view(-1, 1, 1, n)
    window = int(config.sliding_window)
    if getattr(config, "use_bidirectional_attention", False):
        full, near = keep, keep & (distance.abs() < window)
    else:
        full, near = keep & (distance >= 0), keep & (distance >= 0) & (distance < window)
    low = torch.finfo(torch.float32).min  # the exported graph runs float32
    return {
        "full_attention": torch.where(full, 0.0, low).expand(-1, 1, n, n),
        "sliding_attention": torch.where(near, 0.0, low).expand(-1, 1, n, n),
    }


# Models whose exported graph takes its attention masks from `Head.masks` (by config.model_type).
EXPORT_MASKS: dict[str, Callable[[Any, torch.Tensor], Any]] = {"gemma3_text": window_masks}


def exported_graph(model_dir: str, engine: str = "onnxruntime") -> Path:
    """The graph the build exported into the model folder (for `engine`, which runs it); an EngineError naming the
    build command when absent."""
    path = Path(model_dir) / ONNX_FILE
    if not path.exists():
        raise EngineError(
            f"handler.engine {engine}: no {ONNX_FILE} in {model_dir}; build the archive with "
            f"`python -m model_store.build --engine {engine}` (it exports the graph)"
        )
    return path


def open_onnxruntime(
    head: Head, info: ModelInfo, config: HandlerConfig, model_dir: str, device: str, dtype: Any
) -> Engine:
    """The exported graph, checked against the torch model on padded inputs (an EngineError past TOLERANCE)."""
    path = exported_graph(model_dir)
    try:
        engine = OrtEngine(path, config.torch_threads, device)
        reference = TorchEngine(head, device, torch.float32, False, info.vocab_size)
        diff = probe_diff(engine, reference, info.vocab_size)
    except Exception as e:
        raise EngineError(
            f"handler.engine onnxruntime: {path} could not be checked against the torch model "
            f"({type(e).__name__}: {str(e)[:300]})"
        ) from e
    if not diff <= TOLERANCE:
        raise EngineError(
            f"handler.engine onnxruntime: {path} differs from the torch model by {diff:.2e} on padded "
            f"inputs (allowed: {TOLERANCE:g}); rebuild the archive from this model"
        )
    logger.info("onnxruntime engine checked against torch: max abs diff %.1e", diff)
    return engine


def sparse_graph(path: Path, threads: int, device: str) -> OrtEngine:
    """The sparse kind's exported graph on ONNX Runtime (`kinds.sparse.onnx`)."""
    return OrtEngine(path, threads, device)
