"""What a request to a model replica carries (`Item`: its body, headers, path and estimated tokens), and the
replicas' queue signals summed per model for the ingress's `/metrics`. Pure: no Ray.

A replica batches with the standalone host's batcher (`bucketing.hosts.standalone.batcher`, one worker): Ray
Serve's `serve.batch` forms a batch every `batch_wait_timeout_s` whether or not the last one is still running, so
under load its batches stay small (1.8 requests a batch at 32 clients on MiniLM here) while they queue for the
replica's one thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bucketing.metrics import CAPACITY, INFLIGHT, QUEUE_REQUESTS, QUEUE_TOKENS, Labels, QueueSignals, Sample

BYTES_PER_TOKEN = 4  # the token estimate: body bytes / 4, as the standalone batcher's (never a tokenizer call)


@dataclass(frozen=True)
class Item:
    """One request on its way to a model replica: what `rows.torchserve_row` reads, and its estimated tokens."""

    body: bytes
    headers: dict[str, str]
    url_path: str | None
    tokens: int


def estimate_tokens(body: bytes) -> int:
    return len(body) // BYTES_PER_TOKEN


def summed(replicas: Iterable[Iterable[Sample]], labels: Labels = ()) -> list[Sample]:
    """Replicas' queue signals (`QueueSignals.samples()`, unlabelled) as one model's, `labels` put first: each
    series' values summed (gauges and histogram counts alike), but the capacity gauge, one replica's (`max`): the
    autoscaling ratios divide by one pod's capacity (docs/operations/autoscaling.md)."""
    out: dict[tuple[str, Labels], Sample] = {}
    for samples in replicas:
        for name, kind, own, value in samples:
            key = (name, own)
            if key in out:
                before = out[key][3]
                value = max(before, value) if name == CAPACITY else before + value
            out[key] = (name, kind, (*labels, *own), value)
    return list(out.values())


@dataclass
class Pending:
    """A model's requests the ingress has sent to its deployment and not yet answered, and their estimated tokens."""

    requests: int = 0
    tokens: int = 0


def at_ingress(samples: list[Sample], pending: Pending) -> list[Sample]:
    """A model's summed signals with its gauges from what the ingress holds: a replica sees only what Ray's router
    gave it (at most `max_ongoing_requests`), not the requests waiting in the router's queue. The ingress's count is
    exact and fresh; the replicas' in-flight figure (up to `PUSH_S` old) splits it into running and waiting, and the
    waiting ones' tokens are their share of the pending tokens."""
    inflight = min(next((v for n, _, _, v in samples if n == INFLIGHT), 0.0), float(pending.requests))
    queued = pending.requests - inflight
    tokens = round(pending.tokens * queued / pending.requests) if pending.requests else 0
    gauges = {QUEUE_REQUESTS: queued, QUEUE_TOKENS: float(tokens), INFLIGHT: inflight}
    return [(n, kind, labels, gauges.get(n, v)) for n, kind, labels, v in samples]


def model_signals(
    names: Sequence[str], latest: Mapping[str, list[list[Sample]]], pending: Mapping[str, Pending] | None = None
) -> list[Sample]:
    """Every model's queue signals summed over its replicas, labelled by model (zeros for one none reported), its
    gauges from `pending` when given (`at_ingress`)."""
    out: list[Sample] = []
    for name in names:
        labels = (("ModelName", name),)
        replicas = latest.get(name)
        samples = summed(replicas, labels) if replicas else QueueSignals().samples(labels)
        out += at_ingress(samples, pending[name]) if pending is not None and name in pending else samples
    return out


__all__ = ["BYTES_PER_TOKEN", "Item", "Pending", "at_ingress", "estimate_tokens", "model_signals", "summed"]
