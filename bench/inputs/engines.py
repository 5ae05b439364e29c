"""The handler's engines as the bench reads them, from this one module: a rename of the handler's registry is a line
here. `engine_kinds()` is the registry, each engine by name with how it opens (`.open`), the dtypes it runs
(`.dtypes`) and the files its archive carries beside the model's (`.files`); no bench module names an engine to
decide what to do with it, so a new engine there needs no bench edit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bucketing.engine_registry import EngineKind, EngineName


def engine_kinds() -> Mapping[str, EngineKind]:
    """The handler's engine registry, by `handler.engine` name (pure: no engine is imported until one opens)."""
    from bucketing.engine_registry import ENGINES

    return ENGINES


def engine_names() -> tuple[EngineName, ...]:
    """Every engine's name, in the registry's order (what `--engines` takes)."""
    from bucketing.engine_registry import ENGINE_NAMES

    return ENGINE_NAMES


def cpu_dtypes(engine: str, cpuinfo: str) -> tuple[str, ...]:
    """The dtypes `engine` runs on a CPU worker of this CPU (`cpuinfo`: /proc/cpuinfo's text), as the handler says."""
    from bucketing.engines import cpu_dtypes as handler_cpu_dtypes

    return handler_cpu_dtypes(engine, cpuinfo)


def reference() -> tuple[str, str]:
    """The engine and dtype every other is checked against at start-up: the handler's defaults (torch, float32)."""
    from bucketing.config import HandlerConfig

    defaults = HandlerConfig()
    return defaults.engine, defaults.dtype
