"""The deadline guard: a call never outlives TorchServe's `responseTimeout` (which restarts the worker and fails the
whole batch). No pass starts whose end, as the worker's cost model estimates it, is past `DEADLINE_SHARE` of it (nor
any pass after that one: `passes.compute`), and each request whose rows did not all run gets its own 503 naming the
limit and the fix (`out_of_time`), while the requests whose rows all ran are answered."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from bucketing.planning.planner import CostModel
from bucketing.protocols import Incoming
from bucketing.protocols.base import Unavailable
from bucketing.serving.passes import Deadline, Item

logger = logging.getLogger(__name__)

RESPONSE_TIMEOUT_S = 120  # TorchServe's default_response_timeout: a model-config without responseTimeout gets it
DEADLINE_SHARE = 0.75  # of responseTimeout: no pass starts after it (the last pass and the answers fit the rest)


def response_timeout_s(model_config: Any) -> float:
    """TorchServe's responseTimeout of the model-config (its top-level key, seconds), else TorchServe's default."""
    top = model_config if isinstance(model_config, dict) else {}
    value = top.get("responseTimeout", RESPONSE_TIMEOUT_S)
    return float(value) if isinstance(value, (int, float)) and value > 0 else float(RESPONSE_TIMEOUT_S)


def deadline_of(start: float, response_timeout: float, cost: CostModel) -> Deadline:
    """The deadline of a call that started at `start` (a `time.perf_counter()` value): no pass estimated (by `cost`)
    to end past its share of responseTimeout."""
    return Deadline(start + DEADLINE_SHARE * response_timeout, cost)


def out_of_time(
    incoming: list[Incoming], items: Sequence[Item], outputs: list[np.ndarray | None], response_timeout: float
) -> tuple[list[Incoming], list[np.ndarray | None]]:
    """Each request with a row left unrun (None) and no outcome yet: a 503 naming the limit; its other rows'
    outputs dropped."""
    unrun = {item.request for item, output in zip(items, outputs) if output is None}
    late = {owner for owner in unrun if incoming[owner].request is not None}
    if not late:
        return incoming, outputs
    out = list(incoming)
    message = (
        f"the batch ran {DEADLINE_SHARE:.0%} of the worker's responseTimeout ({response_timeout:g} s) "
        "before this request's texts were all run; send fewer or shorter texts per request, or raise "
        "responseTimeout in the model-config (handler.schedule: continuous cuts a large request across calls)"
    )
    for owner in late:
        out[owner] = incoming[owner].fail(Unavailable("ServiceUnavailable", message))
    logger.warning("%d request(s) answered 503: the call reached its share of responseTimeout", len(late))
    kept = [None if item.request in late else output for item, output in zip(items, outputs)]
    return out, kept
