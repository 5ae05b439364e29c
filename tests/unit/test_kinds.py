"""The model-kind registry: every kind resolves to its task class, names only wire formats that exist, and refuses
in its own line what it does not serve."""

from __future__ import annotations

import pytest

from bucketing import protocols
from bucketing.config import DTYPES, ENGINE_NAMES, TASKS
from bucketing.model_kinds import ANSWER_BOUNDS, DEFAULT, MODEL_KINDS


def test_the_configs_tasks_are_the_registrys_kinds():
    assert TASKS == tuple(MODEL_KINDS) == ("embedding", "classification", "sparse", "multivector", "bgem3")
    assert DEFAULT in MODEL_KINDS


@pytest.mark.parametrize("name", list(MODEL_KINDS))
def test_each_kind_resolves_to_its_task_class(name):
    kind = MODEL_KINDS[name]
    task = kind.implementation()
    assert task.name == name  # type: ignore[attr-defined]
    assert callable(getattr(task, "load", None)) and callable(task.read_settings) and callable(task.detects)
    assert kind.answer_bound in ANSWER_BOUNDS
    assert (kind.engines or ENGINE_NAMES)[0] in ENGINE_NAMES and set(kind.dtypes or DTYPES) <= set(DTYPES)
    assert not kind.own_head or callable(task.load_head)


@pytest.mark.parametrize("name", list(MODEL_KINDS))
def test_a_wire_formats_kinds_are_model_kinds(name):
    for wire in protocols.WIRES:
        assert wire.answers is None or set(wire.answers) <= set(MODEL_KINDS)
        assert wire.serves(MODEL_KINDS[name]) == (wire.answers is None or name in wire.answers)
    assert any(w.serves(MODEL_KINDS[name]) for w in protocols.WIRES)  # every kind is answered somewhere


def test_a_kind_refused_by_a_wire_format_has_its_own_line():
    for wire in protocols.WIRES:
        for kind in MODEL_KINDS.values():
            if not wire.serves(kind):
                assert kind.wire_refusal, f"{kind.name} is refused by {wire.name} without a line of its own"
                assert wire.refusal(kind) == kind.wire_refusal.format(wire=wire.name)
            else:
                assert wire.refusal(kind) is None


def test_refusals_are_the_kinds_own_lines():
    assert MODEL_KINDS["embedding"].refused("onnxruntime", "float16", "--dtype") is None
    assert MODEL_KINDS["sparse"].refused("torch", "float32", "--dtype") is None
    assert MODEL_KINDS["sparse"].refused("onnxruntime", "float32", "--dtype") is None
    assert MODEL_KINDS["sparse"].refused("torch", "bfloat16", "--dtype") == (
        "--dtype bfloat16: a sparse model is served in float32 only (engine torch, onnxruntime or openvino)"
    )
    assert (
        MODEL_KINDS["multivector"].refused("torch", "bfloat16", "handler.dtype")
        == "handler.dtype bfloat16: a multi-vector model is served in float32 only"
    )
