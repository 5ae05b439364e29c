"""TorchServe entry point: a thin adapter over the `bucketing` package (one class, and how TorchServe's request
headers are read)."""

from __future__ import annotations

import logging
import os
from http import HTTPStatus
from typing import Any

import torch

from bucketing.config import HandlerConfig
from bucketing.kinds import load_task
from bucketing.kinds.task import Rows, reach
from bucketing.metrics import emit
from bucketing.model.tokenizer import Tokenizer
from bucketing.pipeline import Pipeline, make_planner
from bucketing.planning.calibrate import fit_cost, measure
from bucketing.planning.continuous import Pool, check_model_config
from bucketing.planning.planner import CostModel
from bucketing.protocols import Reply
from bucketing.protocols.base import Meta

logger = logging.getLogger(__name__)


class BucketingHandler:
    """Dynamic padding and length-aware bucketing for Hugging Face encoders (embedding, classification)."""

    def __init__(self) -> None:
        self.initialized = False

    def initialize(self, context: Any) -> None:
        self.config = HandlerConfig.from_yaml(getattr(context, "model_yaml_config", None))
        torch.set_num_threads(self.config.torch_threads)
        model_dir = os.path.join(context.system_properties.get("model_dir", "."), self.config.model_path)
        self.task = load_task(self.config, model_dir, context.system_properties.get("gpu_id"))
        chain = self.task.chain
        self.tokenizer = Tokenizer(
            self.task.tokenizer_dir or model_dir,  # a sparse Router's: its MLM transformer's folder
            reach(self.task, self.config.max_length),  # max_length, or where the task cuts an input type further
            lower_case=bool(chain and chain.do_lower_case),
        )
        self.cost = self._cost_model()
        self.pipeline = Pipeline(self.config, self.tokenizer, self.task, make_planner(self.config, self.cost))
        self.pool = None
        if self.config.schedule == "continuous":
            check_model_config(getattr(context, "model_yaml_config", None))
            self.pool = Pool(self.pipeline, self.cost)
        described = f", model chain {chain.describe()}" if chain is not None else ""
        described += self.task.ready_note  # a sparse model's routes and memory per pass
        note = self.pipeline.limit_note()
        self.fidelity = self.task.engine.fidelity  # a reduced dtype's, measured at load
        described += f", {self.fidelity.describe()}" if self.fidelity is not None else ""
        logger.info("bucketing handler ready: %s%s, cost model %s%s", self.config, described, self.cost, note)
        self.initialized = True

    def _cost_model(self) -> CostModel:
        c = self.config.cost
        configured = CostModel(c.forward_overhead_us, c.per_token_us, c.per_token_sq_us)
        if not c.calibrate or self.config.strategy != "bucketed":
            return configured
        pad = self.tokenizer.pad_id + 1

        def forward(rows: int, length: int) -> None:
            self.task.forward(Rows.plain(rows, length, pad))

        return fit_cost(measure(forward, self.config.max_length), configured)

    def handle(self, data: list[Any], context: Any) -> list[str | bytes]:
        meta = [request_meta(context, i) for i in range(len(data))]
        model_name = getattr(context, "model_name", "")
        if self.pool is None:
            served, stats = self.pipeline.serve(data, meta, model_name)
            replies: list[Reply | None] = list(served)
        else:
            replies, stats = self.pool.serve(data, meta, request_keys(context, len(data)), model_name)
        cosine = self.fidelity.cosine_min if self.fidelity is not None else None
        emit(getattr(context, "metrics", None), stats, cosine)
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
