"""The MLM head's cost and memory: calibration times the sparse head itself, and a pass holds at most
max_batch_tokens of logits at a time."""

from __future__ import annotations

import gc
import weakref
from typing import Any, cast

import pytest

from tests.handler.sparse.support import MAX_LENGTH
from tests.handler.test_handler import make_handler, serve_at

pytest.importorskip("sentence_transformers")


def test_calibration_times_the_sparse_head(folders, monkeypatch):
    """The cost model is fitted on passes through the MLM head and SPLADE pooling (the task's own forward)."""
    from bucketing.kinds.sparse.engines import SparseEngine

    shapes = []
    original = SparseEngine.__call__

    def timed(self, ids, mask, route):
        shapes.append(ids.shape)
        return original(self, ids, mask, route)

    monkeypatch.setattr(SparseEngine, "__call__", timed)
    make_handler(folders["splade-max"], task="sparse", max_length=MAX_LENGTH, cost={"calibrate": True})
    assert len(shapes) >= 3 * 4 and (4, 128) in shapes  # a warm-up and three timings of each shape that fits


def test_a_pass_holds_at_most_max_batch_tokens_of_logits(folders):
    """The MLM runs in row groups of at most max_batch_tokens tokens, whatever the strategy planned, and a group's
    logits are freed before the next group's are made."""
    import torch

    handler, context = make_handler(
        folders["splade-max"], task="sparse", strategy="dynamic", max_length=MAX_LENGTH, max_batch_tokens=128
    )
    seen: list[int] = []
    logits: list[Any] = []
    model = cast(Any, handler.task.engine).model
    original = model.forward

    def large() -> list[Any]:
        """Tensors the size of a row group's logits or more (weights of models other tests left alive too)."""
        return [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.numel() >= 64 * 30522]

    before = {id(o) for o in large()}  # what existed before the pass: not this pass's logits

    def counting(*args, **kwargs):
        ids = kwargs["input_ids"]
        seen.append(ids.shape[0] * ids.shape[1])
        assert all(ref() is None for ref in logits), "a row group's logits outlived it"
        held = [o for o in large() if id(o) not in before]
        assert not held, f"{len(held)} vocabulary-wide tensors of an earlier group are still held"
        out = original(*args, **kwargs)
        logits.append(weakref.ref(out[0]))
        return out

    model.forward = counting
    texts = ["word " * 40] * 9
    ((status, _),) = serve_at(handler, context, [{"texts": texts, "max_active_dims": 5}], [""])
    assert status == 200 and len(seen) > 1 and max(seen) <= 128


def test_a_batch_holds_no_vocabulary_size_row_after_its_pass(folders, monkeypatch):
    """Each pass's rows are made sparse before the next pass runs (a worker held every row's vocabulary-size output
    until the batch was answered: +273 MB for a 2,048-text request of short texts); the answers are those of the
    dense rows."""
    from bucketing.answers import SparseRow
    from bucketing.serving import pipeline

    handler, context = make_handler(
        folders["splade-max"], task="sparse", strategy="bucketed", max_length=MAX_LENGTH, max_batch_tokens=128
    )
    held: list[Any] = []
    compute = pipeline.compute  # type: ignore[attr-defined]  # what the serving loop calls, patched where it looks

    def kept(*args, **kwargs):
        out = compute(*args, **kwargs)
        held.extend(out.outputs)
        return out

    monkeypatch.setattr(pipeline, "compute", kept)
    texts = [f"short query number {i}" for i in range(40)]
    ((status, body),) = serve_at(handler, context, [{"texts": texts, "max_active_dims": 8}], [""])
    assert status == 200 and len(held) == len(texts) and all(isinstance(row, SparseRow) for row in held)
    # what its answer can render, not the vocabulary: a tiny random model's rows are dense until cut
    assert all(row.size == 30522 and row.indices is not None and 0 < row.active <= 8 for row in held)
    held.clear()
    ((status, whole),) = serve_at(handler, context, [{"texts": texts}], [""])  # no cut: kept whole, never larger
    assert status == 200 and all(row.values.nbytes + (row.indices.nbytes if row.indices is not None else 0)
                                 <= 30522 * 4 for row in held)  # fmt: skip
    monkeypatch.setattr(pipeline, "compute", compute)
    ((_, again),) = serve_at(handler, context, [{"texts": texts, "max_active_dims": 8}], [""])
    assert again == body
