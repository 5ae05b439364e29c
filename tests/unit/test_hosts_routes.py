"""The hosts' one route table (`bucketing.hosts.routes`) and TorchServe's rows (`bucketing.hosts.rows`): pure."""

from __future__ import annotations

import json

import pytest

from bucketing import protocols
from bucketing.hosts import routes
from bucketing.hosts.routes import Match, match
from bucketing.hosts.rows import media_type, torchserve_row

MODELS = {"m": "1.0"}


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/predictions/m", Match("predict", "m", "", None)),
        ("POST", "/predictions/m/1.0", Match("predict", "m", "", "1.0")),
        ("POST", "/predictions/m/1.0/v1/embeddings", Match("predict", "m", "v1/embeddings", "1.0")),
        ("POST", "/predictions/m/1.0/v1/embeddings/", Match("predict", "m", "v1/embeddings", "1.0")),
        ("GET", "/predictions/m/1.0/v1/models", Match("predict", "m", "v1/models", "1.0")),
        ("POST", "/predictions/m/1.0/anything/else", Match("predict", "m", "anything/else", "1.0")),
        ("POST", "/v1/models/m:predict", Match("predict", "m", None)),
        ("POST", "/v2/models/m/infer", Match("predict", "m", None)),
        ("POST", "/v1/embeddings", Match("predict", "m", "v1/embeddings", "1.0")),
        ("GET", "/v1/models", Match("predict", "m", "v1/models", "1.0")),
        ("POST", "/openai/v1/embeddings", Match("predict", "m", "v1/embeddings", "1.0")),
        ("POST", "/openai/v1/rerank", Match("predict", "m", "v1/rerank", "1.0")),
        ("GET", "/ping", Match("ping")),
        ("GET", "/metrics", Match("metrics")),
        ("GET", "/v2/health/live", Match("live")),
        ("GET", "/v2/health/ready", Match("ready")),
        ("GET", "/v2", Match("server_meta")),
        ("GET", "/v2/models/m", Match("model_v2", "m")),
        ("GET", "/v2/models/m/ready", Match("model_ready", "m")),
        ("GET", "/v1/models/m", Match("model_v1", "m")),
        ("POST", "/predictions/x", Match("model_not_found", "x")),
        ("POST", "/predictions/m/2.0", Match("version_not_found", "m", version="2.0")),
        ("POST", "/v1/models/x:predict", Match("model_not_found", "x")),
        ("POST", "/v2/models/x/infer", Match("model_not_found", "x")),
        ("GET", "/v2/models/x/ready", Match("kserve_model_not_found", "x")),
        ("POST", "/predictions", Match("not_found")),
        ("GET", "/nothing/here", Match("not_found")),
        ("DELETE", "/v1/embeddings", Match("method_not_allowed")),
        ("POST", "/metrics", Match("method_not_allowed")),
    ],
)
def test_the_route_table(method, path, expected):
    assert match(method, path, MODELS) == expected


def test_torchserve_url_path_is_what_follows_the_version():
    # TorchServe joins the segments after /predictions/NAME/VERSION/ (Java's split drops trailing empties only)
    assert routes.java_split("/a//b/") == ["", "a", "", "b"]
    assert match("POST", "/predictions/m/1.0/a//b", MODELS).url_path == "a//b"


def test_root_routes_name_routes_of_the_wire_formats_and_several_models_pick_by_body():
    assert set(routes.ROOT_ROUTES.values()) <= set(protocols.ROUTES)
    two = {"m": "1.0", "n": "1.0"}
    assert match("POST", "/v1/embeddings", two).by_body and not match("GET", "/v1/models", two).by_body


def test_every_wire_route_is_among_the_served_paths():
    paths = routes.served_paths("m")
    for route in protocols.ROUTES:
        assert (f"/predictions/m/1.0/{route}" if route else "/predictions/m/1.0") in paths
    for path in paths:  # and each of them routes somewhere other than a 404
        method = "GET" if path.endswith(("models", "info", "ping", "metrics", "live", "ready", "/v2", "/m")) else "POST"
        assert match(method, path, MODELS).action not in routes.ERROR_ACTIONS, path


@pytest.mark.parametrize(
    ("body", "content_type", "expected_row", "expected_type"),
    [
        (b'{"text": "a"}', "application/json", {"body": {"text": "a"}}, "application/json"),
        (b'{"text": "a"}', "application/json; charset=utf-8", {"body": {"text": "a"}}, "application/json"),
        (b'{"text": ', "application/json", {"body": b'{"text": '}, "application/json"),  # forwarded as bytes
        (b"hello", "text/plain", {"body": "hello"}, "text/plain"),
        (b"\xff", "text/plain", {"body": b"\xff"}, "text/plain"),
        (b'{"a": 1}', None, {"body": b'{"a": 1}'}, None),
        (b"x", "Application/JSON", {"body": b"x"}, "Application/JSON"),  # TorchServe parses exactly application/json
    ],
)
def test_a_request_becomes_torchserves_row(body, content_type, expected_row, expected_type):
    headers = {"content-type": content_type} if content_type else {}
    row, meta = torchserve_row(body, headers, "v1/embeddings")
    assert row == expected_row and meta.content_type == expected_type
    assert meta.url_path == "v1/embeddings" and meta.header("url_path") == "v1/embeddings"


def test_a_form_body_reaches_the_handler_as_no_body_with_its_full_type():
    row, meta = torchserve_row(b"a=1", {"content-type": "application/x-www-form-urlencoded; x=y"}, None)
    assert row == {} and meta.content_type == "application/x-www-form-urlencoded; x=y" and meta.url_path is None
    outcome = protocols.parse(row, meta, _limits()).outcome
    assert getattr(outcome, "status", None) == 415


def test_media_type_is_nettys():
    assert media_type(" application/json ; charset=utf-8") == "application/json" and media_type(None) == ""


def test_the_binary_header_reaches_the_handler():
    head = json.dumps({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "parameters": {}}]}).encode()
    row, meta = torchserve_row(head, {"inference-header-content-length": str(len(head))}, None)
    assert meta.header("Inference-Header-Content-Length") == str(len(head)) and row == {"body": head}


def _limits():
    from tests.unit.wire import LIMITS

    return LIMITS
