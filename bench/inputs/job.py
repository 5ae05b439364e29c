"""What a job is: one configuration resolved before it is measured (`jobs.Resolver` resolves it): its load (texts,
request bodies, tokens as served), the float32 references its answers are checked against, and the figures it is
held to. The targets (TorchServe models, peers) and the measurer read jobs; none of them resolves one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from bench.inputs.configuration import Configuration
from bench.inputs.workloads import Workload


class Sent(Protocol):
    """What a load sent, as its samples say (`harness.load.Sample`): which body each request carried."""

    @property
    def body_index(self) -> int: ...


@dataclass(frozen=True)
class Bodies:
    """A configuration's load: the texts, the request bodies, and each body's tokens as served."""

    workload: Workload
    bodies: list[bytes]
    tokens: list[int]
    pair_tokens: list[list[int]] | None = None  # the rerank workload: each body's pair token counts

    @property
    def lengths(self) -> list[int]:
        """Every sequence the model runs: each text, or each (query, document) pair of a rerank body."""
        return [n for p in self.pair_tokens for n in p] if self.pair_tokens is not None else self.tokens

    def sent(self, samples: Sequence[Sent]) -> list[int]:
        """Token counts of what these samples sent: each text (each pair of a rerank request)."""
        if self.pair_tokens is not None:
            return [n for s in samples for n in self.pair_tokens[s.body_index]]
        return [self.tokens[s.body_index] for s in samples]

    def spread(self, count: int) -> list[str]:
        """`count` texts spread over the load's token lengths, shortest first."""
        by_length = sorted(range(len(self.workload.texts)), key=lambda i: self.tokens[i])
        step = max(1, len(by_length) // count)
        return [self.workload.texts[i] for i in by_length[::step][:count]]


@dataclass(frozen=True)
class Job:
    """One configuration, resolved: what it sends, what its answers must equal, and the figures it is held to."""

    config: Configuration
    load: Bodies
    picks: tuple[str, ...] = ()  # the texts its answers are checked on
    references: list[list[float]] | None = None  # float32 batch-of-one answers to `picks`; None: not checked
    roofline_tps: float | None = None  # the GEMM roofline of its dtype, model, texts and cores (real tokens/s)
    exact_tps: float | None = None  # exact-length grouping of its workload and layout in process (real tokens/s)
