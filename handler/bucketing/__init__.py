"""Length-aware bucketing for transformer encoders behind TorchServe, in layers (docs/architecture.md):

- `config`, `metrics`, `answers`: the worker's settings, its figures, and what the model answered per input;
- `model_kinds`: the model kinds' registry (pure: `Kind`, `MODEL_KINDS`, `KindName`);
- `kinds/`: one package or module per model kind (embedding, classification, sparse, multivector), each owning its
  task, folder reader and engine hooks;
- `engines/`: the engines' registry and one module per engine (torch, onnxruntime, openvino), with reduced-dtype
  fidelity; `engine_registry`: that registry's declarations (`ENGINES`, and the dtypes'), pure, on the ground floor;
- `model/`: the model as read from its folder (the sentence-transformers chain, the torch head, the tokenizer);
- `planning/`: the cost model and planner, calibration, the continuous scheduler's pick (pure);
- `protocols/`: the wire formats' registry and one module per format;
- `startup_checks`: the worker's settings checked against the loaded model, once at start;
- `serving/`: one delivered batch from rows to replies (`serving.pipeline`), and continuous batching's pool;
- `worker`: the one way to open a worker (`bucketing.worker.open`), which the handler, the bench and tests use.

The names below are this package's public ones, imported when first used (`bucketing.config` stays light).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bucketing.answers import Answer, Options
    from bucketing.config import ConfigError, HandlerConfig
    from bucketing.engine_registry import ENGINES
    from bucketing.engines import ENGINE_KINDS, Engine, EngineKind
    from bucketing.kinds.task import Rows, Task
    from bucketing.model.head import EngineError
    from bucketing.model_kinds import MODEL_KINDS, Kind
    from bucketing.model_kinds import MODEL_KINDS as KINDS
    from bucketing.protocols import WIRES, Reply
    from bucketing.protocols.base import (
        BadRequest,
        FailedDependency,
        Meta,
        NotFound,
        RequestError,
        ServerError,
        TooLarge,
        TooManyRequests,
        Unavailable,
        Unprocessable,
        UnsupportedMediaType,
    )
    from bucketing.worker import Model, Worker
    from bucketing.worker import open as open_worker

_WHERE = {
    "Answer": "answers",
    "Options": "answers",
    "ConfigError": "config",
    "HandlerConfig": "config",
    "ENGINES": "engine_registry",
    "ENGINE_KINDS": "engines",
    "Engine": "engines",
    "EngineKind": "engines",
    "KINDS": "model_kinds:MODEL_KINDS",  # the former name of MODEL_KINDS, kept for callers
    "MODEL_KINDS": "model_kinds",
    "Kind": "model_kinds",
    "Rows": "kinds.task",
    "Task": "kinds.task",
    "EngineError": "model.head",
    "WIRES": "protocols",
    "Reply": "protocols",
    "Meta": "protocols.base",
    "RequestError": "protocols.base",
    "BadRequest": "protocols.base",
    "NotFound": "protocols.base",
    "TooLarge": "protocols.base",
    "UnsupportedMediaType": "protocols.base",
    "Unprocessable": "protocols.base",
    "FailedDependency": "protocols.base",
    "TooManyRequests": "protocols.base",
    "ServerError": "protocols.base",
    "Unavailable": "protocols.base",
    "Model": "worker",
    "Worker": "worker",
    "open_worker": "worker:open",
}

__all__ = [
    "Answer",
    "BadRequest",
    "ConfigError",
    "ENGINES",
    "ENGINE_KINDS",
    "Engine",
    "EngineError",
    "EngineKind",
    "FailedDependency",
    "HandlerConfig",
    "KINDS",
    "Kind",
    "MODEL_KINDS",
    "Meta",
    "Model",
    "NotFound",
    "Options",
    "Reply",
    "RequestError",
    "Rows",
    "ServerError",
    "Task",
    "TooLarge",
    "TooManyRequests",
    "Unavailable",
    "Unprocessable",
    "UnsupportedMediaType",
    "WIRES",
    "Worker",
    "open_worker",
]
assert sorted(__all__) == sorted(_WHERE), "__all__ and _WHERE name the same public names"


def __getattr__(name: str) -> Any:
    """A public name, from the module that defines it (imported now)."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attribute = _WHERE[name].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute or name)
