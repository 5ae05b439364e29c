"""The engines and the dtypes, one declaration each: what differs between torch, onnxruntime and openvino (or between
float32, float16 and bfloat16) is read from its declaration here, never tested by name elsewhere.

Pure, on the ground floor (no torch): `config` reads the names, the model kinds and the archive builder read the
declarations. An engine declares its name (`handler.engine`, `--engine`), the function that opens it (`module:function`
in `bucketing.engines`, imported when first used), the files its archive carries beside the model's and the function
that writes them at build, the dtypes it runs, whether it runs on the CPU on a GPU worker too, and for the sparse kind
the function that runs its exported graph (and whether it sums SPLADE in float32). Adding an engine is its module
(`bucketing.engines.<module>`: its class, `open`, and its sparse graph if it has one), its name in `EngineName` and
one line in `ENGINES`.

A dtype declares whether it is reduced (fewer bits than float32: its fidelity to float32 is measured) and the CPU
flags by which a CPU multiplies it natively (none: no CPU worker runs it).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

EngineName = Literal["torch", "onnxruntime", "openvino"]  # `handler.engine`, `--engine`
DType = Literal["float32", "float16", "bfloat16"]  # `handler.dtype`, `--dtype`

DTYPES: tuple[DType, ...] = get_args(DType)
ENGINE_NAMES: tuple[EngineName, ...] = get_args(EngineName)
ONNX_FILE = "model.onnx"  # the graph the build exports for the graph engines
# /proc/cpuinfo flags of a CPU that multiplies bfloat16 in hardware (Intel AMX tiles; AVX512-BF16 dot products).
NATIVE_BF16 = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class DTypeKind:
    """A dtype as the handler and the archive builder see it."""

    name: DType
    reduced: bool = True  # fewer bits than float32: its fidelity to float32 is measured (probe set, shadow checks)
    cpu_flags: tuple[str, ...] | None = (
        None  # a CPU worker runs it where one of these flags is; (): any CPU; None: none
    )


DTYPE_KINDS: dict[str, DTypeKind] = {  # by name (a str key: config and flags look names up)
    d.name: d
    for d in (
        DTypeKind("float32", reduced=False, cpu_flags=()),
        DTypeKind("float16"),  # a CUDA GPU's
        DTypeKind("bfloat16", cpu_flags=NATIVE_BF16),
    )
}
assert tuple(DTYPE_KINDS) == DTYPES, "DType and DTYPE_KINDS name the same dtypes, in order"
EXACT_DTYPE: DType = next(d.name for d in DTYPE_KINDS.values() if not d.reduced)  # float32: the default
CPU_DTYPES: tuple[DType, ...] = tuple(d.name for d in DTYPE_KINDS.values() if d.cpu_flags is not None)


def is_reduced(dtype: str | None) -> bool:
    """Whether `dtype` (None: the default, float32) is a reduced one."""
    return dtype is not None and DTYPE_KINDS[dtype].reduced


class EngineError(RuntimeError):
    """An engine that cannot serve this model exactly: the worker does not start (`model.head` re-exports it)."""


def _imported(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(f"bucketing.engines.{module}"), name)


@dataclass(frozen=True)
class EngineKind:
    """An engine as the handler, the sparse kind and the archive builder see it: how it opens, what its archive
    carries, and what it runs."""

    name: EngineName
    opens: str  # `module:function` in bucketing.engines: (head, info, config, folder, device, torch dtype) -> Engine
    files: tuple[str, ...] = ()  # what it reads beside the model's files; `prepares` writes them at build time
    prepares: str = ""  # `module:function`: (task, model folder, target file) -> the file written
    dtypes: tuple[DType, ...] = DTYPES  # the dtypes it runs (`handler.dtype`); its `open` takes each
    cpu_only: bool = False  # runs on the CPU on a GPU worker too (its dtypes checked as a CPU worker's)
    sparse_graph: str = ""  # `module:function`: (graph file, threads, device) -> the sparse kind's graph runner
    sums_in_float32: bool = False  # runs the sparse graph's float64 sum (SPLADE's sum pooling) in float32
    packages: tuple[str, ...] = ()  # the Python packages its worker imports (requirements.txt pins them)
    build_packages: tuple[str, ...] = ()  # and those its build's export needs besides (torch.onnx.export: onnx)

    def check_installed(self, doing: str, build: bool = False) -> None:
        """An EngineError in one line naming the package this engine needs and cannot import here (without it, a
        build said the graph "differs from the torch model by nan" and a worker died on a long ModuleNotFoundError
        that TorchServe restarted forever): the worker's packages, and the build's with `build`."""
        needed = (*self.build_packages, *self.packages) if build else self.packages
        missing = [p for p in needed if importlib.util.find_spec(p) is None]
        if missing:
            raise EngineError(
                f"handler.engine {self.name}: {doing} needs the Python package {' and '.join(missing)}, which is not "
                f"installed here (pip install -r requirements.txt, which pins it; or another handler.engine: "
                f"{either(tuple(e for e in ENGINE_NAMES if e != self.name))})"
            )

    @property
    def is_default(self) -> bool:
        """The default engine (`handler.engine`'s default, the one a reduced dtype is built for): the first."""
        return self.name == ENGINE_NAMES[0]

    @property
    def exports_graph(self) -> bool:
        """Whether it runs a graph the build exports into the archive (else the Hugging Face model itself)."""
        return bool(self.files)

    @property
    def serves_sparse(self) -> bool:
        """Whether the sparse kind runs on it: the torch model itself, or its exported graph (`sparse_graph`)."""
        return not self.exports_graph or bool(self.sparse_graph)

    def open(self, head: Any, info: Any, config: Any, model_dir: str, device: str, dtype: Any) -> Any:
        """The engine on this model (an `engines.Engine`), opened now."""
        self.check_installed("the worker")
        return _imported(self.opens)(head, info, config, model_dir, device, dtype)

    def prepare_into(self, task: str, model_dir: str, folder: Path) -> None:
        """Write the files this engine needs into the archive's model folder."""
        self.check_installed("the build", build=True)
        if self.prepares:
            for name in self.files:
                _imported(self.prepares)(task, model_dir, folder / name)

    def graph(self, path: Path, threads: int, device: str) -> Any:
        """The sparse kind's exported graph at `path` on this engine (a callable from numpy ids and mask)."""
        self.check_installed("the worker")
        return _imported(self.sparse_graph)(path, threads, device)


ENGINES: dict[str, EngineKind] = {  # by `handler.engine` name (a str key: config and flags look names up)
    e.name: e
    for e in (
        EngineKind("torch", "torch_engine:open_torch"),
        EngineKind(
            "onnxruntime",
            "onnx_engine:open_onnxruntime",
            (ONNX_FILE,),
            "onnx_engine:export_onnx",
            ("float32",),
            sparse_graph="onnx_engine:sparse_graph",
            packages=("onnxruntime",),
            build_packages=("onnx",),
        ),
        EngineKind(
            "openvino",
            "openvino_engine:open_openvino",
            (ONNX_FILE,),
            "openvino_engine:export_openvino",
            CPU_DTYPES,
            cpu_only=True,
            sparse_graph="openvino_engine:sparse_graph",
            sums_in_float32=True,
            packages=("openvino",),
            build_packages=("onnx",),
        ),
    )
}
assert tuple(ENGINES) == ENGINE_NAMES, "EngineName and ENGINES name the same engines, in order"
DEFAULT_ENGINE: EngineName = ENGINE_NAMES[0]
SPARSE_ENGINES: tuple[EngineName, ...] = tuple(e.name for e in ENGINES.values() if e.serves_sparse)


def either(names: Sequence[str]) -> str:
    """Names as a line says them: "torch", "torch or onnxruntime", "torch, onnxruntime or openvino"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
