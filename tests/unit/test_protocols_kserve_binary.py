"""KServe v2 with binary data (as KServe's and Triton's clients send it): binary inputs, text pairs with either
input binary, their mistakes, outputs selected and sent binary."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from bucketing import protocols
from bucketing.protocols import kserve_v2
from bucketing.protocols.base import BadRequest, Binary, RequestError, TooLarge
from bucketing.protocols.kserve_v2 import V2Request
from tests.unit.wire import CLASSIFIER, JSON, answer, incoming, parse, raised, v2


def v2_binary(texts, extra=None, header=None):
    """A body as KServe's and Triton's clients send it with binary_data=True."""
    raw = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    tensor = {"name": "text", "datatype": "BYTES", "shape": [len(texts)], "parameters": {"binary_data_size": len(raw)}}
    head = json.dumps(header or {"id": "b1", "model_name": "m", "inputs": [tensor], **(extra or {})}).encode()
    return head + raw, {"inference-header-content-length": str(len(head))}


def test_kserve_v2_binary_inputs():
    body, headers = v2_binary(["caf\u00e9", "a b", "c"])
    result = incoming(body, "application/octet-stream", headers=headers)
    assert result.wire is kserve_v2.WIRE and result.outcome == V2Request(("caf\u00e9", "a b", "c"), "b1")


@pytest.mark.parametrize(
    "mutate, status, words",
    [
        (lambda b, h: (b, {"inference-header-content-length": "x"}), 400, "must be a length"),
        (lambda b, h: (b, {"inference-header-content-length": str(len(b) + 1)}), 400, "must be a length"),
        (lambda b, h: (b[:-1], h), 400, "5 bytes follow"),
        (lambda b, h: (b[: int(h["inference-header-content-length"])], h), 400, "0 bytes follow"),
        (lambda b, h: (b"{" + b[1:], {"inference-header-content-length": "3"}), 400, "not a JSON object"),
    ],
)
def test_kserve_v2_binary_mistakes(mutate, status, words):
    body, headers = mutate(*v2_binary(["ab"]))
    result = incoming(body, "application/octet-stream", headers=headers)
    assert isinstance(result.outcome, RequestError) and result.outcome.status == status, result.outcome
    assert words in result.outcome.message


def test_kserve_v2_binary_elements_are_checked():
    raw = struct.pack("<I", 10) + b"short"
    head = json.dumps(
        {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(raw)}}]}
    ).encode()
    result = incoming(head + raw, None, headers={"inference-header-content-length": str(len(head))})
    assert result.outcome.status == 400 and "claims 10 bytes" in result.outcome.message
    too_many = raised(kserve_v2.decode_bytes, b"".join(struct.pack("<I", 1) + b"x" for _ in range(5)), 4)
    assert isinstance(too_many, TooLarge) and too_many.status == 413
    not_utf8 = raised(kserve_v2.decode_bytes, struct.pack("<I", 2) + b"\xff\xfe", 4)
    assert isinstance(not_utf8, BadRequest) and not_utf8.type == "InvalidEncoding"


def test_kserve_v2_outputs_selected_and_binary():
    answers = [answer([0.5, 0.25], 3), answer([1.0, 0.0], 4, True)]
    request = parse(
        v2(["a", "b"], outputs=[{"name": "tokens"}, {"name": "embedding", "parameters": {"binary_data": True}}]), JSON
    )
    assert request.outputs == ("tokens", "embedding") and request.binary == frozenset({"embedding"})
    rendered = request.render(answers, "m")
    assert isinstance(rendered, Binary) and [t["name"] for t in rendered.header["outputs"]] == ["tokens", "embedding"]
    tokens, embedding = rendered.header["outputs"]
    assert tokens["data"] == [3, 4] and "data" not in embedding and embedding["parameters"]["binary_data_size"] == 16
    assert np.array_equal(np.frombuffer(rendered.chunks[0], "<f4"), np.array([0.5, 0.25, 1.0, 0.0], "<f4"))
    everything = parse(v2(["a", "b"], parameters={"binary_data_output": True}), JSON).render(answers, "m")
    assert [t["parameters"]["binary_data_size"] for t in everything.header["outputs"]] == [16, 16, 2]
    assert everything.chunks[2] == b"\x00\x01"
    reply = protocols.Incoming(kserve_v2.WIRE, parse(v2(["a", "b"], parameters={"binary_data_output": True}), JSON))
    sent = reply.reply(answers, "m", 10**6)
    length = int(dict(sent.headers)["Inference-Header-Content-Length"])
    assert sent.content_type == "application/octet-stream" and json.loads(sent.body[:length])["model_name"] == "m"
    unknown = parse(v2(["a"], outputs=[{"name": "logits"}]), JSON)
    assert unknown.status == 400 and "unknown output(s) 'logits'" in unknown.message


def v2_pair_body(binary_names, queries=("q", "q"), documents=("d1", "d2"), order=("text", "text_pair")):
    """A v2 pair request whose inputs named in `binary_names` carry their data as binary (in the order sent)."""
    columns = {"text": list(queries), "text_pair": list(documents)}
    tensors, raw = [], b""
    for name in order:
        data = columns[name]
        tensor = {"name": name, "datatype": "BYTES", "shape": [len(data)]}
        if name in binary_names:
            chunk = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in data)
            tensor["parameters"] = {"binary_data_size": len(chunk)}
            raw += chunk
        else:
            tensor["data"] = data
        tensors.append(tensor)
    head = json.dumps({"inputs": tensors}).encode()
    return head + raw, {"inference-header-content-length": str(len(head))}


@pytest.mark.parametrize("order", [("text", "text_pair"), ("text_pair", "text")])
@pytest.mark.parametrize("binary_names", [{"text"}, {"text_pair"}, {"text", "text_pair"}])
def test_kserve_v2_pairs_with_either_input_binary_are_served(binary_names, order):
    from bucketing.protocols.base import Pair

    body, headers = v2_pair_body(binary_names, ("q1", "q2"), ("d1", "d2"), order)
    request = incoming(body, "application/octet-stream", headers=headers, limits=CLASSIFIER).outcome
    assert isinstance(request, V2Request), request
    assert request.inputs == (Pair("q1", "d1"), Pair("q2", "d2"))


def test_kserve_v2_pair_binary_sizes_must_add_up():
    body, headers = v2_pair_body({"text_pair"})
    error = incoming(body + b"x", "application/octet-stream", headers=headers, limits=CLASSIFIER).outcome
    assert error.status == 400 and "binary_data_size add up to 12 but 13 bytes follow" in error.message
    head = json.loads(body[: int(headers["inference-header-content-length"])])
    head["inputs"][0]["parameters"] = {"binary_data_size": "4"}
    head = json.dumps(head).encode()
    rebuilt = head + body[int(headers["inference-header-content-length"]) :]
    headers = {"inference-header-content-length": str(len(head))}
    error = incoming(rebuilt, "application/octet-stream", headers=headers, limits=CLASSIFIER).outcome
    assert error.status == 400 and "inputs[0].parameters.binary_data_size must be a byte count" in error.message
