"""Forward-pass engines: the model's pooled output from padded ids and mask (the mean over real tokens for
embeddings, the logits for classification), as float32 numpy, on the CPU or the worker's GPU.

- `torch`: the Hugging Face model, eager or traced with TorchScript (the trace is checked against eager at load
  and dropped on any mismatch: both give the same numbers, the trace only faster);
- `onnxruntime`: the graph exported when the archive was built (`model.onnx`, dynamic batch and sequence axes),
  checked at load against the torch model on padded inputs; a difference over 1e-5, or any failure, stops the
  worker with a start-up error (never a silent switch to another numeric path).

A worker runs on `cuda:<gpu_id>` when TorchServe gave it a GPU (`gpu_id` in its system properties) and CUDA is
there, else on the CPU; `dtype` float16/bfloat16 is for CUDA only (torch engine).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from .config import ConfigError, HandlerConfig

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
TOLERANCE = 1e-5  # max abs difference of pooled outputs between an engine and the torch model
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Encoders whose position ids start after the padding index: max_position_embeddings - pad_token_id - 1 usable.
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "longformer", "mpnet")


class EngineError(RuntimeError):
    """An engine that cannot serve this model exactly: the worker does not start."""


class Engine(Protocol):
    name: str
    device: str

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class ModelInfo:
    """What the handler needs to know of the model besides its weights."""

    max_positions: int
    hidden_size: int
    labels: tuple[str, ...]
    vocab_size: int
    activation: str = "softmax"  # classification: how logits become scores (protocols.base.ACTIVATIONS)


class Head(torch.nn.Module):
    """The model and its pooling: the mean over real tokens (embedding) or the logits (classification)."""

    def __init__(self, model: torch.nn.Module, pooled: bool) -> None:
        super().__init__()
        self.model = model
        self.pooled = pooled

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]
        if not self.pooled:
            return out
        weights = attention_mask.unsqueeze(-1).to(out.dtype)
        return (out * weights).sum(dim=1) / weights.sum(dim=1)


def load_head(task: str, model_dir: str) -> tuple[Head, ModelInfo]:
    """The Hugging Face model for the task, in eval mode, with what the handler needs to know of it."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if task == "classification" else AutoModel
    model = auto.from_pretrained(model_dir).eval()
    cfg = model.config
    positions = usable_positions(cfg)
    try:
        labels = class_labels(cfg)
    except ValueError as e:
        raise EngineError(f"{model_dir}: {e}") from None
    info = ModelInfo(positions, int(cfg.hidden_size), labels, int(cfg.vocab_size), activation(cfg))
    return Head(model, pooled=task != "classification").eval(), info


def class_labels(config: Any) -> tuple[str, ...]:
    """A classifier's label names in logit order; duplicate names are a ValueError (one score each is kept)."""
    id2label = {int(k): v for k, v in (config.id2label or {}).items()}
    labels = tuple(str(id2label.get(i, f"LABEL_{i}")) for i in range(int(config.num_labels)))
    twice = sorted({name for name in labels if labels.count(name) > 1})
    if twice:
        raise ValueError(f"config.json id2label names {', '.join(map(repr, twice))} for more than one class; "
                         "give every class its own name in id2label (e.g. LABEL_0, LABEL_1, ...)")  # fmt: skip
    return labels


# A CrossEncoder's config names its activation by class (sentence_transformers.activation_fn).
CROSS_ENCODER_ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity", "Softmax": "softmax"}


def activation(config: Any) -> str:
    """How a classifier's logits become scores: the CrossEncoder's own activation when its config names one,
    else as Hugging Face's text-classification pipeline decides (sigmoid for one label or a multi-label model,
    softmax over the labels otherwise)."""
    named = str((getattr(config, "sentence_transformers", None) or {}).get("activation_fn") or "")
    if named:
        short = named.rsplit(".", 1)[-1]
        if short not in CROSS_ENCODER_ACTIVATIONS:
            raise EngineError(f"config.json sentence_transformers.activation_fn {named!r} is not served; served: "
                              f"{', '.join(CROSS_ENCODER_ACTIVATIONS)}")  # fmt: skip
        return CROSS_ENCODER_ACTIVATIONS[short]
    if int(config.num_labels) == 1 or getattr(config, "problem_type", None) == "multi_label_classification":
        return "sigmoid"
    return "softmax"


def usable_positions(config: Any) -> int:
    """Tokens a model takes: max_position_embeddings, less the offset of RoBERTa-style position ids."""
    positions = int(getattr(config, "max_position_embeddings", 512))
    if config.model_type in OFFSET_POSITIONS and getattr(config, "pad_token_id", None) is not None:
        positions -= int(config.pad_token_id) + 1
    return positions


def select_device(gpu_id: Any, cuda_available: bool) -> str:
    """`cuda:<gpu_id>` when TorchServe gave the worker a GPU and CUDA is there, else `cpu`."""
    if gpu_id is None or gpu_id == "" or not cuda_available:
        return "cpu"
    return f"cuda:{int(gpu_id)}"


def check_dtype(config: HandlerConfig, device: str) -> torch.dtype:
    if config.dtype != "float32" and device == "cpu":
        raise ConfigError(f"handler.dtype: got {config.dtype!r} on the CPU; allowed: float32 (float16 and bfloat16 "
                          "are for a worker with a CUDA GPU)")  # fmt: skip
    if config.dtype != "float32" and config.engine == "onnxruntime":
        raise ConfigError(f"handler.dtype: got {config.dtype!r} with handler.engine onnxruntime; allowed: float32 "
                          "(the exported graph is float32; use engine: torch for float16/bfloat16)")  # fmt: skip
    return DTYPES[config.dtype]


def probe(vocab_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Padded inputs to compare engines on: three rows of 24 tokens, two of them padded."""
    rng = np.random.default_rng(seed)
    low = min(1000, vocab_size // 2)
    ids = rng.integers(low, max(low + 1, min(2000, vocab_size)), size=(3, 24), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 17:] = 0
    return ids, mask


class TorchEngine:
    """The model on torch, eager or traced with TorchScript."""

    name = "torch"

    def __init__(self, head: Head, device: str, dtype: torch.dtype, torchscript: bool, vocab_size: int) -> None:
        self.device = device
        self.head = head.to(device=device, dtype=dtype) if dtype != torch.float32 else head.to(device)
        self.traced: torch.jit.ScriptModule | None = self._trace(vocab_size) if torchscript else None

    def _run(self, module: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = module(torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device))
            return out.float().cpu().numpy()

    def _trace(self, vocab_size: int) -> torch.jit.ScriptModule | None:
        ids, mask = probe(vocab_size)
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                example = (torch.from_numpy(ids[:2, :16]).to(self.device), torch.ones((2, 16), dtype=torch.long,
                                                                                       device=self.device))  # fmt: skip
                traced = torch.jit.trace(self.head, example, strict=False)
            diff = float(np.abs(self._run(traced, ids, mask) - self._run(self.head, ids, mask)).max())
            if diff > TOLERANCE:
                raise ValueError(f"traced output differs from eager by {diff:.2e}")
            return traced
        except Exception as e:  # noqa: BLE001 - tracing is an optimisation; eager gives the same numbers
            logger.warning("TorchScript trace unusable (%s: %s); using the eager model", type(e).__name__, str(e)[:200])
            return None

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._run(self.traced if self.traced is not None else self.head, ids, mask)


class OrtEngine:
    """The exported graph on ONNX Runtime: the CUDA provider on a GPU worker when it is there, else the CPU's."""

    name = "onnxruntime"

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

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]


def export_onnx(task: str, model_dir: str, path: Path) -> Path:
    """Export the task's head to ONNX with dynamic batch and sequence axes (done when an archive is built)."""
    head, info = load_head(task, model_dir)
    ids, mask = probe(info.vocab_size)
    axes = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "sequence"},
        "output": {0: "batch"},
    }
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(head, (torch.from_numpy(ids), torch.from_numpy(mask)), str(path),
                          input_names=["input_ids", "attention_mask"], output_names=["output"], dynamic_axes=axes,
                          opset_version=17, dynamo=False)  # fmt: skip
    return path


def load_engine(config: HandlerConfig, model_dir: str, gpu_id: Any = None) -> tuple[Engine, ModelInfo]:
    """The configured engine for the model, checked; and what the handler needs to know of the model."""
    device = select_device(gpu_id, torch.cuda.is_available())
    dtype = check_dtype(config, device)
    head, info = load_head(config.task, model_dir)
    if config.engine == "torch":
        return TorchEngine(head, device, dtype, config.torchscript, info.vocab_size), info
    path = Path(model_dir) / ONNX_FILE
    if not path.exists():
        raise EngineError(f"handler.engine onnxruntime: no {ONNX_FILE} in {model_dir}; build the archive with "
                          "`python -m model_store.build --engine onnxruntime` (it exports the graph)")  # fmt: skip
    try:
        engine = OrtEngine(path, config.torch_threads, device)
        ids, mask = probe(info.vocab_size)
        reference = TorchEngine(head, device, torch.float32, False, info.vocab_size)(ids, mask)
        diff = float(np.abs(engine(ids, mask) - reference).max())
    except Exception as e:
        raise EngineError(f"handler.engine onnxruntime: {path} could not be checked against the torch model "
                          f"({type(e).__name__}: {str(e)[:300]})") from e  # fmt: skip
    if not diff <= TOLERANCE:
        raise EngineError(f"handler.engine onnxruntime: {path} differs from the torch model by {diff:.2e} on padded "
                          f"inputs (allowed: {TOLERANCE:g}); rebuild the archive from this model")  # fmt: skip
    logger.info("onnxruntime engine checked against torch: max abs diff %.1e", diff)
    return engine, info
