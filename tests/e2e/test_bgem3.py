"""BGE-M3 through a real TorchServe: a tiny random folder laid out as BAAI/bge-m3, built with one command (its kind
detected from the folder, both heads' files carried in the archive), answers all three outputs in our JSON (two
requests batched together), TEI's /embed_sparse and /embed_all (and /embed_sparse as Haystack's TEI sparse embedders
send it), and OpenAI's dense, each equal to FlagEmbedding's
`BGEM3FlagModel.encode` (run in its own venv: `make flag-venv`); the worker's ready line names the outputs."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from model_store import build
from tests.bgem3_folder import FLAG_PYTHON, build_bgem3, reference
from tests.e2e.conftest import call_all
from tests.e2e.test_serving import texts_for_load
from tests.e2e.test_tei import CLIENTS_PYTHON, run_clients

pytestmark = pytest.mark.e2e
TOLERANCE = 1e-5


def test_a_bgem3_folder_serves_its_three_outputs_as_flagembedding(torchserve, model_store, tmp_path):
    if not (FLAG_PYTHON.parent.parent / ".installed").exists():
        pytest.skip("FlagEmbedding's venv is missing: run `make flag-venv` (CI does)")
    folder = build_bgem3(tmp_path / "bge-m3", colbert_dim=24)
    name = "tiny-bgem3"
    argv = ["--model-dir", str(folder), "--name", name, "--strategies", "bucketed", "--out", str(model_store)]
    assert build.main(argv) == 0
    archive = model_store / f"{name}-bucketed.mar"
    with zipfile.ZipFile(archive) as mar:
        carried = {n.rsplit("/", 1)[-1] for n in mar.namelist()}
    assert {"sparse_linear.pt", "colbert_linear.pt"} <= carried and "README.md" not in carried
    client = torchserve.client
    client.register(archive.name, name, batch_size=8, max_batch_delay=100, workers=1)
    texts = texts_for_load(6, seed=9)
    outputs = ["dense", "sparse", "colbert"]
    calls = [
        (f"/predictions/{name}", {"texts": texts[:3], "outputs": outputs}),
        (f"/predictions/{name}", {"texts": texts[3:], "outputs": outputs}),
        (f"/predictions/{name}/1.0/embed_sparse", {"inputs": texts}),
        (f"/predictions/{name}/1.0/embed_all", {"inputs": texts}),
        (f"/predictions/{name}/1.0/v1/embeddings", {"input": texts, "model": name}),
    ]
    try:
        replies = call_all(client, calls)
        for reply in replies:
            assert reply.status == 200, reply.body[:300]
        first, second, sparse, colbert, openai = (r.json() for r in replies)
        max_length = 128  # the archive's max_length: the folder's own limit
        want = reference(folder, texts, max_length, colbert_dim=24)
        native = first + second
        for i, answer in enumerate(native):
            assert answer["tokens"] == want["tokens"][i]
            assert np.abs(np.asarray(answer["embedding"]) - want["dense"][i]).max() <= TOLERANCE
            assert np.abs(np.asarray(openai["data"][i]["embedding"]) - want["dense"][i]).max() <= TOLERANCE
            for vectors in (answer["colbert"], colbert[i]):
                assert np.asarray(vectors).shape == np.asarray(want["colbert"][i]).shape
                assert np.abs(np.asarray(vectors) - want["colbert"][i]).max() <= TOLERANCE
            theirs = {int(k): v for k, v in want["sparse"][i].items()}
            tei = {p["index"]: p["value"] for p in sparse[i]}
            for ours in (dict(zip(answer["sparse"]["indices"], answer["sparse"]["values"])), tei):
                assert sorted(ours) == sorted(theirs)
                assert max(abs(ours[k] - theirs[k]) for k in ours) <= TOLERANCE
        haystack = haystack_sparse(torchserve, name, texts)
        if haystack is not None:  # a hybrid-search client's lexical side, unchanged: Haystack's TEI sparse embedders
            for got, theirs in zip([*haystack["documents"], haystack["query"]], [*want["sparse"], want["sparse"][0]]):
                ours = dict(zip(got["indices"], got["values"]))
                assert sorted(ours) == sorted(int(k) for k in theirs)
                assert max(abs(ours[int(k)] - v) for k, v in theirs.items()) <= TOLERANCE
        log = (torchserve.workdir / "logs" / "model_log.log").read_text(errors="replace")
        ready = [line for line in log.splitlines() if "bucketing handler ready" in line and "task='bgem3'" in line]
        assert ready and "dense (32), sparse (lexical weights" in ready[-1] and "colbert (24 per token)" in ready[-1]
    finally:
        client.unregister(name)


def haystack_sparse(torchserve, name: str, texts: list[str]) -> dict | None:
    """What Haystack's HuggingFaceTEISparseDocumentEmbedder and ...TextEmbedder got from the model URL, run in the TEI
    clients' venv (`tests/e2e/tei_clients.py sparse`); None (and the rest checked) where that venv is missing."""
    if not CLIENTS_PYTHON.exists():
        return None
    url = f"{torchserve.endpoints.inference}/predictions/{name}/1.0"
    return run_clients(url, torchserve.client.keys.key("inference"), texts, "sparse")
