"""The two tasks over an engine's output: embeddings (the model's chain; L2-normalised as it says) and classification
(the model's logits, scored by its activation over id2label), and one answer per text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .answers import Answer
from .chain import Chain, ChainError, read_chain, read_prompts
from .config import HandlerConfig
from .engines import Engine, load_engine
from .head import EngineError, ModelInfo
from .kinds import KINDS, refused_folder
from .task import Rows, Task, TaskHooks
from .tokenizer import Encoded


class EmbeddingTask(TaskHooks):
    """The model's module chain (pooling, Dense) in the engine; normalised when answered (`normalize`: the
    chain's Normalize, or the handler's setting; a request may ask otherwise)."""

    name = "embedding"
    labels = None

    def __init__(self, engine: Engine, info: ModelInfo, normalize: bool) -> None:
        self.engine = engine
        self.max_positions = info.max_positions
        self.dimensions = info.hidden_size
        self.chain = info.chain
        self.normalize = normalize

    def forward(self, rows: Rows) -> np.ndarray:
        """Pooled outputs of a padded sub-batch, each row's leading (prompt) tokens `skips` left out of pooling."""
        return self.engine(rows.ids, rows.mask, rows.pool_mask())

    @property
    def settings(self) -> Chain:
        return self.chain

    def answer(self, output: np.ndarray, encoded: Encoded) -> Answer:
        return Answer(output, len(encoded.ids), encoded.truncated, normalize=self.normalize)

    @staticmethod
    def load(config: Any, model_dir: str, gpu_id: Any = None) -> EmbeddingTask:
        engine, info = load_engine(config, model_dir, gpu_id)
        return EmbeddingTask(engine, info, normalizes(config.normalize, info.chain))

    @staticmethod
    def read_settings(folder: Path) -> Chain:
        """The folder's module chain; ChainError for a folder of a kind with a head of its own."""
        other = refused_folder(KINDS["embedding"], folder)
        if other is not None:
            raise ChainError(f"{folder}: a {other.saved_as} folder; build it with --task {other.name}")
        return read_chain(folder)

    @staticmethod
    def describe(folder: Path) -> dict[str, Any] | None:
        return read_chain(folder).describe()


class ClassificationTask(TaskHooks):
    """Sequence classification: the logits, answered as scores by the model's activation (softmax over labels;
    sigmoid for one label or a multi-label model; the CrossEncoder's own when its config names one)."""

    name = "classification"
    chain = None  # no module chain follows a classifier

    def __init__(self, engine: Engine, info: ModelInfo) -> None:
        self.engine = engine
        self.max_positions = info.max_positions
        self.labels = info.labels
        self.dimensions = len(info.labels)
        self.activation = info.activation
        self.settings = info.chain  # a CrossEncoder's prompts (no module chain follows a classifier)

    def forward(self, rows: Rows) -> np.ndarray:
        """The logits of a padded sub-batch (its token types for text pairs; zeros for single texts)."""
        return self.engine(rows.ids, rows.mask, types=rows.types)

    def answer(self, output: np.ndarray, encoded: Encoded) -> Answer:
        return Answer(output, len(encoded.ids), encoded.truncated, self.labels, self.activation)

    @staticmethod
    def load(config: Any, model_dir: str, gpu_id: Any = None) -> ClassificationTask:
        return ClassificationTask(*load_engine(config, model_dir, gpu_id))

    @staticmethod
    def read_settings(folder: Path) -> Chain:
        """A CrossEncoder's prompts (no module chain follows a classifier)."""
        return read_prompts(folder)


def load_task(config: HandlerConfig, model_dir: str, gpu_id: int | None = None) -> Task:
    """The configured task (its kind's) on the configured engine, on the worker's GPU when it has one."""
    kind = KINDS[config.task]
    refusal = kind.refused(config.engine, config.dtype, "handler.dtype")
    if refusal is not None:
        raise EngineError(refusal)
    return kind.implementation().load(config, model_dir, gpu_id)


def normalizes(setting: str, chain: Chain) -> bool:
    """Whether embeddings are L2-normalised by default: forced by `handler.normalize: true|false`; with `auto`,
    as the sentence-transformers chain says (it ends in Normalize), and always for a plain Hugging Face folder."""
    if setting != "auto":
        return setting == "true"
    return chain.normalize if chain.normalize is not None else True
