"""CSR (a SparseAutoEncoder over a dense chain) alone: answers equal `SparseEncoder.encode()`'s on both
engines in every strategy, a request's max_active_dims as encode's top-k."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tests.handler.sparse.support import CSR_VARIANTS, ENGINES, MAX_LENGTH, mismatches, model_dir, reference
from tests.handler.test_handler import make_handler, mixed_texts, serve_at

pytest.importorskip("sentence_transformers")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("strategy", ["bucketed", "dynamic", "static"])
@pytest.mark.parametrize("input_type", [None, "query"])
@pytest.mark.parametrize("variant", list(CSR_VARIANTS))
def test_csr_answers_equal_sparse_encoder(csr_folders, archives, variant, input_type, strategy, engine):
    """CSR: the dense chain's pooled embedding, then the SparseAutoEncoder's top-k, as encode() answers it."""
    handler, context = make_handler(
        model_dir(csr_folders, archives, variant, engine),
        task="sparse",
        strategy=strategy,
        engine=engine,
        max_length=MAX_LENGTH,
    )
    texts = mixed_texts(9, seed=6) + ["short", "x"]
    options = {"input_type": input_type} if input_type else {}
    rows = [{"texts": texts[:4], **options}, {"texts": texts[4:], **options}, {"text": texts[2], **options}]
    answers = serve_at(handler, context, rows, ["", "", ""])
    assert [s for s, _ in answers] == [200, 200, 200], answers
    got = [e["embedding"] for e in answers[0][1] + answers[1][1]] + [answers[2][1]["embedding"]]
    expected = reference(csr_folders[variant], texts + [texts[2]], input_type)
    assert mismatches(got, expected) == 0
    k = CSR_VARIANTS[variant].get("max_active_dims", CSR_VARIANTS[variant].get("k", 8))
    assert all(0 < len(a["indices"]) <= k for a in got)


@pytest.mark.parametrize("max_active_dims", [3, 20])
def test_csr_request_max_active_dims_is_encode_top_k(csr_folders, max_active_dims):
    """A request's max_active_dims is the autoencoder's top-k, as encode(max_active_dims=...) runs it (over the
    folder's k as well as under it)."""
    handler, context = make_handler(csr_folders["csr-dense-normalized"], task="sparse", max_length=MAX_LENGTH)
    texts = mixed_texts(7, seed=9)
    ((status, body),) = serve_at(handler, context, [{"texts": texts, "max_active_dims": max_active_dims}], [""])
    assert status == 200
    got = [a["embedding"] for a in body]
    expected = reference(csr_folders["csr-dense-normalized"], texts, max_active_dims=max_active_dims)
    assert mismatches(got, expected) == 0
    assert max(len(a["indices"]) for a in got) > 12 if max_active_dims == 20 else True
    task = cast(Any, handler.task)
    assert f"CSR: no vocabulary logits; a pass holds rows x {task.dimensions} latents" in task.ready_note
