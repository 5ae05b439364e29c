"""What `pass_cost` and `engine_cuts` share to time passes: the clocks, plain passes, the planner's passes a long-tail
batch, clock time spent in wrapped callables (`Spent`), and an engine's native call stubbed out (`stubbed`), which
leaves what our wrapper spends (graph feed, tensor conversion, output copy).

No engine is named here: an engine's native call is found by what holds it (`NATIVE`: an ONNX Runtime session, an
OpenVINO infer request, a torch module), so a new engine in the handler's registry needs no edit; one whose native
call none of them holds is timed whole (`stubbed` yields False, and its `ours` figure is left out).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import numpy as np

from bench.inputs.workloads import make_workload
from bucketing.engines import Engine
from bucketing.model.tokenizer import Tokenizer
from bucketing.planning.planner import CostModel, plan_bucketed
from model_store.archives import SERVED

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
TOKEN = 2000  # an ordinary word piece of MiniLM's vocabulary, for the timed passes
BATCH = 16  # requests a delivered batch
LONGTAIL_BATCHES = 64
HIDDEN = 384  # the stand-in output's width (MiniLM's)


def plain(rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((rows, length), TOKEN, dtype=np.int64), np.ones((rows, length), dtype=np.int64)


def _session(out: np.ndarray) -> object:
    """An ONNX Runtime session's stand-in: `run(names, feed)` answers the ready output."""

    class Session:
        def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            return [out]

    return Session()


def _request(out: np.ndarray) -> object:
    """An OpenVINO infer request's stand-in: `infer(feed)` does nothing, `get_tensor(port).data` is the output."""

    class Tensor:
        data = out

    class Request:
        def infer(self, feed: dict[str, np.ndarray], **_: Any) -> None:
            return None

        def get_tensor(self, port: Any) -> Tensor:
            return Tensor()

    return Request()


def _module(out: np.ndarray) -> object:
    """A torch module's stand-in (traced, or the eager head where none is traced): called, the output as a tensor."""
    import torch

    tensor = torch.from_numpy(out)
    return lambda *_: tensor


# An engine's native call, by the attribute that holds it, and its stand-in (first match wins).
NATIVE: tuple[tuple[str, Callable[[np.ndarray], object]], ...] = (
    ("session", _session),
    ("request", _request),
    ("traced", _module),
)


@contextmanager
def stubbed(run: Any, rows: int) -> Iterator[bool]:
    """The engine with its native call replaced by one that returns a ready output of `rows` rows: what is left of
    a call is our wrapper's (graph feed, tensor conversion, output copy). Yields whether it was stubbed (False: no
    attribute of `NATIVE` holds its native call, and a call is the whole call)."""
    holder = next(((name, make) for name, make in NATIVE if hasattr(run, name)), None)
    if holder is None:
        yield False
        return
    name, make = holder
    saved = getattr(run, name)
    setattr(run, name, make(np.zeros((rows, HIDDEN), dtype=np.float32)))
    try:
        yield True
    finally:
        setattr(run, name, saved)


class Spent:
    """Clock time spent in wrapped callables, by name (a bench-only patch of an object's attributes)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        inner = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self.clock()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + self.clock() - start

        setattr(owner, attribute, timed)

    def engine(self, run: Engine) -> Engine:
        """`run` with its calls timed as `engine` (its other attributes its own)."""
        spent = self

        class Timed:
            def __getattr__(self, name: str) -> Any:
                return getattr(run, name)

            def __call__(self, *args: Any) -> Any:
                start = spent.clock()
                try:
                    return run(*args)
                finally:
                    spent.seconds["engine"] = spent.seconds.get("engine", 0.0) + spent.clock() - start

        return cast(Engine, Timed())


def timed_handler(section: dict[str, Any], model_name: str, clock: Callable[[], float]) -> tuple[Any, Any, Spent]:
    """A handler in process on the handler config `section`, as a worker opens it, its engine calls timed as
    `engine` (the task calls its engine: the timed one stands in for it); its context and the `Spent`."""
    from bucketing_handler import BucketingHandler
    from tsctl.inprocess import LocalContext

    context = LocalContext(section, model_name=model_name)
    handler = BucketingHandler()
    handler.initialize(context)
    spent = Spent(clock)
    task: Any = handler.task
    task.engine = spent.engine(task.engine)
    return handler, context, spent


def longtail_passes(cost: CostModel, tokenizer: Tokenizer) -> float:
    """The planner's passes a batch of 16 long-tail requests, over `LONGTAIL_BATCHES` batches."""
    texts = make_workload("longtail", BATCH * LONGTAIL_BATCHES, seed=0).texts
    lengths = [len(e.ids) for e in tokenizer.encode(list(texts))]
    passes = [
        len(plan_bucketed(lengths[s : s + BATCH], cost, SERVED.max_batch_tokens).sub_batches)
        for s in range(0, len(lengths), BATCH)
    ]
    return sum(passes) / len(passes)
