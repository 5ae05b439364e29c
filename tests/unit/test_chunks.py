"""`on_overflow: chunk`: where windows lie (`chunks.Windows`), how their vectors pool (`chunks.pool`), and how a
request says it (`on_overflow`, beside `truncate`) in each wire format."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bucketing.answers import Options
from bucketing.chunks import Windows, pool, sentences, span_tokens
from bucketing.protocols.base import Limits, RequestError
from bucketing.protocols.options import chunked, read_options

LIMITS = Limits(8, 16, 1000, "embedding", 4)


@pytest.mark.parametrize(
    ("length", "tokens", "overlap", "spans"),
    [
        (0, 4, 0, [(0, 0)]),
        (4, 4, 0, [(0, 4)]),
        (5, 4, 0, [(0, 4), (4, 5)]),
        (10, 4, 1, [(0, 4), (3, 7), (6, 10)]),
        (11, 4, 1, [(0, 4), (3, 7), (6, 10), (9, 11)]),
    ],
)
def test_spans(length, tokens, overlap, spans):
    assert Windows(tokens, overlap, 99).spans(length) == spans


@given(st.integers(0, 500), st.integers(1, 40), st.data())
def test_windows_cover_the_text_in_order_each_within_its_size(length, tokens, data):
    overlap = data.draw(st.integers(0, tokens - 1))
    windows = Windows(tokens, overlap, 10**6)
    spans = windows.spans(length)
    assert spans[0][0] == 0 and spans[-1][1] == length
    assert all(0 < b - a <= tokens for a, b in spans) or length == 0
    assert all(b1 - a2 == overlap for (_, b1), (a2, _) in zip(spans, spans[1:]))  # each repeats `overlap`
    assert all(a2 + tokens >= length or b2 == a2 + tokens for a2, b2 in spans)  # only the last is short
    most = len(spans)
    assert length <= Windows(tokens, overlap, most).reach  # the reach of that many windows holds it
    assert most == 1 or length > Windows(tokens, overlap, most - 1).reach  # and one window fewer does not


def test_a_window_no_longer_than_its_overlap_is_refused():
    with pytest.raises(ValueError, match="cannot overlap"):
        Windows(3, 3, 4).spans(10)


def test_pool_weights_windows_by_their_tokens():
    got = pool([np.array([1.0, 0.0], np.float32), np.array([0.0, 1.0], np.float32)], [3, 1])
    assert got.dtype == np.float32 and got.tolist() == [0.75, 0.25]


@pytest.mark.parametrize(
    ("body", "truncate", "chunk"),
    [
        ({}, None, False),
        ({"truncate": True}, True, False),
        ({"on_overflow": "truncate"}, True, False),
        ({"on_overflow": "reject"}, False, False),
        ({"on_overflow": "chunk"}, None, True),
    ],
)
def test_on_overflow_reads_as_truncate_or_chunk(body, truncate, chunk):
    options = read_options(body, LIMITS)
    assert (options.truncate, options.chunk) == (truncate, chunk)


@pytest.mark.parametrize(
    ("body", "limits", "message"),
    [
        ({"on_overflow": "chunk", "truncate": False}, LIMITS, 'send "on_overflow" or "truncate", not both'),
        ({"on_overflow": True}, LIMITS, "\"on_overflow\" must be one of 'truncate', 'reject', 'chunk', got"),
        (
            {"on_overflow": "chunk"},
            Limits(
                8, 16, 1000, "classification", 2, chunking="is for embedding models; this is a classification model"
            ),
            '"on_overflow" "chunk" is for embedding models; this is a classification model',
        ),
    ],
)
def test_on_overflow_mistakes_are_400s(body, limits, message):
    with pytest.raises(RequestError) as e:
        read_options(body, limits)
    assert e.value.status == 400 and message in e.value.message and e.value.param == "on_overflow"


@pytest.mark.parametrize(
    ("options", "setting", "expected"),
    [
        (Options(), "truncate", False),
        (Options(), "chunk", True),
        (Options(truncate=True), "chunk", False),  # the request's own word wins
        (Options(chunk=True), "reject", True),
    ],
)
def test_chunked_as_the_request_says_else_as_the_handler(options, setting, expected):
    assert chunked(options, Limits(8, 16, 1000, on_overflow=setting)) is expected


@pytest.mark.parametrize(
    ("text", "spans"),
    [
        ("One. Two!", [(0, 4), (5, 9)]),
        ("  Padded.  Next one?  ", [(2, 9), (11, 20)]),
        ("Version 1.5 is out. Yes", [(0, 19), (20, 23)]),  # a dot inside a number ends nothing
        ("line one\nline two", [(0, 8), (9, 17)]),
        ("第一句。第二句！", [(0, 4), (4, 8)]),
        ("   ", []),
    ],
)
def test_sentences(text, spans):
    assert sentences(text) == spans


@given(st.text(alphabet="ab .!?\n", max_size=60))
def test_sentences_are_ordered_trimmed_and_inside_the_text(text):
    spans = sentences(text)
    assert all(0 <= a < b <= len(text) for a, b in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))
    assert all(not text[a].isspace() and not text[b - 1].isspace() for a, b in spans)


def test_span_tokens_hold_the_tokens_inside_each_span_and_no_special_or_prompt_token():
    # "q: " prompt (3 chars), then "ab cd": [CLS] q : ab cd [SEP]
    offsets = [(0, 0), (0, 1), (1, 2), (3, 5), (6, 8), (0, 0)]
    special = [True, False, False, False, False, True]
    assert span_tokens(offsets, special, 3, [(0, 2), (0, 5), (1, 5), (2, 3)]) == ((3,), (3, 4), (4,), ())


def test_a_token_belongs_to_a_span_by_its_text_without_the_space_before_it():
    """Byte-level BPE offsets keep a word's leading space (`Ġserv` at 15-20 of "long documents. serving ..."): trimmed
    (`model.tokenizer.trimmed`), the word lies in its sentence; a token of white space alone lies in no span."""
    from bucketing.model.tokenizer import trimmed

    text = "long documents. serving"
    offsets = [(0, 0), (0, 4), (4, 14), (14, 15), trimmed(text, 15, 20), trimmed(text, 20, 23), (0, 0)]
    assert offsets[4] == (16, 20) and trimmed(" \n", 0, 2) == (2, 2)
    special = [True, False, False, False, False, False, True]
    assert span_tokens(offsets, special, 0, [(0, 15), (16, 23), (16, 20)]) == ((1, 2, 3), (4, 5), (4,))
    assert span_tokens([(0, 0), (3, 3), (0, 3)], [True, False, False], 0, [(0, 3)]) == ((2,),)


def test_late_chunking_with_a_left_cut_is_a_400():
    with pytest.raises(RequestError, match='truncation_direction "left" is not served with late chunking'):
        read_options({"chunking": "late", "spans": "sentences", "truncation_direction": "left"}, LIMITS)
