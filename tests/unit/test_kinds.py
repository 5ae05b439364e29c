"""The model-kind registry: every kind resolves to its task class, names only wire formats that exist, and refuses
in its own line what it does not serve."""

from __future__ import annotations

import pytest

from bucketing import protocols
from bucketing.config import DTYPES, ENGINES, TASKS
from bucketing.kinds import ANSWER_BOUNDS, DEFAULT, KINDS


def test_the_configs_tasks_are_the_registrys_kinds():
    assert TASKS == tuple(KINDS) == ("embedding", "classification", "sparse", "multivector", "bgem3")
    assert DEFAULT in KINDS


@pytest.mark.parametrize("name", list(KINDS))
def test_each_kind_resolves_to_its_task_class(name):
    kind = KINDS[name]
    task = kind.implementation()
    assert task.name == name  # type: ignore[attr-defined]
    assert callable(task.load) and callable(task.read_settings) and callable(task.detects)
    assert kind.answer_bound in ANSWER_BOUNDS
    assert (kind.engines or ENGINES)[0] in ENGINES and set(kind.dtypes or DTYPES) <= set(DTYPES)
    assert not kind.own_head or callable(task.load_head)


@pytest.mark.parametrize("name", list(KINDS))
def test_a_wire_formats_kinds_are_model_kinds(name):
    for wire in protocols.WIRES:
        assert wire.answers is None or set(wire.answers) <= set(KINDS)
        assert wire.serves(KINDS[name]) == (wire.answers is None or name in wire.answers)
    assert any(w.serves(KINDS[name]) for w in protocols.WIRES)  # every kind is answered somewhere


def test_a_kind_refused_by_a_wire_format_has_its_own_line():
    for wire in protocols.WIRES:
        for kind in KINDS.values():
            if not wire.serves(kind):
                assert kind.wire_refusal, f"{kind.name} is refused by {wire.name} without a line of its own"
                assert wire.refusal(kind) == kind.wire_refusal.format(wire=wire.name)
            else:
                assert wire.refusal(kind) is None


def test_refusals_are_the_kinds_own_lines():
    assert KINDS["embedding"].refused("onnxruntime", "float16", "--dtype") is None
    assert KINDS["sparse"].refused("torch", "float32", "--dtype") is None
    assert KINDS["sparse"].refused("onnxruntime", "float32", "--dtype") is None
    assert KINDS["sparse"].refused("torch", "bfloat16", "--dtype") == (
        "--dtype bfloat16: a sparse model is served in float32 only (engine torch, onnxruntime or openvino)"
    )
    assert (
        KINDS["multivector"].refused("torch", "bfloat16", "handler.dtype")
        == "handler.dtype bfloat16: a multi-vector model is served in float32 only"
    )
