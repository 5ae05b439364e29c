"""TorchServe entry point: a thin adapter over the `bucketing` package (this module defines one class)."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from bucketing import pipeline
from bucketing.calibrate import fit_cost, measure
from bucketing.config import ConfigError, HandlerConfig
from bucketing.metrics import emit
from bucketing.planner import CostModel
from bucketing.tasks import Tokenizer, load_task

logger = logging.getLogger(__name__)


class BucketingHandler:
    """Dynamic padding and length-aware bucketing for Hugging Face encoders (embedding, classification)."""

    def __init__(self) -> None:
        self.initialized = False

    def initialize(self, context: Any) -> None:
        self.config = HandlerConfig.from_yaml(getattr(context, "model_yaml_config", None))
        torch.set_num_threads(self.config.torch_threads)
        model_dir = os.path.join(context.system_properties.get("model_dir", "."), self.config.model_path)
        self.task = load_task(self.config.task, model_dir, self.config.normalize, self.config.torchscript)
        if self.config.max_length > self.task.max_positions:
            raise ConfigError(
                f"handler.max_length: got {self.config.max_length}; allowed: at most the model's "
                f"max_position_embeddings ({self.task.max_positions})"
            )
        self.tokenizer = Tokenizer(model_dir, self.config.max_length)
        self.cost = self._cost_model()
        self.plan = pipeline.make_planner(self.config, self.cost)
        logger.info("bucketing handler ready: %s, cost model %s", self.config, self.cost)
        self.initialized = True

    def _cost_model(self) -> CostModel:
        c = self.config.cost
        configured = CostModel(c.forward_overhead_us, c.per_token_us, c.per_token_sq_us)
        if not c.calibrate or self.config.strategy != "bucketed":
            return configured
        pad = self.tokenizer.pad_id + 1

        def forward(rows: int, length: int) -> None:
            self.task.forward(torch.full((rows, length), pad, dtype=torch.long), None)

        return fit_cost(measure(forward, self.config.max_length), configured)

    def handle(self, data: list[Any], context: Any) -> list[str]:
        prepared = self.preprocess(data, context)
        model_name = getattr(context, "model_name", "")
        try:
            computed = self.inference(prepared)
            emit(getattr(context, "metrics", None), computed.stats)
            responses = self.postprocess(prepared, computed, model_name)
        except Exception:  # noqa: BLE001 - isolate a poison request instead of failing its neighbours
            logger.exception("batch of %d failed; retrying its requests one by one", len(data))
            responses = [self._alone(prepared, i, model_name) for i in range(len(data))]
        if len(responses) != len(data):
            raise RuntimeError(f"{len(data)} requests but {len(responses)} responses")
        for idx, response in enumerate(responses):
            context.set_response_status(response.status, response.phrase, idx)
            context.set_response_content_type(idx, "application/json")
        return [r.body for r in responses]

    def preprocess(self, data: list[Any], context: Any) -> pipeline.Prepared:
        content_types = [pipeline.content_type(context, i) for i in range(len(data))]
        return pipeline.prepare(data, content_types, self.config, self.tokenizer)

    def inference(self, prepared: pipeline.Prepared) -> pipeline.Computed:
        return pipeline.compute(prepared, self.plan, self.task, self.tokenizer.pad_id)

    def postprocess(
        self, prepared: pipeline.Prepared, computed: pipeline.Computed, model_name: str = ""
    ) -> list[pipeline.Response]:
        return pipeline.respond(prepared, computed, self.task, model_name)

    def _alone(self, prepared: pipeline.Prepared, idx: int, model_name: str) -> pipeline.Response:
        one = pipeline.Prepared(
            (prepared.parsed[idx],), tuple(pipeline.Item(0, it.encoded) for it in prepared.items if it.request == idx)
        )
        try:
            computed = pipeline.compute(one, self.plan, self.task, self.tokenizer.pad_id)
            return self.postprocess(one, computed, model_name)[0]
        except Exception as e:  # noqa: BLE001 - answered as a 500 for this request alone
            logger.exception("request %d failed alone", idx)
            return pipeline.failure(f"inference failed: {type(e).__name__}")
