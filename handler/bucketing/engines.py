"""Forward-pass engines: the model's output from padded ids and mask (for embeddings, the module chain of a
sentence-transformers folder after the encoder: its pooling over a pooling mask, then its Dense layers; for
classification, the logits), as float32 numpy, on the CPU or the worker's GPU.

- `torch`: the Hugging Face model, eager or traced with TorchScript (the trace is checked against eager at load
  and dropped on any mismatch: both give the same numbers, the trace only faster);
- `onnxruntime`: the graph exported when the archive was built (`model.onnx`, dynamic batch and sequence axes),
  checked at load against the torch model on padded inputs; a difference over 1e-5, or any failure, stops the
  worker with a start-up error (never a silent switch to another numeric path).

A worker runs on `cuda:<gpu_id>` when TorchServe gave it a GPU (`gpu_id` in its system properties) and CUDA is
there, else on the CPU; `dtype` other than float32 runs on the torch engine (float16 on CUDA; bfloat16 on CUDA or a
CPU that multiplies it natively), its encoder in that dtype and the pooling and Dense after it in float32, with its
fidelity to float32 measured at load (`precision`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from . import precision
from .config import ENGINES, ConfigError, HandlerConfig
from .head import EngineError, Head, ModelInfo, load_head, reduced_weights

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
# The attention the ONNX graph is exported from: eager has no IsNaN/Where mask subgraph, and measured 1.05x the
# SDPA export's req/s through TorchServe (README; `python -m bench.attention_export`).
ONNX_ATTENTION = "eager"
TOLERANCE = 1e-5  # max abs difference of pooled outputs between an engine and the torch model
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Engine(Protocol):
    name: str
    device: str

    @property
    def fidelity(self) -> precision.Fidelity | None:
        """A reduced dtype's fidelity to float32, measured at load; None in float32."""
        ...

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
    ) -> np.ndarray: ...


def select_device(gpu_id: Any, cuda_available: bool) -> str:
    """`cuda:<gpu_id>` when TorchServe gave the worker a GPU and CUDA is there, else `cpu`."""
    if gpu_id is None or gpu_id == "" or not cuda_available:
        return "cpu"
    return f"cuda:{int(gpu_id)}"


def check_dtype(config: HandlerConfig, device: str) -> torch.dtype:
    if device == "cpu":
        precision.check_cpu_dtype(config.dtype, precision.cpu_info())
    if config.dtype != "float32" and ENGINE_KINDS[config.engine].float32_only:
        raise ConfigError(
            f"handler.dtype: got {config.dtype!r} with handler.engine {config.engine}; allowed: float32 "
            f"(the {config.engine} engine runs float32 only; use engine: torch for float16/bfloat16)"
        )
    return DTYPES[config.dtype]


def probe(vocab_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Padded inputs to compare engines on: three rows of 24 tokens, two of them padded, and a pooling mask
    that leaves two leading (prompt) tokens of the last row out."""
    rng = np.random.default_rng(seed)
    low = min(1000, vocab_size // 2)
    ids = rng.integers(low, max(low + 1, min(2000, vocab_size)), size=(3, 24), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 17:] = 0
    pool_mask = mask.copy()
    pool_mask[2, :2] = 0
    return ids, mask, pool_mask


def probe_types(mask: np.ndarray) -> np.ndarray:
    """Token types to compare engines on: the second half of each row's real tokens of type 1 (a pair)."""
    types = np.zeros_like(mask)
    for row, n in enumerate(mask.sum(axis=1)):
        types[row, n // 2 : n] = 1
    return types


class TorchEngine:
    """The model on torch, eager or traced with TorchScript."""

    name = "torch"
    fidelity: precision.Fidelity | None = None  # a reduced dtype's, measured against float32 at load

    def __init__(self, head: Head, device: str, dtype: torch.dtype, torchscript: bool, vocab_size: int) -> None:
        self.device = device
        self.head = head.to(device)
        self.head.model.to(dtype=dtype)  # the encoder only: pooling and Dense after it stay float32
        self.traced: torch.jit.ScriptModule | None = self._trace(vocab_size) if torchscript else None

    def _run(self, module: Any, *arrays: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = module(*(torch.from_numpy(a).to(self.device) for a in arrays))
            result: np.ndarray = out.float().cpu().numpy()
            return result

    def _trace(self, vocab_size: int) -> torch.jit.ScriptModule | None:
        ids, mask, pool_mask = probe(vocab_size)
        inputs = head_inputs(self.head, ids, mask, pool_mask, probe_types(mask))
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                first = torch.from_numpy(inputs[0][:2, :16]).to(self.device)
                ones = torch.ones((2, 16), dtype=torch.long, device=self.device)
                traced: torch.jit.ScriptModule = torch.jit.trace(
                    self.head, (first, *[ones] * (len(inputs) - 1)), strict=False
                )
            diff = float(np.abs(self._run(traced, *inputs) - self._run(self.head, *inputs)).max())
            if diff > TOLERANCE:
                raise ValueError(f"traced output differs from eager by {diff:.2e}")
            return traced
        except Exception as e:  # noqa: BLE001 - tracing is an optimisation; eager gives the same numbers
            logger.warning("TorchScript trace unusable (%s: %s); using the eager model", type(e).__name__, str(e)[:200])
            return None

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
    ) -> np.ndarray:
        module = self.traced if self.traced is not None else self.head
        return self._run(module, *head_inputs(self.head, ids, mask, pool_mask, types))


def head_inputs(
    head: Head, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
) -> tuple[np.ndarray, ...]:
    """What a head takes, in its order: ids and mask; for embeddings the pooling mask (the attention mask unless
    told); for a pair classifier the token types (zeros unless told)."""
    if head.pooled:
        return ids, mask, mask if pool_mask is None else pool_mask
    if head.types:
        return ids, mask, np.zeros_like(ids) if types is None else types
    return ids, mask


class OrtEngine:
    """The exported graph on ONNX Runtime: the CUDA provider on a GPU worker when it is there, else the CPU's."""

    name = "onnxruntime"
    fidelity = None  # float32 only

    def __init__(self, path: Path, threads: int, device: str) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
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

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, pool_mask: np.ndarray | None = None, types: np.ndarray | None = None
    ) -> np.ndarray:
        feed = {
            "input_ids": ids,
            "attention_mask": mask,
            "pool_mask": mask if pool_mask is None else pool_mask,
            "token_type_ids": np.zeros_like(ids) if types is None else types,
        }
        first: np.ndarray = self.session.run(None, {name: feed[name] for name in self.inputs})[0]
        return first


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
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                head,
                tuple(torch.from_numpy(a) for a in inputs),
                str(path),
                input_names=names,
                output_names=["output"],
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


def check_export(head: Head, info: ModelInfo, path: Path, window: int | None) -> None:
    """The exported graph against the torch head on padded rows long enough to cross the model's sliding window
    (if any), so the graph's masks are checked where the window bites; an EngineError past TOLERANCE."""
    length = min(info.max_positions, 2 * window + 8) if window else 24
    rng = np.random.default_rng(1)
    ids = rng.integers(min(1000, info.vocab_size // 2), info.vocab_size, size=(3, length), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, length // 2 :] = 0
    mask[2, length - 3 :] = 0
    try:
        got = OrtEngine(path, 1, "cpu")(ids, mask, mask, probe_types(mask))
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
            f"the exported ONNX graph differs from the torch model by {diff:.2e} at {length} tokens{why}; "
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


def open_torch(head: Head, info: ModelInfo, config: HandlerConfig, model_dir: str, device: str, dtype: Any) -> Engine:
    return TorchEngine(head, device, dtype, config.torchscript, info.vocab_size)


def exported_graph(model_dir: str) -> Path:
    """The graph the build exported into the model folder; an EngineError naming the build command when absent."""
    path = Path(model_dir) / ONNX_FILE
    if not path.exists():
        raise EngineError(
            f"handler.engine onnxruntime: no {ONNX_FILE} in {model_dir}; build the archive with "
            "`python -m model_store.build --engine onnxruntime` (it exports the graph)"
        )
    return path


def open_onnxruntime(
    head: Head, info: ModelInfo, config: HandlerConfig, model_dir: str, device: str, dtype: Any
) -> Engine:
    """The exported graph, checked against the torch model on padded inputs (an EngineError past TOLERANCE)."""
    path = exported_graph(model_dir)
    try:
        engine = OrtEngine(path, config.torch_threads, device)
        ids, mask, pool_mask = probe(info.vocab_size)
        reference = TorchEngine(head, device, torch.float32, False, info.vocab_size)(
            ids, mask, pool_mask, probe_types(mask)
        )
        diff = float(np.abs(engine(ids, mask, pool_mask, probe_types(mask)) - reference).max())
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


@dataclass(frozen=True)
class EngineKind:
    """An engine as the handler and the archive builder see it: how it opens, and what its archive carries."""

    name: str
    open: Callable[[Head, ModelInfo, HandlerConfig, str, str, Any], Engine]  # head, info, config, folder, device, dtype
    files: tuple[str, ...] = ()  # what it reads beside the model's files; `prepare` writes them at build time
    prepare: Callable[[str, str, Path], Path] | None = None  # (task, model folder, target file)
    float32_only: bool = False

    def prepare_into(self, task: str, model_dir: str, folder: Path) -> None:
        """Write the files this engine needs into the archive's model folder."""
        if self.prepare is not None:
            for name in self.files:
                self.prepare(task, model_dir, folder / name)


# The engines, by `handler.engine` name: adding one is its class, its `open`, and a line here (and in ENGINES).
ENGINE_KINDS = {
    kind.name: kind
    for kind in (
        EngineKind("torch", open_torch),
        EngineKind("onnxruntime", open_onnxruntime, (ONNX_FILE,), export_onnx, float32_only=True),
    )
}
assert tuple(ENGINE_KINDS) == ENGINES, "bucketing.config.ENGINES and engines.ENGINE_KINDS must name the same engines"


def load_engine(config: HandlerConfig, model_dir: str, gpu_id: Any = None) -> tuple[Engine, ModelInfo]:
    """The configured engine for the model, checked; and what the handler needs to know of the model."""
    device = select_device(gpu_id, torch.cuda.is_available())
    dtype = check_dtype(config, device)
    head, info = load_head(config.task, model_dir)
    if dtype == torch.float32:
        saved = next((p.dtype for p in head.model.parameters() if p.is_floating_point()), torch.float32)
        if saved != torch.float32:
            raise EngineError(reduced_weights(model_dir, str(saved).removeprefix("torch.")))
        return ENGINE_KINDS[config.engine].open(head, info, config, model_dir, device, dtype), info
    return open_reduced(head, info, config, model_dir, device, dtype), info


def open_reduced(head: Head, info: ModelInfo, config: HandlerConfig, model_dir: str, device: str, dtype: Any) -> Engine:
    """The torch engine in a reduced dtype, its fidelity to the float32 model measured on `precision.PROBE_TEXTS`
    (an EngineError below `handler.min_cosine`)."""
    from .tokenizer import Tokenizer

    tokenizer = Tokenizer(model_dir, min(config.max_length, info.max_positions), bool(info.chain.do_lower_case))
    probes = precision.probe_inputs(tokenizer, pairs=config.task == "classification")
    reference = TorchEngine(head, device, torch.float32, False, info.vocab_size)(*probes)
    engine = TorchEngine(head, device, dtype, config.torchscript, info.vocab_size)
    engine.fidelity = precision.measure(config.dtype, reference, engine(*probes), config.task, info.activation)
    refusal = engine.fidelity.refusal(config.min_cosine)
    if refusal:
        raise EngineError(refusal)
    return engine
