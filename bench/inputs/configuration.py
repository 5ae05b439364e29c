"""One configuration to measure: what is registered (strategy, batch size, layout, engine, schedule, dtype, model),
on which host (TorchServe, the standalone server), and how it is loaded (workload, mode, clients or rate,
duration)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TORCHSERVE = "torchserve"  # the default host (`hosts.HOSTS`): the worker under TorchServe


@dataclass(frozen=True)
class Configuration:
    """One configuration to measure: what is registered, and how it is loaded."""

    strategy: str
    batch_size: int
    max_batch_delay: int = 10
    workers: int = 2
    threads: int = 1
    workload: str = "longtail"
    short_frac: float = 0.5
    mode: str = "closed"
    concurrency: int = 32
    rate: float | None = None
    duration: float = 20.0
    engine: str | None = None  # torch | onnxruntime; None: the shipped archives' engine
    schedule: str | None = None  # batch | continuous (handler.schedule); None: the shipped archives' (batch)
    dtype: str | None = None  # float32 | bfloat16 (handler.dtype; bfloat16 runs on torch); None: float32
    model: str | None = None  # None: the bundled MiniLM; `bert-base-random`; or a model folder
    peer: str | None = None  # another server measured on the same load (`peers.PEERS`); strategy is its name
    host: str = TORCHSERVE  # what serves our worker (`hosts.HOSTS`); a peer's is the default (it is its own server)
    label: str = ""  # appended to the name, e.g. `from YAML` for the tuned configuration's re-measurement

    @property
    def name(self) -> str:
        """A short label, like `bucketed bs16` or `dynamic bs16 d20 @30/s`."""
        label = f"{self.peer or self.strategy} bs{self.batch_size}"
        if self.max_batch_delay != 10:
            label += f" d{self.max_batch_delay}"
        if self.workers != 2 or self.threads != 1:
            label += f" {self.workers}x{self.threads}"
        if self.mode == "open":
            label += f" @{self.rate:g}/s"
        if self.engine is not None:
            label += f" {self.engine}"
        if self.schedule is not None:
            label += f" {self.schedule}"
        if self.dtype is not None:
            label += f" {self.dtype}"
        if self.model is not None:
            label += f" [{Path(self.model).name}]"
        if self.host != TORCHSERVE and self.peer is None:
            label += f" on {self.host}"
        if self.label:
            label += f" ({self.label})"
        return label

    @property
    def workload_label(self) -> str:
        return f"mixed(short_frac={self.short_frac:g})" if self.workload == "mixed" else self.workload

    @property
    def served_by(self) -> str:
        """The server measured: the peer, else the host our worker ran on."""
        return self.peer or self.host
