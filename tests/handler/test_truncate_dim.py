"""A model's own `truncate_dim` (its folder's `config_sentence_transformers.json`, which sentence-transformers saves
and loads, or `handler.truncate_dim`) answers what `SentenceTransformer(folder, truncate_dim=N).encode()` gives,
within 1e-5: cut after the chain's Normalize, not re-normalised; and its packed and ranged precisions what
`quantize_embeddings` makes of that, in every wire format. A request's `dimensions` asks at most N (OpenAI's cut,
re-normalised); above it is a 400 in one line."""

from __future__ import annotations

import json
import shutil

import pytest

from model_store.archives import engine_model_dir
from tests.handler.test_handler import make_handler, mixed_texts, serve, serve_at
from tests.handler.test_precision import bits_differ, buckets_differ
from tests.handler.test_sentence_transformers import TOLERANCE
from tests.models import build_sentence_transformer

np = pytest.importorskip("numpy")
sentence_transformers = pytest.importorskip("sentence_transformers")
quantization = pytest.importorskip("sentence_transformers.util.quantization")

CUT = 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A normalising chain saved with truncate_dim 8 (by sentence-transformers), and a plain mean chain."""
    root = tmp_path_factory.mktemp("cut")
    full = build_sentence_transformer(root / "full", normalize=True)
    saved = root / "saved"
    sentence_transformers.SentenceTransformer(str(full), device="cpu", truncate_dim=CUT).save(str(saved))
    return {"full": full, "saved": saved, "plain": build_sentence_transformer(root / "plain", seed=3)}


def close(got, expected):
    got = np.asarray(got)
    assert got.shape == expected.shape and float(np.max(np.abs(got - expected))) <= TOLERANCE


def test_sentence_transformers_saves_truncate_dim_in_the_folder(folders):
    saved = json.loads((folders["saved"] / "config_sentence_transformers.json").read_text())
    assert saved["truncate_dim"] == CUT
    assert sentence_transformers.SentenceTransformer(str(folders["saved"]), device="cpu").truncate_dim == CUT


@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
def test_a_saved_truncate_dim_answers_as_encode_in_every_format(folders, engine, tmp_path):
    folder = engine_model_dir(folders["saved"], engine, "embedding", tmp_path / engine)
    handler, context = make_handler(folder, engine=engine, max_length=128)
    assert "answers cut to truncate_dim 8 (config_sentence_transformers.json)" in handler.worker.ready_line()
    texts = mixed_texts(6, seed=31) + ["short"]
    model = sentence_transformers.SentenceTransformer(str(folders["saved"]), device="cpu")
    expected = model.encode(texts, convert_to_numpy=True)
    assert expected.shape == (len(texts), CUT) and not np.allclose(np.linalg.norm(expected, axis=1), 1)
    v2 = {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    rows = [
        {"texts": texts},
        {"input": texts, "model": "m"},
        {"instances": texts},
        v2,
        {"inputs": texts},
        {"texts": texts, "input_type": "search_document", "embedding_types": ["float"]},
        {},
    ]
    paths = ["", "v1/embeddings", "", "", "embed", "v2/embed", "info"]
    answers = serve_at(handler, context, rows, paths)
    assert [s for s, _ in answers] == [200] * len(rows), answers
    (_, ours), (_, openai), (_, v1), (_, v2_answer), (_, tei), (_, cohere), (_, info) = answers
    close([a["embedding"] for a in ours], expected)
    close([d["embedding"] for d in openai["data"]], expected)
    close([p["embedding"] for p in v1["predictions"]], expected)
    tensor = next(o for o in v2_answer["outputs"] if o["name"] == "embedding")
    assert tensor["shape"] == [len(texts), CUT]
    close(np.reshape(tensor["data"], (len(texts), CUT)), expected)
    close(tei, expected)
    close(cohere["embeddings"]["float"], model.encode_document(texts, convert_to_numpy=True))
    assert info["truncate_dim"] == CUT


def test_handler_truncate_dim_equals_encode_with_that_truncate_dim(folders):
    texts = mixed_texts(6, seed=32)
    for name in ("full", "plain"):
        handler, context = make_handler(folders[name], max_length=128, truncate_dim=CUT)
        assert "truncate_dim 8 (handler.truncate_dim)" in handler.worker.ready_line()
        ((status, body),) = serve(handler, context, [{"body": {"texts": texts}}])
        model = sentence_transformers.SentenceTransformer(str(folders[name]), device="cpu", truncate_dim=CUT)
        assert status == 200
        close([a["embedding"] for a in body], model.encode(texts, convert_to_numpy=True))


def test_precisions_quantize_the_cut_embedding(folders, tmp_path):
    from model_store.ranges import write_ranges

    folder = tmp_path / "ranged"
    shutil.copytree(folders["saved"], folder)
    write_ranges(folder, mixed_texts(40, seed=3))
    stored = json.loads((folder / "embedding_ranges.json").read_text())
    ranges = np.asarray([stored["minimums"], stored["maximums"]], dtype=np.float32)
    full = sentence_transformers.SentenceTransformer(str(folders["full"]), device="cpu")
    assert ranges.shape[1] == 32  # every dimension's range: the cut uses the first ones
    assert np.allclose(ranges[0], full.encode(mixed_texts(40, seed=3)).min(axis=0), atol=1e-6)
    handler, context = make_handler(folder, max_length=128)
    texts = mixed_texts(7, seed=33) + ["a text far outside the calibration texts: " * 3]
    floats = sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(texts)
    rows = [{"body": {"texts": texts, "precision": p}} for p in ("binary", "ubinary", "int8", "uint8")]
    answers = serve(handler, context, rows)
    assert [s for s, _ in answers] == [200] * 4
    got = {
        p: np.array([a["embedding"] for a in body])
        for p, (_, body) in zip(("binary", "ubinary", "int8", "uint8"), answers)
    }
    for precision in ("binary", "ubinary"):
        assert got[precision].shape == (len(texts), 1) and bits_differ(got[precision], floats, precision) == 0
    for precision in ("int8", "uint8"):
        assert got[precision].shape == (len(texts), CUT)
        assert buckets_differ(got[precision], floats, precision, ranges[:, :CUT]) == 0


def test_a_request_asks_at_most_truncate_dim(folders):
    handler, context = make_handler(folders["saved"], max_length=128)
    texts = mixed_texts(4, seed=34)
    rows = [
        {"texts": texts, "dimensions": 4},
        {"texts": texts, "dimensions": CUT + 1},
        {"input": texts, "dimensions": 32},
        {"texts": texts, "output_dimension": CUT + 1, "input_type": "search_query", "embedding_types": ["float"]},
        {"inputs": texts, "dimensions": CUT},
    ]
    answers = serve_at(handler, context, rows, ["", "", "v1/embeddings", "v2/embed", "embed"])
    assert [s for s, _ in answers] == [200, 400, 400, 400, 200], answers
    model = sentence_transformers.SentenceTransformer(str(folders["full"]), device="cpu")
    close([a["embedding"] for a in answers[0][1]], model.encode(texts, truncate_dim=4, normalize_embeddings=True))
    line = '"dimensions" must be an integer from 1 to 8 (this model\'s truncate_dim; its embedding size is 32), got 9'
    assert answers[1][1]["message"] == line
    assert "from 1 to 8 (this model's truncate_dim" in answers[2][1]["error"]["message"]
    assert answers[3][1]["message"].startswith("'output_dimension' must be an integer from 1 to 8")
    # asked, dimensions is OpenAI's cut: re-normalised, unlike the model's own truncate_dim
    close(answers[4][1], model.encode(texts, truncate_dim=CUT, normalize_embeddings=True))


def test_a_truncate_dim_above_the_embedding_size_stops_the_worker(folders):
    from bucketing.model.chain import ChainError

    with pytest.raises(ChainError, match=r"^handler.truncate_dim: truncate_dim 33 must be an integer from 1 to 32"):
        make_handler(folders["full"], max_length=128, truncate_dim=33)
