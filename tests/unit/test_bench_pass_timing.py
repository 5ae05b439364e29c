"""bench.probes.pass_timing: an engine's native call is found by what holds it, never by the engine's name; an
engine whose native call nothing known holds is timed whole (no `ours` figure), untouched."""

from __future__ import annotations

import numpy as np

from bench.probes import pass_cost
from bench.probes.pass_timing import NATIVE, stubbed


class NewEngine:
    """An engine of a kind the bench has never seen: its native call is its own business."""

    name = "onnxruntime"  # a known name: the stub looks at what holds the call, not at the name

    def __init__(self) -> None:
        self.native = lambda ids: np.ones((len(ids), 4), dtype=np.float32)

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.native(ids)


def test_an_engine_whose_native_call_is_unknown_is_timed_whole_and_left_as_it_was():
    engine = NewEngine()
    native = engine.native
    with stubbed(engine, 1) as done:
        assert done is False and engine.native is native
    assert pass_cost.ours({"1x8": 0.001}) == "n/a" and pass_cost.ours({"ours": 12e-6}) == "12.0"


def test_a_known_holder_is_stubbed_and_restored():
    class Held:
        def __init__(self) -> None:
            self.session = object()

    engine = Held()
    session = engine.session
    with stubbed(engine, 2) as done:
        assert done and engine.session is not session
        assert engine.session.run(["output"], {})[0].shape == (2, 384)  # type: ignore[attr-defined]
    assert engine.session is session and [name for name, _ in NATIVE] == ["session", "request", "traced"]
