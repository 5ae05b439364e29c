"""A call never outlives TorchServe's responseTimeout: after its share no pass starts, each request with rows left
unrun gets its own 503 naming the limit, and the requests whose rows all ran are answered exactly (a fake clock
that each forward pass advances: nothing here depends on the machine's speed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bucketing.planning.planner import CostModel
from bucketing.serving import deadline, passes, pipeline
from tests.handler.test_handler import alone, make_handler, mixed_texts, serve


class Clock:
    """`time` for the serving loop and its passes: `perf_counter` reads a counter that each forward pass advances."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class SlowTask:
    """The worker's task, each forward pass taking `seconds` of the fake clock."""

    def __init__(self, task: Any, clock: Clock, seconds: float) -> None:
        self._task, self._clock, self._seconds = task, clock, seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def forward(self, rows: Any) -> Any:
        self._clock.now += self._seconds
        return self._task.forward(rows)


TEN_SECONDS = CostModel(overhead_us=10e6, per_token_us=0.0, per_token_sq_us=0.0)  # a pass, as the fake clock runs it


def test_response_timeout_comes_from_the_model_config_else_torchserves_default():
    assert deadline.response_timeout_s({"responseTimeout": 600, "handler": {}}) == 600.0
    assert deadline.response_timeout_s({"handler": {}}) == deadline.RESPONSE_TIMEOUT_S == 120
    assert deadline.response_timeout_s(None) == 120.0
    assert deadline.response_timeout_s({"responseTimeout": "soon"}) == 120.0


def test_requests_left_unrun_at_the_deadline_get_503_and_the_rest_are_answered(tiny_embedder_dir, monkeypatch):
    handler, context = make_handler(tiny_embedder_dir, max_length=32, max_batch_tokens=32)
    texts = mixed_texts(24, seed=3)
    reference = {t: np.array(alone(handler, context, t)["embedding"]) for t in texts}
    clock = Clock()
    monkeypatch.setattr(pipeline, "time", clock)  # the call's start
    monkeypatch.setattr(passes, "time", clock)  # each pass's start, against the deadline
    work = handler.pipeline
    monkeypatch.setattr(work, "task", SlowTask(work.task, clock, seconds=10.0))
    monkeypatch.setattr(work, "cost", TEN_SECONDS)  # the worker's estimate of a pass: the fake clock's 10 s
    monkeypatch.setattr(work, "response_timeout", 40.0)  # deadline 30 s: passes at 0, 10, 20 (ending by 30)
    rows: list[dict[str, Any]] = [{"body": {"text": t}} for t in texts[:4]] + [{"body": {"texts": texts[4:]}}]
    answers = serve(handler, context, rows)
    assert clock.now == 30.0  # three passes ran; the fourth would have ended at 40, past the deadline
    statuses = [status for status, _ in answers]
    assert 200 in statuses and 503 in statuses
    for (status, body), row in zip(answers, rows, strict=True):
        if status == 503:
            assert "responseTimeout (40 s)" in body["message"] and "send fewer or shorter texts" in body["message"]
            continue
        sent: list[str] = row["body"].get("texts") or [row["body"]["text"]]
        got = body if isinstance(body, list) else [body]
        for text, answer in zip(sent, got, strict=True):
            assert np.max(np.abs(np.array(answer["embedding"]) - reference[text])) <= 1e-5
    assert answers[4][0] == 503  # the bulk request's 20 texts need more than four passes of 32 tokens
    monkeypatch.setattr(work, "response_timeout", 1e9)
    assert [s for s, _ in serve(handler, context, rows)] == [200] * 5  # the worker serves on


@pytest.mark.parametrize("strategy", ["dynamic", "static"])
def test_no_pass_starts_that_would_end_past_the_deadline(tiny_embedder_dir, monkeypatch, strategy):
    """Under dynamic and static a delivered batch is one large pass (a 131k-padded-token pass took 54-66 s on a Zen 3
    core): the guard used to start it whenever the clock was short of 75% of responseTimeout, and the call ran 146 s
    against 120, so TorchServe killed the worker and failed the whole batch. Now a pass whose estimated end (the
    worker's cost model) is past the deadline does not start: its requests get their 503 and the worker lives."""
    handler, context = make_handler(tiny_embedder_dir, max_length=32, strategy=strategy)
    clock = Clock()
    monkeypatch.setattr(pipeline, "time", clock)
    monkeypatch.setattr(passes, "time", clock)
    work = handler.pipeline
    monkeypatch.setattr(work, "task", SlowTask(work.task, clock, seconds=60.0))
    monkeypatch.setattr(work, "cost", CostModel(overhead_us=60e6, per_token_us=0.0, per_token_sq_us=0.0))
    monkeypatch.setattr(work, "response_timeout", 40.0)  # deadline 30 s; the one pass is estimated to take 60
    rows = [{"body": {"texts": mixed_texts(8, seed=4)}}, {"body": {"text": "short"}}]
    answers = serve(handler, context, rows)
    assert clock.now == 0.0 and [status for status, _ in answers] == [503, 503]  # nothing started, nothing ran over
    assert "responseTimeout (40 s)" in answers[0][1]["message"]
    monkeypatch.setattr(work, "cost", CostModel(overhead_us=20e6, per_token_us=0.0, per_token_sq_us=0.0))
    assert [status for status, _ in serve(handler, context, rows)] == [200, 200] and clock.now == 60.0


def test_every_strategy_s_worker_calibrates_the_cost_its_deadline_reads(tiny_embedder_dir):
    """The deadline guard reads the worker's cost model: fitted to this engine's passes under every strategy (it
    was fitted under bucketed only; dynamic and static kept the configured constants)."""
    configured = CostModel()
    for strategy in ("bucketed", "dynamic", "static"):
        handler, _ = make_handler(tiny_embedder_dir, max_length=32, strategy=strategy, cost={"calibrate": True})
        assert handler.pipeline.cost is handler.worker.cost and handler.worker.cost != configured, strategy
