"""TorchServe entry point: a thin adapter over the `bucketing` package (one class, and how TorchServe's request
headers are read)."""

from __future__ import annotations

import logging
import os
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import torch

from bucketing import worker
from bucketing.config import HandlerConfig
from bucketing.metrics import emit
from bucketing.protocols.base import Meta

if TYPE_CHECKING:
    from bucketing.kinds.task import Task
    from bucketing.model.tokenizer import Tokenizer
    from bucketing.planning.planner import CostModel
    from bucketing.serving.continuous import Pool
    from bucketing.serving.pipeline import Pipeline

logger = logging.getLogger(__name__)


class BucketingHandler:
    """Dynamic padding and length-aware bucketing for Hugging Face encoders (embedding, classification)."""

    def __init__(self) -> None:
        self.initialized = False

    def initialize(self, context: Any) -> None:
        model_config = getattr(context, "model_yaml_config", None)
        self.config = HandlerConfig.from_yaml(model_config)
        torch.set_num_threads(self.config.torch_threads)
        model_dir = os.path.join(context.system_properties.get("model_dir", "."), self.config.model_path)
        self.worker = worker.open(self.config, model_dir, context.system_properties.get("gpu_id"), model_config)
        logger.info("%s", self.worker.ready_line())
        self.initialized = True

    # What tests and tools read of the opened worker (its own, never copies).
    @property
    def task(self) -> Task:
        return self.worker.task

    @property
    def tokenizer(self) -> Tokenizer:
        return self.worker.tokenizer

    @property
    def cost(self) -> CostModel:
        return self.worker.cost

    @property
    def pipeline(self) -> Pipeline:
        return self.worker.pipeline

    @property
    def pool(self) -> Pool | None:
        return self.worker.pool

    def handle(self, data: list[Any], context: Any) -> list[str | bytes]:
        meta = [request_meta(context, i) for i in range(len(data))]
        model_name = getattr(context, "model_name", "")
        keys = request_keys(context, len(data)) if self.worker.pool is not None else None
        replies, stats = self.worker.serve(data, meta, keys, model_name)
        engine = self.worker.task.engine
        fidelity, shadow = engine.fidelity, engine.shadow  # a reduced dtype's: measured at load; sampled since
        cosine = fidelity.cosine_min if fidelity is not None else None
        samples = shadow.drain() if shadow is not None else None
        emit(getattr(context, "metrics", None), stats, cosine, samples, self.worker.config.capacity_tokens_per_s)
        for idx, reply in enumerate(replies):
            if reply is None:  # pending: no prediction in this response, so TorchServe sends it again next call
                context.request_ids.pop(idx)
                continue
            context.set_response_status(reply.status, HTTPStatus(reply.status).phrase, idx)
            context.set_response_content_type(idx, reply.content_type)
            for name, value in reply.headers:
                context.set_response_header(idx, name, value)
        return [b"" if r is None else r.body for r in replies]


def request_keys(context: Any, count: int) -> list[str]:
    """TorchServe's id of each request of the call (`context.request_ids`: position -> id), which a request
    keeps across the calls of continuous batching."""
    ids = getattr(context, "request_ids", None)
    if not isinstance(ids, dict) or any(i not in ids for i in range(count)):
        raise RuntimeError("handler.schedule continuous: TorchServe gave no request id for every request")
    return [str(ids[i]) for i in range(count)]


def request_meta(context: Any, idx: int) -> Meta:
    """The request's Content-Type (per parameter, then per request), `url_path` and headers, as TorchServe
    recorded them."""
    try:
        headers = context.get_all_request_header(idx) or {}
    except (AttributeError, IndexError, TypeError):
        return Meta()
    content_type = None
    for name in ("body", "data"):
        value = headers.get(name)
        if isinstance(value, dict) and value.get("content-type"):
            content_type = value["content-type"]
            break
    else:
        for key, value in headers.items():
            if isinstance(key, str) and key.lower() == "content-type" and isinstance(value, str):
                content_type = value
    url_path = headers.get("url_path")
    plain = {k.lower(): v for k, v in headers.items() if isinstance(k, str) and isinstance(v, str)}
    return Meta(content_type, url_path if isinstance(url_path, str) else None, plain)
