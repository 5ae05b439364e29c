"""The replicas' queue signals, gathered for the ingress's `GET /metrics`: each replica pushes its samples every
`PUSH_S` to one small named actor (`Board`, 0 CPU); a replica silent for `STALE_S` is left out. Ray is imported
only when the board is made."""

from __future__ import annotations

import time
from typing import Any

from bucketing.metrics import Sample

PUSH_S = 1.0  # a replica pushes its queue signals to the board this often
STALE_S = 5.0  # a replica silent this long (gone: scaled down, dead) is left out of /metrics
BOARD = "bucketing-queue-signals"  # the board's actor name (one per Ray namespace: one application)


class Board:
    """The replicas' latest queue signals (a Ray actor, named `BOARD`): replica id -> (model, when, samples)."""

    def __init__(self) -> None:
        self.latest: dict[str, tuple[str, float, list[Sample]]] = {}

    def put(self, model: str, replica: str, samples: list[Sample]) -> None:
        self.latest[replica] = (model, time.monotonic(), samples)

    def read(self, max_age_s: float) -> dict[str, list[list[Sample]]]:
        """Each model's replicas' samples, of those that pushed within `max_age_s` (the others are forgotten)."""
        now = time.monotonic()
        self.latest = {k: v for k, v in self.latest.items() if now - v[1] <= max_age_s}
        out: dict[str, list[list[Sample]]] = {}
        for model, _when, samples in self.latest.values():
            out.setdefault(model, []).append(samples)
        return out


def board() -> Any:
    """The board's handle, made by whichever asks first (0 CPU; made again if its owner went away)."""
    import ray

    return ray.remote(Board).options(name=BOARD, get_if_exists=True, num_cpus=0).remote()
