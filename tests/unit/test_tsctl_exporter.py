"""`python -m tsctl.exporter` without a server: TorchServe's figures read from its /metrics text and a model
description as 0.12 writes them, the series it serves (the declared names), and `drain`'s rule."""

from __future__ import annotations

import json
from typing import Any

from bucketing.metrics import QUEUE_GAUGES
from tsctl.client import Reply
from tsctl.exporter import ModelQueue, drain, per_model, poll, render

METRICS = """# TYPE ts_inference_requests_total counter
ts_inference_requests_total{model_name="m",model_version="default",hostname="h"} 130.0
# TYPE bucket_requests_total counter
bucket_requests_total{ModelName="m",Level="Model",Hostname="h"} 100.0
bucket_real_tokens_total{ModelName="m",Level="Model",Hostname="h"} 2500.0
"""
DESCRIBED = [{"modelName": "m", "batchSize": 8, "workers": [{"status": "READY"}], "jobQueueStatus": {
    "remainingCapacity": 246, "pendingRequests": 10}}]  # fmt: skip


class FakeClient:
    def __init__(self, pending: list[int]) -> None:
        self.pending = pending

    def metrics(self) -> str:
        return METRICS

    def models(self) -> list[str]:
        return ["m"]

    def call(self, api: str, method: str, path: str, **kw: Any) -> Reply:
        described = json.loads(json.dumps(DESCRIBED))
        described[0]["jobQueueStatus"]["pendingRequests"] = self.pending.pop(0) if len(self.pending) > 1 else 0
        return Reply(200, json.dumps(described).encode())


def test_the_frontends_figures_become_the_declared_gauges():
    assert per_model(METRICS, "ts_inference_requests_total", "model_name") == {"m": 130.0}
    client: Any = FakeClient([10, 10])
    (queue,) = poll(client).values()
    assert queue == ModelQueue(10, 1, 8, 130.0, 100.0, 2500.0)
    assert queue.tokens_per_request == 25.0 and queue.inflight == 8  # 130 - 100 - 10, at most 1 worker x batch 8
    text = render({"m": queue})
    assert 'bucket_queue_requests{ModelName="m"} 10' in text and 'bucket_queue_tokens{ModelName="m"} 250' in text
    assert {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")} == set(QUEUE_GAUGES)


def test_drain_waits_for_an_empty_queue_then_a_quiet_window():
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    def clock() -> float:
        return now[0]

    client: Any = FakeClient([5, 3, 1, 0])
    assert drain(client, grace_s=30, quiet_s=1.0, poll_s=0.25, clock=clock, sleep=sleep)
    assert 1.0 <= now[0] <= 2.0  # three polls with requests waiting, then 1 s of nothing moving
    now[0] = 0.0
    busy: Any = FakeClient([5] * 1000)
    assert not drain(busy, grace_s=3, clock=clock, sleep=sleep)
