"""BGE-M3's pure parts: a request's `outputs` and `sparse_tokens` (read for every format that takes our options,
refused in one line elsewhere), its answer's lexical weights as FlagEmbedding's `_process_token_weights` makes them
and its ColBERT vectors as `_process_colbert_vecs`, KServe v2's ragged tensors, and the folder reader's refusals."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from bucketing.answers import Options
from bucketing.kinds.bgem3.folder import COLBERT_FILE, SPARSE_FILE, is_bgem3, read_bgem3
from bucketing.kinds.bgem3.task import M3Answer
from bucketing.model.chain import ChainError
from bucketing.model_kinds import MODEL_KINDS, detect
from bucketing.protocols import kserve_v2, native, openai
from bucketing.protocols.base import BadRequest, Limits, dumps
from bucketing.protocols.outputs import asked_by_tensors, read_outputs

BGEM3 = Limits(max_texts=8, max_length=32, vocab_size=100, task="bgem3", dimensions=4)
EMBEDDING = replace(BGEM3, task="embedding")


def answer(**extra) -> M3Answer:
    fields = {
        "ids": (0, 7, 9, 7, 3, 5, 2),  # <s> ... <unk> ... </s>
        "weights": np.array([5.0, 0.5, 0.0, 1.5, 9.0, 0.25, 7.0], dtype=np.float32),
        "colbert": np.arange(6 * 3, dtype=np.float32).reshape(6, 3) - 4.0,
        "unused": frozenset({0, 1, 2, 3}),
        "decode": lambda i: f"t{i}",
        "normalize": True,
    }
    return M3Answer(np.array([3.0, 4.0, 0.0, 0.0], dtype=np.float32), 7, False, **{**fields, **extra})


def test_lexical_weights_keep_each_ids_largest_positive_weight_without_special_tokens():
    a = answer()
    assert a.lexical() == {7: 1.5, 5: 0.25}  # 9 weighs 0: left out; <s>, <unk>, </s> dropped
    assert a.sparse_vector() == ([5, 7], [0.25, 1.5])


def test_fields_follow_the_outputs_asked_in_their_order():
    a = answer()
    assert list(a.fields()) == ["embedding", "tokens", "truncated"]
    assert a.fields()["embedding"] == pytest.approx([0.6, 0.8, 0.0, 0.0])
    fields = a.fields(Options(outputs=("colbert", "sparse"), sparse_tokens=True))
    assert list(fields) == ["colbert", "sparse", "tokens", "truncated"]
    assert fields["sparse"] == {"indices": [5, 7], "values": [0.25, 1.5], "tokens": ["t5", "t7"]}
    colbert = np.asarray(fields["colbert"])
    assert colbert.shape == (6, 3) and np.allclose(np.linalg.norm(colbert, axis=1), 1.0)
    raw = a.fields(Options(outputs=("colbert",), normalize=False, dimensions=2))["colbert"]
    assert np.array_equal(raw, a.colbert[:, :2])


def test_outputs_are_read_checked_and_refused_for_other_kinds():
    fields = ("outputs", "sparse_tokens")
    assert read_outputs({}, BGEM3, fields) == ((), False)
    assert read_outputs({"outputs": ["sparse", "dense"], "sparse_tokens": True}, BGEM3, fields) == (
        ("sparse", "dense"),
        True,
    )
    bodies: tuple[dict[str, Any], ...] = (
        {"outputs": "dense"},
        {"outputs": []},
        {"outputs": ["dense", "dense"]},
        {"outputs": ["lexical"]},
        {"sparse_tokens": True},
        {"outputs": ["sparse"], "sparse_tokens": 1},
    )
    for body in bodies:
        with pytest.raises(BadRequest):
            read_outputs(body, BGEM3, fields)
    with pytest.raises(BadRequest, match="for BGE-M3 models .*; this is an embedding model"):
        read_outputs({"outputs": ["dense"]}, EMBEDDING, fields)
    assert read_outputs({"outputs": ["dense"]}, BGEM3, ()) == ((), False)  # a format that does not take them


def test_native_reads_outputs_and_openai_refuses_what_it_cannot_carry():
    parsed = native.parse({"texts": ["a"], "outputs": ["colbert"]}, BGEM3)
    assert parsed.options.outputs == ("colbert",)
    assert openai.parse({"input": "a", "outputs": ["dense"]}, BGEM3).options.outputs == ("dense",)
    with pytest.raises(BadRequest, match="OpenAI's embeddings answer carries dense only") as raised:
        openai.parse({"input": "a", "outputs": ["dense", "sparse"]}, BGEM3)
    assert "embed_sparse" in raised.value.message and "\n" not in raised.value.message


def test_kserve_v2_names_each_outputs_tensors_and_asks_the_outputs_named():
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
        "outputs": [{"name": "sparse_tokens"}, {"name": "embedding"}],
    }
    parsed = kserve_v2.parse(body, BGEM3)
    assert parsed.outputs == ("sparse_tokens", "embedding")
    assert parsed.options.outputs == ("dense", "sparse") and parsed.options.sparse_tokens
    assert asked_by_tensors(Options(outputs=("colbert",)), ("tokens",)).outputs == ("colbert",)
    with pytest.raises(BadRequest, match="unknown output"):
        kserve_v2.parse({**body, "outputs": [{"name": "lexical"}]}, BGEM3)


def test_kserve_v2_ragged_outputs_are_flat_values_and_lengths():
    answers = [answer(), answer(ids=(0, 2), weights=np.zeros(2, np.float32), colbert=np.ones((1, 3), np.float32))]
    options = Options(outputs=("dense", "sparse", "colbert"), sparse_tokens=True)
    tensors = {t["name"]: t for t in kserve_v2.outputs([a.fields(options) for a in answers])}
    assert tensors["embedding"]["shape"] == [2, 4]
    assert tensors["sparse_indices"] == {"name": "sparse_indices", "datatype": "INT64", "shape": [2], "data": [5, 7]}
    assert tensors["sparse_values"]["data"] == [0.25, 1.5] and tensors["sparse_tokens"]["data"] == ["t5", "t7"]
    assert tensors["sparse_lengths"]["data"] == [2, 0]
    assert tensors["colbert"]["shape"] == [7, 3] and tensors["colbert_lengths"]["data"] == [6, 1]


def test_colbert_vectors_stay_one_array_to_the_wire_and_write_the_json_their_lists_did():
    """The vectors go to KServe v2's binary tensor whole (no float-by-float list); JSON writes what tolist() did."""
    options = Options(outputs=("colbert",))
    answers = [answer(), answer(colbert=np.full((2, 3), 0.1, np.float32))]
    fields = [a.fields(options) for a in answers]
    assert all(isinstance(f["colbert"], np.ndarray) for f in fields)
    as_lists = [{**f, "colbert": f["colbert"].tolist()} for f in fields]
    assert dumps(fields) == dumps(as_lists) and json.loads(dumps(fields)) == as_lists
    (array, lengths) = kserve_v2.outputs(fields)[:2]
    (listed, _) = kserve_v2.outputs(as_lists)[:2]
    assert isinstance(array["data"], np.ndarray) and array["data"].tolist() == listed["data"]
    assert array["shape"] == listed["shape"] == [8, 3] and lengths["data"] == [6, 2]
    assert kserve_v2.encode("FP32", array["data"]) == kserve_v2.encode("FP32", listed["data"])
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps({"x": object()})


def write_linear(path, features: int, out: int, bias: bool = True) -> None:
    torch.save(torch.nn.Linear(features, out, bias=bias).state_dict(), path)


def test_the_folder_is_detected_by_its_two_heads_and_their_shapes_are_checked(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 8, "model_type": "xlm-roberta"}')
    assert not is_bgem3(tmp_path) and detect(tmp_path).name == "embedding"
    write_linear(tmp_path / SPARSE_FILE, 8, 1)
    write_linear(tmp_path / COLBERT_FILE, 8, 6)
    assert is_bgem3(tmp_path) and detect(tmp_path) is MODEL_KINDS["bgem3"]
    spec = read_bgem3(tmp_path)
    assert (spec.hidden_size, spec.colbert_dim) == (8, 6) and "colbert" in spec.describe()["outputs"]
    write_linear(tmp_path / SPARSE_FILE, 8, 2)
    with pytest.raises(ChainError, match=r"Linear\(8, 1\) is expected"):
        read_bgem3(tmp_path)
    write_linear(tmp_path / SPARSE_FILE, 8, 1)
    write_linear(tmp_path / COLBERT_FILE, 6, 8)
    with pytest.raises(ChainError, match="from 8 features"):
        read_bgem3(tmp_path)
    write_linear(tmp_path / COLBERT_FILE, 8, 8, bias=False)
    with pytest.raises(ChainError, match="from 8 features"):
        read_bgem3(tmp_path)


def test_the_kind_serves_float32_only_and_names_its_outputs_when_refused():
    kind = MODEL_KINDS["bgem3"]
    assert kind.refused("onnxruntime", "float32", "--dtype") is None
    assert kind.refused("openvino", "float32", "--dtype") is None
    assert kind.refused("torch", "bfloat16", "--dtype") == (
        "--dtype bfloat16: a BGE-M3 model is served in float32 only (as FlagEmbedding runs it on the CPU)"
    )
    assert kind.dense_vector and not kind.per_token and kind.answer_bound == "checked"
