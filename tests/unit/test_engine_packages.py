"""An engine whose Python package is not installed is refused in one line naming it, at build and at worker start
(without openvino, the build said the graph "differs from the torch model by nan" and the worker died on a long
ModuleNotFoundError that TorchServe restarted forever)."""

from __future__ import annotations

import importlib.util

import pytest

from bucketing.engine_registry import ENGINES, EngineError

MESSAGE = (
    "handler.engine openvino: the {doing} needs the Python package openvino, which is not installed here (pip "
    "install -r requirements.txt, which pins it; or another handler.engine: torch or onnxruntime)"
)


@pytest.fixture
def without_openvino(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else find_spec(name))


def test_a_missing_package_is_one_line_at_build_and_at_start(without_openvino, tmp_path):
    kind = ENGINES["openvino"]
    with pytest.raises(EngineError) as build:
        kind.prepare_into("embedding", str(tmp_path), tmp_path)
    assert str(build.value) == MESSAGE.format(doing="build")
    with pytest.raises(EngineError) as start:
        kind.open(None, None, None, str(tmp_path), "cpu", None)
    assert str(start.value) == MESSAGE.format(doing="worker")
    with pytest.raises(EngineError, match="the worker needs the Python package openvino"):
        kind.graph(tmp_path / "graph.onnx", 1, "cpu")
    ENGINES["torch"].check_installed("the worker")  # torch needs nothing beyond the handler's own imports


def test_every_engine_names_the_packages_it_imports():
    assert {name: (kind.packages, kind.build_packages) for name, kind in ENGINES.items()} == {
        "torch": ((), ()),
        "onnxruntime": (("onnxruntime",), ("onnx",)),
        "openvino": (("openvino",), ("onnx",)),
    }
    every = [p for kind in ENGINES.values() for p in (*kind.packages, *kind.build_packages)]
    assert all(importlib.util.find_spec(p) for p in every)  # pinned, installed


def test_a_worker_does_not_need_what_only_the_export_imports(monkeypatch, tmp_path):
    """The images install what serving imports (config/kserve/image-packages.txt: onnxruntime and openvino, not
    onnx, which only torch.onnx.export at build needs): a worker without onnx opens (its workers failed to load,
    every one, in both KServe images), a build without it is refused in one line."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnx" else find_spec(name))
    for kind in (ENGINES["onnxruntime"], ENGINES["openvino"]):
        kind.check_installed("the worker")
        with pytest.raises(EngineError, match="the build needs the Python package onnx, which is not installed"):
            kind.prepare_into("embedding", str(tmp_path), tmp_path)
