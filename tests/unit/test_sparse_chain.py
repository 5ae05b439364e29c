"""A SparseEncoder folder read from its JSON files alone (routes, Router resolution, what is refused), and the pure
parts of a sparse answer: the request's input_type and max_active_dims, its prompt, and the cut to the top values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bucketing.answers import Answer, keep_top
from bucketing.kinds.sparse.folder import is_sparse, read_sparse
from bucketing.model.chain import ChainError
from bucketing.protocols import ROUTES, tei_embed_sparse
from bucketing.protocols.base import BadRequest, Limits
from bucketing.protocols.options import read_options
from tests.unit.wire import raised

MLM = "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer"
SPLADE = "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"
STATIC = "sentence_transformers.sparse_encoder.modules.sparse_static_embedding.SparseStaticEmbedding"
CSR = "sentence_transformers.sparse_encoder.modules.sparse_auto_encoder.SparseAutoEncoder"
ROUTER = "sentence_transformers.base.modules.router.Router"
SPARSE = Limits(max_texts=8, max_length=64, vocab_size=100, task="sparse", dimensions=100)


def write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def splade_folder(root: Path, pooling: str = "max", activation: str = "relu", settings: dict | None = None) -> Path:
    write(root / "modules.json", [{"path": "", "type": MLM}, {"path": "1_SpladePooling", "type": SPLADE}])
    write(root / "1_SpladePooling" / "config.json", {"pooling_strategy": pooling, "activation_function": activation})
    write(root / "config_sentence_transformers.json", {"model_type": "SparseEncoder", **(settings or {})})
    return root


def router_folder(root: Path, parameters: dict) -> Path:
    write(root / "modules.json", [{"path": "", "type": ROUTER}])
    types = {"q_0": STATIC, "d_0": MLM, "d_1": SPLADE}
    write(
        root / "router_config.json",
        {"types": types, "structure": {"query": ["q_0"], "document": ["d_0", "d_1"]}, "parameters": parameters},
    )
    write(root / "d_1" / "config.json", {"pooling_strategy": "sum", "activation_function": "log1p_relu"})
    (root / "q_0").mkdir(parents=True, exist_ok=True)
    (root / "q_0" / "model.safetensors").write_bytes(b"")
    write(root / "config_sentence_transformers.json", {"model_type": "SparseEncoder", "max_active_dims": 9})
    return root


def test_a_splade_folder_is_one_route(tmp_path):
    spec = read_sparse(splade_folder(tmp_path, "sum", "log1p_relu", {"prompts": {"query": "q: "}}))
    assert list(spec.routes) == [""] and spec.mlm == ""
    route = spec.routes[""]
    assert (route.kind, route.pooling, route.activation, route.pooling_folder) == (
        "splade",
        "sum",
        "log1p_relu",
        "1_SpladePooling",
    )
    assert {spec.route(t) for t in (None, "query", "document")} == {""}
    assert spec.chain.prompts == {"query": "q: "} and spec.max_active_dims is None


def test_a_router_resolves_routes_as_sentence_transformers_does(tmp_path):
    spec = read_sparse(
        router_folder(tmp_path / "a", {"default_route": "document", "allow_empty_key": True, "route_mappings": {}})
    )
    assert [spec.route(t) for t in (None, "query", "document")] == ["document", "query", "document"]
    assert spec.routes["query"].kind == "static" and spec.mlm == "d_0" and spec.max_active_dims == 9
    mapped = {"route_mappings": {"(None, 'text')": "query"}, "default_route": "document"}
    spec = read_sparse(router_folder(tmp_path / "b", mapped))
    assert [spec.route(t) for t in (None, "query", "document")] == ["query", "query", "query"]
    spec = read_sparse(router_folder(tmp_path / "c", {"default_route": None, "allow_empty_key": True}))
    assert spec.route(None) == "query"  # the first route, as allow_empty_key makes it the default


@pytest.mark.parametrize(
    "modules, words",
    [
        (
            [{"path": "", "type": "x.Transformer"}, {"path": "1", "type": CSR}, {"path": "2", "type": "x.Pooling"}],
            "served for CSR: Transformer, Pooling, Dense..., Normalize, then one SparseAutoEncoder",
        ),
        ([{"path": "", "type": CSR}], "served for CSR"),
        ([{"path": "", "type": MLM}, {"path": "1", "type": "x.Pooling"}], "not served"),
        ([{"path": "", "type": MLM}], "not served"),
    ],
)
def test_what_is_not_served_is_refused_in_one_line(tmp_path, modules, words):
    write(tmp_path / "modules.json", modules)
    with pytest.raises(ChainError, match=words) as raised:
        read_sparse(tmp_path)
    assert "\n" not in str(raised.value)


def test_an_unknown_pooling_strategy_is_refused(tmp_path):
    with pytest.raises(ChainError, match="pooling_strategy 'mean'"):
        read_sparse(splade_folder(tmp_path, "mean"))


def test_sparse_folders_are_detected(tmp_path):
    assert is_sparse(splade_folder(tmp_path / "s"))
    assert is_sparse(router_folder(tmp_path / "r", {}))
    write(tmp_path / "d" / "modules.json", [{"path": "", "type": "x.Transformer"}, {"path": "1", "type": "x.Pooling"}])
    assert not is_sparse(tmp_path / "d") and not is_sparse(tmp_path / "none")


PROMPTS = (("query", "q: "), ("passage", "p: "), ("plain", "x: "))


@pytest.mark.parametrize(
    "body, prompt",
    [
        ({"input_type": "query"}, "q: "),
        ({"input_type": "document"}, ""),  # encode_document's `document` prompt (none here), never `passage`
        ({"input_type": "document", "prompt_name": "passage"}, "p: "),  # named, as encode_document(prompt_name=)
        ({"input_type": "query", "prompt_name": "plain"}, "x: "),  # a named prompt wins, as in encode_query
        ({"input_type": "document", "prompt": ""}, ""),
        ({}, "x: "),  # encode(): the default prompt
    ],
)
def test_input_type_picks_the_prompt_encode_query_and_encode_document_pick(body, prompt):
    limits = Limits(8, 64, 100, prompts=PROMPTS, default_prompt="plain")
    options = read_options(body, limits)
    assert options.prompt == prompt and options.input_type == body.get("input_type")


@pytest.mark.parametrize(
    "body, limits, param",
    [
        ({"input_type": "search_query"}, SPARSE, "input_type"),
        ({"input_type": 1}, SPARSE, "input_type"),
        ({"max_active_dims": 0}, SPARSE, "max_active_dims"),
        ({"max_active_dims": True}, SPARSE, "max_active_dims"),
        ({"max_active_dims": 101}, SPARSE, "max_active_dims"),  # over the output size: CSR's top-k raises there
        ({"max_active_dims": 4}, Limits(8, 64, 100), "max_active_dims"),
        ({"normalize": False}, SPARSE, "normalize"),
        ({"dimensions": 4}, SPARSE, "dimensions"),
    ],
)
def test_bad_sparse_options_are_a_400_naming_the_field(body, limits, param):
    error = raised(read_options, body, limits)
    assert isinstance(error, BadRequest) and error.status == 400 and error.param == param


def test_a_sparse_answer_is_its_non_zeros_ascending_cut_to_the_top_values():
    row = np.zeros(100, dtype=np.float32)
    row[[3, 50, 7, 90]] = [0.5, 2.0, -3.0, 1.0]
    answer = Answer(row, 4, False, sparse=True, max_active_dims=3)
    assert answer.sparse_vector() == ([7, 50, 90], [-3.0, 2.0, 1.0])
    assert answer.sparse_vector(10) == ([3, 7, 50, 90], [0.5, -3.0, 2.0, 1.0])
    assert answer.fields()["embedding"] == {"indices": [7, 50, 90], "values": [-3.0, 2.0, 1.0]}
    assert np.count_nonzero(keep_top(row, 2)) == 2


def test_tei_embed_sparse_maps_prompt_name_to_input_type():
    assert ROUTES["embed_sparse"][0] is tei_embed_sparse.WIRE
    limits = Limits(8, 64, 100, task="sparse", dimensions=100, prompts=(("query", "q: "), ("passage", "p: ")))
    for name, kind in (("query", "query"), ("passage", "document"), (None, None)):
        body = {"inputs": ["a"], **({"prompt_name": name} if name else {})}
        request = tei_embed_sparse.parse(body, limits)
        assert request.options.input_type == kind
    row = np.zeros(100, dtype=np.float32)
    row[[5, 1]] = [0.25, 0.5]
    parsed = tei_embed_sparse.parse({"inputs": "a"}, limits)
    rendered = parsed.render([Answer(row, 3, False, sparse=True)])
    assert rendered == [[{"index": 1, "value": 0.5}, {"index": 5, "value": 0.25}]]


def test_a_routers_csr_route_is_cut_at_its_own_k_and_its_static_route_not_at_all():
    """SparseEncoder takes max_active_dims from a SparseAutoEncoder only outside a Router: inside one, a CSR route
    keeps its own top-k and a static route is not cut, unless the folder saves a max_active_dims."""
    from bucketing.kinds.sparse.folder import Route, SparseSpec

    routes = {"query": Route("static", "q_0"), "document": Route("csr", "t", pooling_folder="d_2", k=12, hidden_dim=64)}
    spec = SparseSpec(routes, default_route="document")
    assert [spec.cut(t) for t in (None, "query", "document")] == [12, None, 12]
    saved = SparseSpec(routes, default_route="document", max_active_dims=5)
    assert [saved.cut(t) for t in (None, "query", "document")] == [5, 5, 5]
