"""The one way to open a worker: the task on its engine, the tokenizer as that task reads texts, the cost model
(calibrated on the engine when the config says so) and the pipeline over them. The handler, the bench's references
and calibration, and the tests all open a worker (or just its model, `load`) here, so none can drift from another."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from bucketing.config import HandlerConfig
from bucketing.kinds.task import Rows, Task, load_kind, reach
from bucketing.metrics import BatchStats
from bucketing.model.head import EngineError
from bucketing.model.tokenizer import Tokenizer
from bucketing.model_kinds import MODEL_KINDS
from bucketing.planning.calibrate import fit_cost, measure
from bucketing.planning.planner import CostModel
from bucketing.protocols import Reply
from bucketing.protocols.base import Meta
from bucketing.serving.continuous import Pool, check_model_config
from bucketing.serving.deadline import response_timeout_s
from bucketing.serving.passes import make_planner
from bucketing.serving.pipeline import Pipeline


@dataclass(frozen=True)
class Model:
    """A worker's model: its task on the configured engine, and the tokenizer that reads texts for it."""

    task: Task
    tokenizer: Tokenizer


def load(config: HandlerConfig, model_dir: str, gpu_id: int | None = None) -> Model:
    """The configured task and its tokenizer: the model folder's (a sparse Router's: its MLM transformer's), cut
    where the task reads texts (`reach`), lower-cased where the model's chain says so."""
    task = load_task(config, model_dir, gpu_id)
    chain = task.chain
    tokenizer = Tokenizer(
        task.tokenizer_dir or model_dir,
        reach(task, config.max_length),
        lower_case=bool(chain and chain.do_lower_case),
    )
    return Model(task, tokenizer)


def load_task(config: HandlerConfig, model_dir: str, gpu_id: int | None = None) -> Task:
    """The configured task (its kind's) on the configured engine, on the worker's GPU when it has one."""
    kind = MODEL_KINDS[config.task]
    refusal = kind.refused(config.engine, config.dtype, "handler.dtype")
    if refusal is not None:
        raise EngineError(refusal)
    return load_kind(kind, config, model_dir, gpu_id)


def cost_model(config: HandlerConfig, model: Model) -> CostModel:
    """The configured cost model, or, with `cost.calibrate`, one fitted to passes timed on this engine (the
    configured one where the fit fails): the bucketed planner's, and every strategy's deadline guard's estimate of
    when a pass would end."""
    c = config.cost
    configured = CostModel(c.forward_overhead_us, c.per_token_us, c.per_token_sq_us)
    if not c.calibrate:
        return configured
    return calibrated(model, config.max_length, configured)


def calibrated(model: Model, max_length: int, fallback: CostModel) -> CostModel:
    """A cost model fitted to passes of padding-free rows timed on this model's engine."""
    token = model.tokenizer.pad_id + 1

    def forward(rows: int, length: int) -> None:
        model.task.forward(Rows.plain(rows, length, token))

    return fit_cost(measure(forward, max_length), fallback)


WARM_UP_TOKENS = 16  # the warm-up pass's one row


def warm_up(model: Model, max_length: int) -> float:
    """One forward pass of one short row before the worker says it is ready (first-call costs: lazy allocations,
    a trace's or graph's first run, kernel selection, paid here rather than by the first request); its ms."""
    started = time.perf_counter()
    model.task.forward(Rows.plain(1, max(1, min(WARM_UP_TOKENS, max_length)), model.tokenizer.pad_id + 1))
    return (time.perf_counter() - started) * 1000.0


@dataclass(frozen=True)
class Worker:
    """An opened worker: its model, cost model and pipeline, and the continuous pool when it schedules so."""

    config: HandlerConfig
    model: Model
    cost: CostModel
    pipeline: Pipeline
    pool: Pool | None
    warm_up_ms: float = 0.0  # the warm-up pass run before it was ready (`warm_up`)

    @property
    def task(self) -> Task:
        return self.model.task

    @property
    def tokenizer(self) -> Tokenizer:
        return self.model.tokenizer

    def ready_line(self) -> str:
        """What the worker logs once it is ready: its settings, the model's chain, routes and fidelity, its cost
        model, and what its max_length means."""
        chain = self.task.chain
        described = f", model chain {chain.describe()}" if chain is not None else ""
        described += self.task.ready_note  # a sparse model's routes and memory per pass
        fidelity = self.task.engine.fidelity  # a reduced dtype's, measured at load
        described += f", {fidelity.describe()}" if fidelity is not None else ""
        shadow = self.task.engine.shadow
        described += f", {shadow.describe()}" if shadow is not None else ""
        capacity = self.config.capacity_tokens_per_s
        described += f", capacity {capacity:g} tokens/s at p99" if capacity else ", capacity unset"
        return (
            f"bucketing handler ready: {self.config}{described}, cost model {self.cost}{self.pipeline.limit_note()}, "
            f"warmed up (1 pass, {self.warm_up_ms:.1f} ms)"
        )

    def serve(
        self, rows: list[Any], meta: list[Meta], keys: list[str] | None, model_name: str
    ) -> tuple[list[Reply | None], BatchStats]:
        """One reply per row (None: pending, answered on a later call under continuous batching); `keys`:
        TorchServe's id of each request (read only by the continuous pool)."""
        if self.pool is None:
            served, stats = self.pipeline.serve(rows, meta, model_name)
            return list(served), stats
        if keys is None:
            raise ValueError("continuous batching needs TorchServe's id of each request")
        return self.pool.serve(rows, meta, keys, model_name)


def open(  # `bucketing.worker.open`; shadows the builtin in this module only
    config: HandlerConfig,
    model_dir: str,
    gpu_id: int | None = None,
    model_yaml_config: Any = None,
    cost: CostModel | None = None,
) -> Worker:
    """A worker of this config over the model folder (on the worker's GPU when it has one), ready to serve;
    `model_yaml_config`: TorchServe's whole model-config, which continuous batching checks; `cost`: the cost model
    of a worker of the same config already opened in this process on the same cores (a host's sibling worker),
    taken as is instead of calibrating again."""
    model = load(config, model_dir, gpu_id)
    if cost is None:
        cost = cost_model(config, model)
    warm_ms = warm_up(model, config.max_length)  # before shadow checks start: not a served text
    shadow = model.task.engine.shadow  # shadow checks sample served texts only: from now on, not calibration's passes
    if shadow is not None:
        shadow.start()
    timeout = response_timeout_s(model_yaml_config)
    pipeline = Pipeline(config, model.tokenizer, model.task, make_planner(config, cost), timeout, cost)
    pool = None
    if config.scheduling.pools:
        check_model_config(model_yaml_config)
        pool = Pool(pipeline, cost)
    return Worker(config, model, cost, pipeline, pool, warm_ms)


__all__ = ["Model", "Worker", "calibrated", "cost_model", "load", "load_task", "open"]
