"""The tokenizer: a long text cut before tokenizing gives exactly the whole text's tokens; ids and empty texts."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bucketing.tokenizer import Encoded, Tokenizer
from tests.models import TOKENIZER_WORDS, build_tokenizer

WORDS = TOKENIZER_WORDS[:18]


@pytest.fixture(scope="module", params=["wordpiece", "bpe", "unigram"])
def tokenizer(request, minilm_dir, tmp_path_factory) -> Tokenizer:
    folder = minilm_dir if request.param == "wordpiece" else build_tokenizer(tmp_path_factory.mktemp("tok"),
                                                                            request.param)  # fmt: skip
    tok = Tokenizer(str(folder), max_length=8)
    tok.cut_chars = 24  # cut early and often, so the property is tried on short texts too
    return tok


def whole(tok: Tokenizer, text: str) -> Encoded:
    """The reference: the tokenizer on the whole text, no cut."""
    e = tok._backend.encode(text)
    return Encoded(tuple(e.ids), bool(e.overflowing))


texts = st.lists(st.sampled_from(WORDS + [" ", "  ", " \n "]), min_size=1, max_size=300).map(" ".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(texts, min_size=1, max_size=4))
def test_cut_tokenizing_matches_the_whole_text(tokenizer, batch):
    assert tokenizer.encode(batch) == [whole(tokenizer, t) for t in batch]


def test_long_texts_cut_and_degenerate_ones(tokenizer):
    batch = ["word " * 5000, "a" * 3000, " " * 3000 + "end", "\u200b" * 100, "short"]
    assert tokenizer.encode(batch) == [whole(tokenizer, t) for t in batch]


def test_token_ids_are_wrapped_and_truncated(tokenizer):
    ids = tokenizer._backend.encode("serving a transformer", add_special_tokens=False).ids
    assert tokenizer.wrap(ids) == whole(tokenizer, "serving a transformer")
    long = tokenizer.wrap(list(range(5, 40)))
    assert len(long.ids) == 8 and long.truncated and long.ids[: len(tokenizer.prefix)] == tokenizer.prefix


def test_invisible_texts_are_empty(minilm_dir):
    tok = Tokenizer(str(minilm_dir), max_length=16)
    empty, real = tok.encode(["\u200b\u200b\x00 \ufeff", "hello"])
    assert tok.empty(empty) and not tok.empty(real)
