"""Text Embeddings Inference's API on a real TorchServe (TorchServe's batching, and continuous batching), called
with the real `huggingface_hub.InferenceClient` whose model is the URL `.../predictions/NAME/1.0` (it posts TEI's
`{"inputs", ...}` to that URL itself): `feature_extraction` equals `SentenceTransformer.encode()` within 1e-5."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from model_store.archives import minilm_dir

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CLIENTS_VENV = ROOT / ".venv-tei-clients"
CLIENTS = Path(__file__).with_name("tei_clients.py")
CLIENTS_PYTHON = CLIENTS_VENV / "bin" / "python"
TEXTS = [
    "how do I serve embeddings with TorchServe?",
    "Dynamic padding pads the batch to its longest text, so a short query shares the cost of a long passage. " * 4,
    "Un texte en fran\u00e7ais, avec des accents.",
]


@pytest.fixture(scope="module")
def served(torchserve, scheduled):
    """The session's TorchServe, serving the model `scheduled` (batch_size 8, one worker)."""
    return torchserve


@pytest.fixture(scope="module")
def url(served, scheduled) -> str:
    return f"{served.endpoints.inference}/predictions/{scheduled}/1.0"


@pytest.fixture(scope="module")
def client(served, url):
    from huggingface_hub import InferenceClient

    return InferenceClient(model=url, token=served.client.keys.key("inference"), timeout=60)


@pytest.fixture(scope="module")
def sentence_transformer():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir()), device="cpu")


@pytest.fixture(scope="module")
def expected(sentence_transformer):
    return sentence_transformer.encode(TEXTS, convert_to_numpy=True)


def test_feature_extraction_equals_sentence_transformers(client, expected):
    batch = client.feature_extraction(TEXTS)
    assert batch.shape == expected.shape and float(np.max(np.abs(batch - expected))) <= 1e-5
    one = client.feature_extraction(TEXTS[0], normalize=True, truncate=True, truncation_direction="right")
    assert one.shape == (1, expected.shape[1]) and float(np.max(np.abs(one[0] - expected[0]))) <= 1e-5


def test_sentence_similarity_equals_sentence_transformers(client, sentence_transformer):
    model = sentence_transformer
    expected = model.similarity(model.encode(TEXTS[:1]), model.encode(TEXTS[1:])).numpy()[0]
    scores = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    assert len(scores) == 2 and float(np.max(np.abs(np.asarray(scores) - expected))) <= 1e-5


def test_teis_routes_under_the_model_url(served, scheduled):
    def call(route, body=None, method="POST"):
        path = f"/predictions/{scheduled}/1.0/{route}"
        data = json.dumps(body) if body is not None else None
        reply = served.client.call("inference", method, path, data, headers={"Content-Type": "application/json"})
        return reply.status, reply.json()

    status, embedded = call("embed", {"inputs": TEXTS[0]})
    assert status == 200 and len(embedded) == 1
    status, info = call("info", method="GET")
    assert status == 200 and info["model_id"] == scheduled and info["model_type"] == {"embedding": {"pooling": "mean"}}
    status, tokens = call("tokenize", {"inputs": "hello world"})
    assert [t["text"] for t in tokens[0]] == ["[CLS]", "hello", "world", "[SEP]"]
    assert call("decode", {"ids": [t["id"] for t in tokens[0]]}) == (200, ["hello world"])
    status, sparse = call("embed_sparse", {"inputs": "a"})
    assert status == 424 and sparse["error_type"] == "Backend"
    assert call("embed", {"inputs": []}) == (400, {"error": "`inputs` cannot be empty", "error_type": "Empty"})


def test_the_clients_own_error_on_a_bad_request(client):
    from huggingface_hub.errors import HfHubHTTPError

    with pytest.raises(HfHubHTTPError) as raised:
        client.feature_extraction(TEXTS, dimensions=100000)
    assert raised.value.response.status_code == 422 and "dimensions" in str(raised.value)


@pytest.fixture(scope="module")
def clients(served, url):
    """What the clients in their own pinned venv (`tei_clients.py`) got back, run once for the module."""
    if not CLIENTS_PYTHON.exists():
        pytest.skip("the TEI clients' venv is missing: run `make tei-clients-venv` (CI does)")
    return run_clients(url, served.client.keys.key("inference"), TEXTS)


def run_clients(url: str, token: str, texts: list[str], *mode: str) -> dict:
    """What `tei_clients.py` (in the clients' own venv) printed against the model URL `url`."""
    run = subprocess.run(
        [str(CLIENTS_PYTHON), str(CLIENTS), url, token, *mode],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


def test_llamaindex_tei_client_equals_sentence_transformers(clients, expected):
    """LlamaIndex's TextEmbeddingsInference (its own httpx POST to `{base_url}/embed`)."""
    assert float(np.max(np.abs(np.asarray(clients["llamaindex_documents"]) - expected))) <= 1e-5
    assert float(np.max(np.abs(np.asarray(clients["llamaindex_query"]) - expected[0]))) <= 1e-5


def test_cohere_sdk_embed_equals_sentence_transformers(clients, sentence_transformer, expected, served, scheduled):
    """Cohere's SDK (`ClientV2.embed`, posting to `{base_url}/v2/embed`): float equal to `encode()`, binary and
    ubinary equal to `quantize_embeddings` of it (every bit whose float is not within 1e-5 of zero), int8 to
    `quantize_embeddings` with the archive's ranges (the build's default calibration texts; /info states them)."""
    from sentence_transformers.util.quantization import quantize_embeddings

    got = clients["cohere"]
    assert float(np.max(np.abs(np.asarray(got["documents"]["float"]) - expected))) <= 1e-5
    query = sentence_transformer.encode_query(TEXTS[:1], convert_to_numpy=True)
    assert float(np.max(np.abs(np.asarray(got["query"]) - query))) <= 1e-5
    ties = np.abs(expected) <= 1e-5
    for packing in ("binary", "ubinary"):
        packed = np.asarray(quantize_embeddings(expected, packing))
        differ = np.unpackbits(
            (np.asarray(got["documents"][packing]).astype(packed.dtype) ^ packed).astype(np.uint8), axis=-1
        )
        assert int(np.count_nonzero(differ[:, : expected.shape[1]] & ~ties)) == 0
    reply = served.client.call("inference", "GET", f"/predictions/{scheduled}/1.0/info", None)
    ranges = np.asarray(reply.json()["embedding_ranges"], dtype=np.float32)
    assert "values" in got["int8"], got["int8"]
    steps = (ranges[1] - ranges[0]) / 255
    position = (expected - ranges[0]) / steps
    edge = np.abs(position - np.round(position)) * steps <= 1e-5
    wanted = quantize_embeddings(expected, "int8", ranges=ranges)
    assert int(np.count_nonzero((np.asarray(got["int8"]["values"]) != wanted) & ~edge)) == 0
