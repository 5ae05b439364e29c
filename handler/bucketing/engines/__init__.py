"""Forward-pass engines, one module each behind one interface (`base.Engine`): the model's output from padded ids
and mask (for embeddings, the module chain of a sentence-transformers folder after the encoder: its pooling over a
pooling mask, then its Dense layers; for classification, the logits), as float32 numpy, on the CPU or the worker's
GPU. `torch_engine` runs the Hugging Face model (and every reduced dtype), `onnx_engine` the exported graph on
ONNX Runtime, `openvino_engine` the same graph compiled by OpenVINO for the CPU (float32, or bfloat16 where the CPU
multiplies it natively).

A worker runs on `cuda:<gpu_id>` when TorchServe gave it a GPU (`gpu_id` in its system properties) and CUDA is
there, else on the CPU. The registry is `bucketing.engine_registry.ENGINES` (pure: `config` reads its names): adding an
engine is its module here and one line there.
"""

from __future__ import annotations

from typing import Any

import torch

from bucketing.config import ConfigError, HandlerConfig
from bucketing.engine_registry import DEFAULT_ENGINE, DTYPE_KINDS, ENGINES, EngineKind
from bucketing.engines import precision
from bucketing.engines.base import Engine, select_device
from bucketing.engines.torch_engine import DTYPES
from bucketing.model.head import EngineError, ModelInfo, load_head, reduced_weights

ENGINE_KINDS = ENGINES  # the registry's former name

__all__ = [
    "ENGINES",
    "ENGINE_KINDS",
    "Engine",
    "EngineKind",
    "check_dtype",
    "cpu_dtypes",
    "load_engine",
    "select_device",
]


def check_dtype(config: HandlerConfig, device: str) -> torch.dtype:
    kind = ENGINES[config.engine]
    if config.dtype not in kind.dtypes:
        raise ConfigError(
            f"handler.dtype: got {config.dtype!r} with handler.engine {config.engine}; allowed: "
            f"{', '.join(kind.dtypes)} (the {config.engine} engine runs {' or '.join(kind.dtypes)} only; use engine: "
            f"{DEFAULT_ENGINE} for {config.dtype})"
        )
    if device == "cpu" or kind.cpu_only:
        precision.check_cpu_dtype(config.dtype, precision.cpu_info())
    return DTYPES[config.dtype]


def cpu_dtypes(engine: str, cpuinfo: str) -> tuple[str, ...]:
    """The dtypes `engine` runs on a CPU worker of this CPU (`cpuinfo`: /proc/cpuinfo's text): those of its own that a
    CPU runs natively (float32 always; bfloat16 on amx_bf16 or avx512_bf16). Its start-up may still refuse one
    (openvino's bfloat16 where OpenVINO would not run the matrix products in bf16)."""
    out = []
    for dtype in ENGINES[engine].dtypes:
        try:
            precision.check_cpu_dtype(dtype, cpuinfo)
        except ConfigError:
            continue
        out.append(dtype)
    return tuple(out)


def load_engine(config: HandlerConfig, model_dir: str, gpu_id: Any = None) -> tuple[Engine, ModelInfo]:
    """The configured engine for the model, checked; and what the handler needs to know of the model."""
    device = select_device(gpu_id, torch.cuda.is_available())
    dtype = check_dtype(config, device)
    head, info = load_head(config.task, model_dir)
    if not DTYPE_KINDS[config.dtype].reduced:
        saved = next((p.dtype for p in head.model.parameters() if p.is_floating_point()), torch.float32)
        if saved != torch.float32:
            raise EngineError(reduced_weights(model_dir, str(saved).removeprefix("torch.")))
    engine: Engine = ENGINES[config.engine].open(head, info, config, model_dir, device, dtype)
    return engine, info
