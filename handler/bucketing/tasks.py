"""The two tasks over an engine's pooled output: embeddings (optionally L2-normalised) and classification
(the model's logits, scored by its activation over id2label), and one answer per text."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .config import HandlerConfig
from .engines import Engine, ModelInfo, load_engine
from .protocols.base import Answer
from .tokenizer import Encoded


class Task(Protocol):
    """What the handler needs from a task: a forward pass per sub-batch, and one answer per text."""

    name: str
    max_positions: int
    dimensions: int  # embedding size, or number of labels
    labels: tuple[str, ...] | None  # class names (classification); None for embeddings
    engine: Engine

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray: ...

    def answer(self, output: np.ndarray, encoded: Encoded) -> Answer: ...


class EmbeddingTask:
    """Mean pooling over real tokens (in the engine), optionally L2-normalised."""

    name = "embedding"
    labels = None

    def __init__(self, engine: Engine, info: ModelInfo, normalize: bool) -> None:
        self.engine = engine
        self.max_positions = info.max_positions
        self.dimensions = info.hidden_size
        self.normalize = normalize

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        pooled = self.engine(ids, mask)
        if self.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), np.float32(1e-12))
        return pooled

    def answer(self, output: np.ndarray, encoded: Encoded) -> Answer:
        return Answer(output, len(encoded.ids), encoded.truncated)


class ClassificationTask:
    """Sequence classification: the logits, answered as scores by the model's activation (softmax over labels;
    sigmoid for one label or a multi-label model; the CrossEncoder's own when its config names one)."""

    name = "classification"

    def __init__(self, engine: Engine, info: ModelInfo) -> None:
        self.engine = engine
        self.max_positions = info.max_positions
        self.labels = info.labels
        self.dimensions = len(info.labels)
        self.activation = info.activation

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.engine(ids, mask)

    def answer(self, output: np.ndarray, encoded: Encoded) -> Answer:
        return Answer(output, len(encoded.ids), encoded.truncated, self.labels, self.activation)


def load_task(config: HandlerConfig, model_dir: str, gpu_id: int | None = None) -> Task:
    """The configured task on the configured engine, on the worker's GPU when it has one."""
    engine, info = load_engine(config, model_dir, gpu_id)
    if config.task == "classification":
        return ClassificationTask(engine, info)
    return EmbeddingTask(engine, info, config.normalize)
