"""A dense embedding asked in a packed precision (`binary`, `ubinary`) equals sentence-transformers' own
`encode(precision=...)` of the same folder, on both engines, batched with other requests, with `dimensions` too:
every bit, but where a float component is within the float tolerance of zero (its sign is the float's rounding)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.handler.test_handler import make_handler, mixed_texts, serve
from tests.handler.test_sentence_transformers import TOLERANCE, VARIANTS, ours
from tests.models import build_sentence_transformer

np = pytest.importorskip("numpy")
sentence_transformers = pytest.importorskip("sentence_transformers")
quantization = pytest.importorskip("sentence_transformers.util.quantization")

USED = ("mean-normalize", "dense-chain")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("st")
    return {name: build_sentence_transformer(root / name, **VARIANTS[name]) for name in USED}


def bits_differ(got, floats, precision):
    """Packed values that differ from the packing of `floats`, leaving out bits whose float is a tie at zero."""
    expected = quantization.quantize_embeddings(floats, precision)
    got = np.asarray(got).astype(expected.dtype)
    ties = np.abs(floats) <= TOLERANCE
    differ = np.unpackbits((got ^ expected).astype(np.uint8), axis=-1)[:, : floats.shape[1]]
    return int(np.count_nonzero(differ & ~ties))


@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
@pytest.mark.parametrize("precision", ["binary", "ubinary"])
@pytest.mark.parametrize("variant", USED)
def test_a_packed_precision_equals_encode_with_that_precision(folders, variant, precision, engine, tmp_path):
    folder, texts = folders[variant], mixed_texts(8, seed=11)[:7] + ["short"]
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    floats = model.encode(texts, batch_size=len(texts), convert_to_numpy=True)
    got = ours(folder, engine, texts, tmp_path, precision=precision)
    assert got.shape == (len(texts), (floats.shape[1] + 7) // 8)
    assert bits_differ(got, floats, precision) == 0
    cut = ours(folder, engine, texts, tmp_path, precision=precision, dimensions=8)
    assert bits_differ(cut, model.encode(texts, convert_to_numpy=True, truncate_dim=8), precision) == 0


def test_an_int8_request_is_refused_without_stored_ranges(folders):
    handler, context = make_handler(folders["mean-normalize"], max_length=128)
    ((status, body),) = serve(handler, context, [{"body": {"texts": ["x"], "precision": "int8"}}])
    assert status == 400 and "needs per-dimension ranges fixed for the model" in body["message"], body


def buckets_differ(got, floats, precision, ranges):
    """Ranged values that differ from `quantize_embeddings(floats, ranges=...)`, leaving out components within the
    float tolerance of a bucket's edge (which bucket is the float's rounding)."""
    expected = quantization.quantize_embeddings(floats, precision, ranges=ranges)
    ranges = ranges[:, : floats.shape[1]]
    steps = np.where(ranges[1] == ranges[0], 1, (ranges[1] - ranges[0]) / 255)
    position = (floats - ranges[0]) / steps
    edge = np.abs(position - np.round(position)) * steps <= TOLERANCE
    return int(np.count_nonzero((np.asarray(got) != expected) & ~edge))


@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
@pytest.mark.parametrize("precision", ["int8", "uint8"])
def test_a_ranged_precision_equals_quantize_embeddings_with_the_stored_ranges(folders, precision, engine, tmp_path):
    from model_store.ranges import write_ranges

    folder = tmp_path / "ranged"
    shutil.copytree(folders["mean-normalize"], folder)
    write_ranges(folder, mixed_texts(40, seed=3))
    ranges = np.asarray(
        [json.loads((folder / "embedding_ranges.json").read_text())[k] for k in ("minimums", "maximums")]
    )
    texts = mixed_texts(8, seed=12)[:7] + ["a text far outside the calibration texts: " * 3]
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    floats = model.encode(texts, batch_size=len(texts), convert_to_numpy=True)
    got = ours(folder, engine, texts, tmp_path, precision=precision)
    assert got.shape == floats.shape and buckets_differ(got, floats, precision, ranges.astype(np.float32)) == 0
    cut = ours(folder, engine, texts, tmp_path, precision=precision, dimensions=8)
    cut_floats = model.encode(texts, convert_to_numpy=True, normalize_embeddings=True, truncate_dim=8)
    # a re-normalised cut: the ranges sentence-transformers takes from the calibration texts embedded the same way
    calibration = model.encode(
        mixed_texts(40, seed=3), convert_to_numpy=True, normalize_embeddings=True, truncate_dim=8
    )
    cut_ranges = np.stack([calibration.min(axis=0), calibration.max(axis=0)])
    assert buckets_differ(cut, cut_floats, precision, cut_ranges) == 0
