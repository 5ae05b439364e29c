"""Sparse models on onnxruntime: an archive built with --engine onnxruntime carries its graph and serves it;
a missing, foreign or tampered graph, or a Router of several CSR routes, stops the worker (and the build) in one
line."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tests.handler.sparse.support import ENGINES, MAX_LENGTH, mismatches, reference, stage_onnxruntime_archive
from tests.handler.test_handler import make_handler, mixed_texts, serve_at
from tests.models import build_sparse_encoder

pytest.importorskip("sentence_transformers")


@pytest.mark.parametrize("variant", ["router", "csr"])
def test_an_onnxruntime_archive_carries_its_graph_and_serves(folders, csr_folders, archives, variant):
    """Built with --engine onnxruntime, a sparse folder's archive carries model.onnx (SPLADE: pooled inside it;
    CSR: the dense chain's embedding) and its worker runs the graph, checked against torch at start."""
    staged, cfg = archives(variant)
    assert (staged / "model.onnx").is_file()
    assert cfg["handler"]["task"] == "sparse" and cfg["handler"]["engine"] == "onnxruntime"
    section = {k: v for k, v in cfg["handler"].items() if k != "model_path"} | {"cost": {"calibrate": False}}
    handler, context = make_handler(staged, **section)
    assert handler.task.engine.name == "onnxruntime" and handler.task.engine.device == "cpu"
    note = handler.task.ready_note
    assert ("activations the size of a group's logits" in note) == (variant == "router"), note
    texts = mixed_texts(5, seed=12) + ["x"]
    ((status, body),) = serve_at(handler, context, [{"texts": texts, "input_type": "document"}], [""])
    assert status == 200
    folder = folders[variant] if variant in folders else csr_folders[variant]
    assert mismatches([a["embedding"] for a in body], reference(folder, texts, "document")) == 0


def test_a_missing_foreign_or_tampered_graph_stops_the_worker_in_one_line(folders, archives, tmp_path):
    """No model.onnx, another model's graph, or weights the graph was not exported from: the worker does not
    start, and says why in one line."""
    from bucketing.model.head import EngineError

    def start(folder):
        with pytest.raises(EngineError) as raised:
            make_handler(folder, task="sparse", engine="onnxruntime", max_length=MAX_LENGTH)
        assert "\n" not in str(raised.value)
        return str(raised.value)

    assert "no model.onnx" in start(folders["splade-max"])
    foreign = tmp_path / "foreign"
    shutil.copytree(archives("splade-max")[0], foreign)
    shutil.copy(archives("csr")[0] / "model.onnx", foreign / "model.onnx")  # a CSR graph: other inputs and output
    assert "could not be checked against the torch model" in start(foreign)
    tampered = tmp_path / "tampered"
    shutil.copytree(archives("splade-max")[0], tampered)
    other = build_sparse_encoder(tmp_path / "other", seed=9)
    shutil.copy(other / "model.safetensors", tampered / "model.safetensors")  # the graph no longer matches
    assert "differs from the torch model by" in start(tampered)


def test_several_csr_routes_are_refused_on_onnxruntime_in_one_line(csr_routers, tmp_path, capsys):
    """One exported graph holds one dense chain: a Router of two CSR routes is refused on onnxruntime at build and
    at worker start, in one line naming --engine torch."""
    from bucketing.model.head import EngineError
    from model_store import build

    folder = csr_routers["csr-shared-router"]
    argv = ["--model-dir", str(folder), "--strategies", "bucketed", "--engine", "onnxruntime", "--print-commands"]
    assert build.main([*argv, "--stage-dir", str(tmp_path / "stage")]) == 2
    err = capsys.readouterr().err.strip()
    assert "CSR routes" in err and "--engine torch" in err and "\n" not in err
    with pytest.raises(EngineError, match="2 CSR routes .* served on engine torch only") as raised:
        make_handler(folder, task="sparse", engine="onnxruntime", max_length=MAX_LENGTH)
    assert "\n" not in str(raised.value)


def test_a_summing_splade_is_refused_on_openvino_in_one_line(tmp_path, capsys):
    """OpenVINO runs the graph's float64 sum in float32 (2.3e-5 off encode() on the large sums below): a SPLADE
    summing over its tokens is not built for it, does not start on it, and says why in one line."""
    from bucketing.model.head import EngineError
    from model_store import build

    folder = build_sparse_encoder(tmp_path / "large", pooling="sum", activation="log1p_relu", logit_scale=4, seed=1)
    argv = ["--model-dir", str(folder), "--strategies", "bucketed", "--engine", "openvino", "--print-commands"]
    capsys.readouterr()  # the folder's saving
    assert build.main([*argv, "--stage-dir", str(tmp_path / "refused")]) == 2
    assert capsys.readouterr().err == (
        "error: --engine openvino: a SPLADE summing over its tokens is served on engine torch or onnxruntime only "
        "(openvino runs the graph's float64 sum in float32, up to 2.3e-5 off encode())\n"
    )
    served = stage_onnxruntime_archive(folder, tmp_path / "stage")[0]
    with pytest.raises(EngineError, match="served on engine torch or onnxruntime only") as raised:
        make_handler(served, task="sparse", engine="openvino", max_length=MAX_LENGTH)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("engine", ENGINES)
def test_large_sums_equal_encode_within_1e5_on_both_engines(tmp_path, engine):
    """A SPLADE whose sums over many tokens reach 20-64 (sum, log1p_relu, its logits scaled): every value within
    1e-5 of encode()'s on both engines (onnxruntime's float32 ReduceSum was 1.9e-5 off; its sum is now float64)."""
    folder = build_sparse_encoder(tmp_path / "large", pooling="sum", activation="log1p_relu", logit_scale=4, seed=1)
    served = folder if engine == "torch" else stage_onnxruntime_archive(folder, tmp_path / "stage")[0]
    section = {"max_length": MAX_LENGTH, "max_response_bytes": 1 << 28}  # a random model: most ids non-zero
    handler, context = make_handler(served, task="sparse", engine=engine, **section)
    assert ("a float64 copy of them for the sum" in handler.task.ready_note) == (engine == "onnxruntime")
    texts = mixed_texts(32, seed=3)
    ((status, body),) = serve_at(handler, context, [{"texts": texts}], [""])
    assert status == 200, body
    expected = reference(folder, texts)
    assert 20 < expected.max() < 64  # one float32 step there: 1.9e-6 to 3.8e-6
    worst = max(
        float(np.max(np.abs(np.array(a["embedding"]["values"]) - row[a["embedding"]["indices"]])))
        for a, row in zip(body, expected)
    )
    assert mismatches([a["embedding"] for a in body], expected) == 0, f"worst value {worst:.2e} off encode()"


@pytest.mark.parametrize("variant", ["router", "csr"])
def test_openvino_serves_the_same_graph_within_1e_5(folders, csr_folders, archives, variant):
    """The openvino engine runs the graph an onnxruntime archive carries (the same export), checked against torch at
    start; its answers match encode()'s."""
    staged, _ = archives(variant)
    handler, context = make_handler(staged, task="sparse", engine="openvino", max_length=MAX_LENGTH)
    assert handler.task.engine.name == "openvino"
    assert ("openvino: the graph also holds activations" in handler.task.ready_note) == (variant == "router")
    texts = mixed_texts(5, seed=12) + ["x"]
    ((status, body),) = serve_at(handler, context, [{"texts": texts, "input_type": "document"}], [""])
    assert status == 200
    folder = folders[variant] if variant in folders else csr_folders[variant]
    assert mismatches([a["embedding"] for a in body], reference(folder, texts, "document")) == 0
