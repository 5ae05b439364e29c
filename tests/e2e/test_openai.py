"""The OpenAI embeddings API on a real TorchServe (batching on), called with the real `openai` client."""

from __future__ import annotations

import json
import random
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest

from bench.harness.stats import parse_prometheus
from model_store.archives import ROOT, minilm_dir

pytestmark = pytest.mark.e2e

WORDS = "embeddings for retrieval need short queries and long documents served together on one machine".split()


def mixed(n: int, seed: int, words: tuple[int, ...] = (1, 3, 9, 40, 120, 200)) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.choice(words))) for _ in range(n)]


BULK_WORDS = (1, 3, 9, 40)  # bulk texts: mixed lengths (1 to ~60 tokens), thousands in seconds on 2 cores


@pytest.fixture(scope="module")
def served(torchserve, scheduled):
    """The session's TorchServe, serving the model `scheduled` (batch_size 8, max_batch_delay 100, one worker)."""
    return torchserve


@pytest.fixture(scope="module")
def client(served, scheduled) -> openai.OpenAI:
    """What a user writes: the inference key as api_key, `.../predictions/NAME/1.0/v1` as base_url."""
    return openai.OpenAI(
        base_url=f"{served.endpoints.inference}/predictions/{scheduled}/1.0/v1",
        api_key=served.client.keys.key("inference"),
        timeout=60,
        max_retries=0,
    )


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_dir()))


def close(vector, expected) -> bool:
    return float(np.max(np.abs(np.asarray(vector) - expected))) <= 1e-5


def test_default_base64_and_float(client, reference):
    text = "how do I serve embeddings with TorchServe?"
    default = client.embeddings.create(model="minilm", input=text)  # the SDK asks for base64 when numpy is there
    assert default.model == "minilm" and default.object == "list" and len(default.data) == 1
    assert close(default.data[0].embedding, reference(text))
    assert default.usage.prompt_tokens == default.usage.total_tokens > 2
    floats = client.embeddings.create(model="minilm", input=text, encoding_format="float")
    assert close(floats.data[0].embedding, reference(text))


def test_dimensions_keep_the_first_components_renormalised(client, reference):
    text = "matryoshka embeddings keep their first components"
    reply = client.embeddings.create(model="minilm", input=text, dimensions=64)
    vector = np.asarray(reply.data[0].embedding)
    expected = reference(text)[:64] / np.linalg.norm(reference(text)[:64])
    assert vector.shape == (64,) and close(vector, expected)


def test_twenty_mixed_length_texts_in_order(client, reference):
    texts = mixed(20, seed=3)
    reply = client.embeddings.create(model="minilm", input=texts)
    assert [d.index for d in reply.data] == list(range(20))
    for text, item in zip(texts, reply.data, strict=True):
        assert close(item.embedding, reference(text))


def test_2048_inputs_in_one_request_equal_batch_of_one(client, reference):
    """OpenAI's limit of inputs in one request, as the SDK sends it (base64 by default), answered in one response:
    256 mixed-length texts, each 8 times, shuffled."""
    texts = mixed(256, seed=11, words=BULK_WORDS) * 8
    random.Random(11).shuffle(texts)
    reply = client.with_options(timeout=600).embeddings.create(model="minilm", input=texts)
    assert [d.index for d in reply.data] == list(range(2048))
    worst = max(float(np.max(np.abs(np.asarray(d.embedding) - reference(t)))) for t, d in zip(texts, reply.data))
    assert worst <= 1e-5, worst


def test_langchain_embed_documents_of_2500_texts_equal_batch_of_one(served, scheduled, reference):
    """LangChain's OpenAIEmbeddings, unchanged but for `check_embedding_ctx_length=False` (below), in the clients'
    pinned venv (`langchain_client.py`): 2,500 texts (250 mixed-length ones, each 10 times, shuffled), which it
    sends as requests of 1,000 (two whole, one part: what its chunking does to any larger list)."""
    python = ROOT / ".venv-tei-clients" / "bin" / "python"
    if not python.exists():
        pytest.skip("the clients' venv is missing: run `make tei-clients-venv` (CI does)")
    texts = mixed(250, seed=13, words=BULK_WORDS) * 10
    random.Random(13).shuffle(texts)
    base_url = f"{served.endpoints.inference}/predictions/{scheduled}/1.0/v1"
    run = subprocess.run(
        [
            str(python),
            str(Path(__file__).with_name("langchain_client.py")),
            base_url,
            served.client.keys.key("inference"),
        ],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    vectors = json.loads(run.stdout)
    assert len(vectors) == len(texts)
    worst = max(float(np.max(np.abs(np.asarray(v) - reference(t)))) for t, v in zip(texts, vectors))
    assert worst <= 1e-5, worst


def test_a_body_over_max_request_size_is_refused_by_torchserve(served, scheduled):
    from bucketing import sizes

    body = json.dumps({"input": ["x" * 4096] * (sizes.REQUEST_BYTES // 4096 + 1), "model": "m"})
    reply = served.client.call(
        "inference",
        "POST",
        f"/predictions/{scheduled}/1.0/v1/embeddings",
        body,
        headers={"Content-Type": "application/json"},
    )
    assert reply.status == 413, (reply.status, reply.text[:200])


def test_token_ids(client, reference, hf_tokenizer):
    texts = ["token ids from a tokenizer", "and a second, longer text given as ids too"]
    ids = [hf_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    one = client.embeddings.create(model="minilm", input=ids[0])
    many = client.embeddings.create(model="minilm", input=ids)
    assert close(one.data[0].embedding, reference(texts[0]))
    for text, item in zip(texts, many.data, strict=True):
        assert close(item.embedding, reference(text))


def test_a_long_text_chunked_through_the_sdk_equals_sentence_transformers_windows(client, reference):
    from tests.handler.test_chunking import reference as windows_reference

    text = " ".join(mixed(12, seed=7))  # 727 tokens: 3 windows of MiniLM's 254
    got = client.embeddings.create(model="minilm", input=[text, "short"], extra_body={"on_overflow": "chunk"})
    assert close(got.data[0].embedding, windows_reference(minilm_dir(), text, max_length=256))
    assert close(got.data[1].embedding, reference("short"))
    assert got.usage.prompt_tokens == 727 + 2 + 3  # the text with its special tokens once, and "short"


def test_models_list(client, scheduled):
    assert [m.id for m in client.models.list().data] == [scheduled]


def test_openai_native_and_v2_requests_share_batches(served, scheduled, client, reference):
    texts = mixed(24, seed=5)
    before = parse_prometheus(served.client.metrics(), scheduled)

    def call(i: int):
        text = texts[i]
        if i % 3 == 0:
            return text, np.asarray(client.embeddings.create(model="m", input=text).data[0].embedding)
        if i % 3 == 1:
            reply = served.client.predict(scheduled, json.dumps({"text": text}))
            assert reply.status == 200, reply.text
            return text, np.asarray(reply.json()["embedding"])
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
        reply = served.client.call(
            "inference",
            "POST",
            f"/v2/models/{scheduled}/infer",
            json.dumps(body),
            headers={"Content-Type": "application/json"},
        )
        assert reply.status == 200, reply.text
        return text, np.asarray(reply.json()["outputs"][0]["data"])

    with ThreadPoolExecutor(max_workers=len(texts)) as pool:
        results = list(pool.map(call, range(len(texts))))
    for text, vector in results:
        assert close(vector, reference(text))
    after = parse_prometheus(served.client.metrics(), scheduled)
    batches = after["bucket_batches_total"] - before["bucket_batches_total"]
    assert after["bucket_requests_total"] - before["bucket_requests_total"] == len(texts)
    if scheduled == "batch":  # continuous: calls are slices, not batches
        assert batches < len(texts), "TorchServe delivered no batch larger than 1"


def error_body(error):
    """The JSON body of the server's error, as the client parsed it."""
    assert isinstance(error.body, dict), error.body
    return error.body


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"input": ""}, "input"),
        ({"input": [[1, 2], [999999]]}, "input"),
        ({"input": "x", "dimensions": 385}, "dimensions"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ],
)
def test_bad_requests_raise_the_clients_own_errors(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="minilm", **kwargs)
    error = error_body(caught.value)
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_too_many_inputs_and_unknown_paths(client):
    with pytest.raises(openai.APIStatusError) as caught:
        client.embeddings.create(model="minilm", input=["x"] * 2049)
    error = error_body(caught.value)
    assert caught.value.status_code == 413 and error["code"] == "too_many_texts"
    assert "at most 2048 per request (handler.max_texts_per_request): send them in several requests" in error["message"]
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="minilm", prompt="hello")
    assert "v1/embeddings" in error_body(missing.value)["message"]


def test_json_without_content_type_and_huge_keys(served, scheduled, reference):
    reply = served.client.predict(scheduled, json.dumps({"text": "no content type"}), content_type=None)
    assert reply.status == 200 and close(reply.json()["embedding"], reference("no content type"))
    huge = json.dumps({"\u00e9" * 1_100_000: 1}, ensure_ascii=False).encode()  # 2.2 MB, under max_request_size
    reply = served.client.predict(scheduled, huge)
    assert reply.status == 400 and len(reply.body) < 1000
