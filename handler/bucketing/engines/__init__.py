"""Forward-pass engines, one module each behind one interface (`base.Engine`): the model's output from padded ids
and mask (for embeddings, the module chain of a sentence-transformers folder after the encoder: its pooling over a
pooling mask, then its Dense layers; for classification, the logits), as float32 numpy, on the CPU or the worker's
GPU. `torch_engine` runs the Hugging Face model (and every reduced dtype), `onnx_engine` the exported graph on
ONNX Runtime, `openvino_engine` the same graph compiled by OpenVINO for the CPU (float32, or bfloat16 where the CPU
multiplies it natively).

A worker runs on `cuda:<gpu_id>` when TorchServe gave it a GPU (`gpu_id` in its system properties) and CUDA is
there, else on the CPU. `ENGINE_KINDS` below is the registry: adding an engine is its module and one line there
(and its name in `config.ENGINES`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bucketing.config import ENGINES, ConfigError, HandlerConfig
from bucketing.engines import precision
from bucketing.engines.base import Engine, select_device
from bucketing.engines.onnx_engine import ONNX_FILE, export_onnx, open_onnxruntime
from bucketing.engines.openvino_engine import export_openvino, open_openvino
from bucketing.engines.torch_engine import DTYPES, open_torch
from bucketing.model.head import EngineError, Head, ModelInfo, load_head, reduced_weights

__all__ = ["ENGINE_KINDS", "Engine", "EngineKind", "check_dtype", "cpu_dtypes", "load_engine", "select_device"]


def check_dtype(config: HandlerConfig, device: str) -> torch.dtype:
    kind = ENGINE_KINDS[config.engine]
    if config.dtype not in kind.dtypes:
        raise ConfigError(
            f"handler.dtype: got {config.dtype!r} with handler.engine {config.engine}; allowed: "
            f"{', '.join(kind.dtypes)} (the {config.engine} engine runs {' or '.join(kind.dtypes)} only; use engine: "
            f"torch for {config.dtype})"
        )
    if device == "cpu" or kind.cpu_only:
        precision.check_cpu_dtype(config.dtype, precision.cpu_info())
    return DTYPES[config.dtype]


@dataclass(frozen=True)
class EngineKind:
    """An engine as the handler and the archive builder see it: how it opens, and what its archive carries."""

    name: str
    open: Callable[[Head, ModelInfo, HandlerConfig, str, str, Any], Engine]  # head, info, config, folder, device, dtype
    files: tuple[str, ...] = ()  # what it reads beside the model's files; `prepare` writes them at build time
    prepare: Callable[[str, str, Path], Path] | None = None  # (task, model folder, target file)
    dtypes: tuple[str, ...] = tuple(DTYPES)  # the dtypes it runs (`handler.dtype`); its `open` takes each
    cpu_only: bool = False  # runs on the CPU on a GPU worker too (its dtypes checked as a CPU worker's)

    def prepare_into(self, task: str, model_dir: str, folder: Path) -> None:
        """Write the files this engine needs into the archive's model folder."""
        if self.prepare is not None:
            for name in self.files:
                self.prepare(task, model_dir, folder / name)


# The engines, by `handler.engine` name: adding one is its module (its class and `open`), and a line here (and in
# ENGINES).
ENGINE_KINDS = {
    kind.name: kind
    for kind in (
        EngineKind("torch", open_torch),
        EngineKind("onnxruntime", open_onnxruntime, (ONNX_FILE,), export_onnx, dtypes=("float32",)),
        EngineKind("openvino", open_openvino, (ONNX_FILE,), export_openvino, precision.CPU_DTYPES, cpu_only=True),
    )
}
assert tuple(ENGINE_KINDS) == ENGINES, "bucketing.config.ENGINES and engines.ENGINE_KINDS must name the same engines"


def cpu_dtypes(engine: str, cpuinfo: str) -> tuple[str, ...]:
    """The dtypes `engine` runs on a CPU worker of this CPU (`cpuinfo`: /proc/cpuinfo's text): those of its own that a
    CPU runs natively (float32 always; bfloat16 on amx_bf16 or avx512_bf16). Its start-up may still refuse one
    (openvino's bfloat16 where OpenVINO would not run the matrix products in bf16)."""
    out = []
    for dtype in ENGINE_KINDS[engine].dtypes:
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
    if dtype == torch.float32:
        saved = next((p.dtype for p in head.model.parameters() if p.is_floating_point()), torch.float32)
        if saved != torch.float32:
            raise EngineError(reduced_weights(model_dir, str(saved).removeprefix("torch.")))
    return ENGINE_KINDS[config.engine].open(head, info, config, model_dir, device, dtype), info
