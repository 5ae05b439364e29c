"""The sparse bench's generated SPLADE (bench.models.minilm_splade_random: MiniLM's geometry as a masked LM, its
sentence-transformers files written by the bench itself) is a folder `SparseEncoder(dir)` loads as SPLADE, cut at
the archives' max_length with max_active_dims 256, and our handler's answers to the bench's own long-tail texts
(some over max_length) have its non-zero ids and values within 1e-5, bucketed and dynamic."""

from __future__ import annotations

import json
import random

import pytest

from bench.inputs import models
from bench.inputs.workloads import make_workload, text_of
from model_store.archives import max_length
from tests.handler.test_handler import make_handler, serve

np = pytest.importorskip("numpy")
sentence_transformers = pytest.importorskip("sentence_transformers")

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def splade(tmp_path_factory):
    return models.minilm_splade_random(tmp_path_factory.mktemp("bench-models") / models.SPLADE)


@pytest.fixture(scope="module")
def texts():
    longer = [text_of(n, random.Random(n)) for n in (300, 2 * max_length())]  # cut at max_length, as ST cuts
    return [*make_workload("longtail", 10, seed=2).texts, *longer]


@pytest.fixture(scope="module")
def reference(splade, texts):
    model = sentence_transformers.SparseEncoder(str(splade), device="cpu")
    assert model.max_seq_length == max_length() and model.max_active_dims == models.SPLADE_MAX_ACTIVE_DIMS
    assert [type(m).__name__ for m in model] == ["Transformer", "SpladePooling"]
    return model.encode(texts, convert_to_tensor=True, batch_size=len(texts)).to_dense().numpy()


@pytest.mark.parametrize("strategy", ["bucketed", "dynamic"])
def test_our_answers_equal_sparse_encoder_on_the_generated_splade(splade, texts, reference, strategy):
    handler, context = make_handler(splade, task="sparse", engine="torch", strategy=strategy, max_length=max_length())
    rows = [{"body": {"texts": texts[:5]}}, {"body": {"texts": texts[5:]}}]
    answers = serve(handler, context, rows)
    assert [status for status, _ in answers] == [200, 200], answers
    got = [a["embedding"] for _, body in answers for a in body]
    for answer, row in zip(got, reference, strict=True):
        ids = np.flatnonzero(row)
        assert len(ids) == models.SPLADE_MAX_ACTIVE_DIMS  # random weights: every text has more active ids than that
        assert answer["indices"] == ids.tolist()
        assert np.max(np.abs(np.array(answer["values"]) - row[ids])) <= TOLERANCE


def test_the_generated_splade_is_laid_out_as_sparse_encoder_saves_it(splade, tmp_path):
    """Its transformer at the folder's root (modules.json path ""), as SparseEncoder.save writes a SPLADE."""
    sentence_transformers.SparseEncoder(str(splade), device="cpu").save(str(tmp_path / "saved"))
    paths = [
        [m["path"] for m in json.loads((folder / "modules.json").read_text())]
        for folder in (splade, tmp_path / "saved")
    ]
    assert paths[0] == paths[1] == ["", "1_SpladePooling"]
    assert (splade / "config.json").is_file() and (splade / "sentence_bert_config.json").is_file()


def test_a_build_of_the_older_layout_is_built_anew(tmp_path):
    """A cached build with the masked LM in 0_Transformer/ (no root config.json) is replaced, not kept or failed on."""
    target = tmp_path / models.SPLADE
    (target / "0_Transformer").mkdir(parents=True)
    (target / "modules.json").write_text("[]")
    assert models.minilm_splade_random(target) == target
    assert (target / "config.json").is_file() and not (target / "0_Transformer").exists()
    assert not target.with_name(target.name + ".partial").exists()
