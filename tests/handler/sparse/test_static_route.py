"""A Router's static query route (SparseStaticEmbedding): texts cut where its own tokenizer cuts them (past
max_length), planned as one token a row (also under `schedule: continuous`), refused in one line past what is read,
and TEI's /tokenize still cut at max_length beside it."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from tests.handler.sparse.support import LONG, MAX_LENGTH, mismatches, reference
from tests.handler.test_handler import make_handler, mixed_texts, serve_at

np = pytest.importorskip("numpy")
pytest.importorskip("sentence_transformers")


@pytest.mark.parametrize("strategy", ["bucketed", "dynamic", "static"])
@pytest.mark.parametrize("max_length", [64, MAX_LENGTH])
def test_a_static_route_cuts_texts_where_its_own_tokenizer_does(folders, strategy, max_length):
    """SparseStaticEmbedding cuts a text at its tokenizer's model_max_length of its own tokens (128 here: 2 more
    than max_length 128 leaves beside the special tokens, and past a max_length of 64, which cuts the document
    route alone): served exactly, in any batch, planned as one token a row (a row of 130 tokens fits a budget of
    128), each cut where its route is beside documents cut at max_length."""
    folder = folders["router"]
    handler, context = make_handler(
        folder, task="sparse", strategy=strategy, max_length=max_length, max_batch_tokens=MAX_LENGTH
    )
    queries = [LONG, "word " * 300, *mixed_texts(5, seed=11)]
    short = [" ".join(t.split()[:10]) for t in mixed_texts(4, seed=12)]
    rows = [{"texts": queries, "input_type": "query"}, {"texts": short}, {"texts": [LONG], "input_type": "query"}]
    answers = serve_at(handler, context, rows, ["", "", ""])
    assert [s for s, _ in answers] == [200, 200, 200], answers
    got = [a["embedding"] for a in answers[0][1] + answers[2][1]]
    assert mismatches(got, reference(folder, [*queries, LONG], "query")) == 0
    assert mismatches([a["embedding"] for a in answers[1][1]], reference(folder, short)) == 0
    assert answers[0][1][0]["tokens"] == 130 and answers[0][1][0]["truncated"]
    assert "static route 'query' cut at its tokenizer's model_max_length (128)" in cast(Any, handler.task).ready_note
    cut_at_max_length = reference(folder, [" ".join(LONG.split()[:124])], "query")
    assert np.count_nonzero(reference(folder, [LONG], "query")) > np.count_nonzero(cut_at_max_length)  # not by chance


def test_a_static_route_text_past_what_is_read_is_refused_in_one_line(folders, monkeypatch):
    """A static route's text is read up to STATIC_REACH of its tokens: one that sentence-transformers cuts further
    (or not at all) is a 413 past it, in one line; its other texts are served."""
    from bucketing.kinds.sparse import task as sparse

    monkeypatch.setattr(sparse, "STATIC_REACH", 16)
    handler, context = make_handler(folders["router"], task="sparse", max_length=MAX_LENGTH)
    rows = [{"texts": ["word " * 20], "input_type": "query"}, {"texts": ["word " * 14], "input_type": "query"}]
    (s1, refused), (s2, served) = serve_at(handler, context, rows, ["", ""])
    assert (s1, s2) == (413, 200)
    assert "static route 'query'" in refused["message"] and "16 tokens" in refused["message"]
    assert "\n" not in json.dumps(refused)
    assert mismatches([served[0]["embedding"]], reference(folders["router"], ["word " * 14], "query")) == 0


def test_continuous_batching_plans_static_route_rows_as_one_token(folders, monkeypatch):
    """Under `schedule: continuous` too, a static route's rows (130 tokens here) are planned (scheduled and costed)
    as one token: they fit a budget of 128 beside documents cut at max_length, each answered as encode_query /
    encode_document answers it."""
    from bucketing.planning import scheduler
    from tests.handler.test_continuous import continuous
    from tsctl.inprocess import ContinuousFrontend

    seen: dict[str, tuple[int, ...]] = {}
    pick = scheduler.pick

    def recording(pool, *args, **kwargs):
        seen.update({p.key: p.lengths for p in pool})
        return pick(pool, *args, **kwargs)

    monkeypatch.setattr(scheduler, "pick", recording)
    folder = folders["router"]
    handler, context = continuous(folder, task="sparse", max_length=MAX_LENGTH, max_batch_tokens=MAX_LENGTH)
    front = ContinuousFrontend(handler, context, batch_size=4)
    queries, documents = [LONG, "word " * 300, "short"], ["x", " ".join(["word"] * 20)]
    front.submit("q", {"body": {"texts": queries, "input_type": "query"}})
    front.submit("d", {"body": {"texts": documents, "input_type": "document"}})
    answers = front.drain()
    assert answers["q"][0] == answers["d"][0] == 200, answers
    got = {key: [a["embedding"] for a in json.loads(answers[key][1])] for key in ("q", "d")}
    assert mismatches(got["q"], reference(folder, queries, "query")) == 0
    assert mismatches(got["d"], reference(folder, documents, "document")) == 0
    assert seen["q"] == (1, 1, 1) and seen["d"] == (5, 24)  # a document: its prompt, text and special tokens


def test_tei_tokenize_cuts_at_max_length_beside_a_static_route(folders):
    """TEI's /tokenize shows the tokens cut at handler.max_length (tei_tokenize's docstring), also for a Router
    whose static route reads texts further (`task.reach`)."""
    handler, context = make_handler(folders["router"], task="sparse", max_length=64)
    ((status, (tokens,)),) = serve_at(handler, context, [{"inputs": "word " * 300}], ["tokenize"])
    assert status == 200
    assert len(tokens) == 64
