"""The classification kind (a sequence classifier or CrossEncoder): the model's logits, answered as scores by
its activation over id2label."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bucketing.answers import Answer
from bucketing.engines import Engine, load_engine
from bucketing.kinds.task import Rows, TaskHooks
from bucketing.model.chain import Chain, read_prompts
from bucketing.model.encoded import Encoded
from bucketing.model.head import ModelInfo


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
