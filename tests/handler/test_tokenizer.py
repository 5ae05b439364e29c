"""The tokenizer: a long text cut before tokenizing gives exactly the whole text's tokens; ids and empty texts."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bucketing.model.encoded import Encoded
from bucketing.model.tokenizer import ENCODE_SLICE, Tokenizer
from tests.models import TOKENIZER_WORDS, build_tokenizer

WORDS = TOKENIZER_WORDS[:18]


@pytest.fixture(scope="module", params=["wordpiece", "bpe", "unigram", "llama3"])
def tokenizer(request, minilm_dir, tmp_path_factory) -> Tokenizer:
    folder = (
        minilm_dir if request.param == "wordpiece" else build_tokenizer(tmp_path_factory.mktemp("tok"), request.param)
    )
    tok = Tokenizer(str(folder), max_length=8)
    tok.cut_chars = 24  # cut early and often, so the property is tried on short texts too
    return tok


def whole(tok: Tokenizer, text: str, left: bool = False) -> Encoded:
    """The reference: the tokenizer on the whole text, no cut (`left`: truncated from the left)."""
    if left:
        tok._backend.enable_truncation(tok.max_length, direction="left")
    try:
        e = tok._backend.encode(text)
    finally:
        tok._backend.enable_truncation(tok.max_length)
    return Encoded(tuple(e.ids), bool(e.overflowing))


# Words joined by any white space or none (CJK, tabs, NBSP, one word a line, punctuation runs): the cut lands
# anywhere, not only at an ASCII space.
GLUE = [" ", "  ", " \n ", "\n", "\t", "\u00a0", "\u3000", "", ",", "。"]
PIECES = WORDS + ["中文", "句子", "很长", "é", "e\u0301", "...", "http://x.y/z?a=b"]
texts = st.lists(st.tuples(st.sampled_from(PIECES), st.sampled_from(GLUE)), min_size=1, max_size=300).map(
    lambda parts: "".join(w + g for w, g in parts)
)


def exact_or_refused(tok: Tokenizer, text: str, e: Encoded, left: bool = False) -> bool:
    """The whole text's tokens, or (only for a text over max_cut_chars) unbounded."""
    return e == whole(tok, text, left) or (e.unbounded and len(text) > tok.max_cut_chars)


# Found by hypothesis: 100 characters (over max_cut_chars, 96) whose third "word" for the Unigram's Metaspace (it does
# not split at a newline) runs from character 15 to 99, across the cut; its first tokens may depend on the cut-off
# end, so it is refused (413), not answered from a guess.
UNIGRAM_LONG_WORD = "serving serving serving\nserving\nserving\n" + "https://example.org/a?b=c\n" * 2 + "serving "


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(texts, min_size=1, max_size=4))
@example(batch=[UNIGRAM_LONG_WORD])
@example(batch=["account " + "1234567" * 9 + " end"])  # Llama-3 digits: a suffix groups the run otherwise
def test_cut_tokenizing_matches_the_whole_text(tokenizer, batch):
    """Exact, or refused (a text over max_cut_chars whose prefix or suffix settles nothing): never another answer."""
    for left in (False, True):
        assert all(exact_or_refused(tokenizer, t, e, left) for t, e in zip(batch, tokenizer.encode(batch, left)))


LONG = ["word " * 5000, "word\n" * 5000, "word\t" * 5000, "word\u00a0" * 5000, "中文的句子很长，没有空格。" * 1000]


def test_long_texts_cut_and_degenerate_ones(tokenizer):
    batch = [
        *LONG,
        "\u200b" * 90,
        "short",
        "a" * (tokenizer.max_cut_chars - 1),
        " " * 80 + "end",
        "a" * (tokenizer.max_cut_chars + 1),
        " " * tokenizer.max_cut_chars + "end",
    ]
    encoded = tokenizer.encode(batch)
    assert all(exact_or_refused(tokenizer, t, e) for t, e in zip(batch, encoded))
    from_left = tokenizer.encode(batch, left=True)
    assert all(exact_or_refused(tokenizer, t, e, left=True) for t, e in zip(batch, from_left))
    assert not encoded[0].unbounded and encoded[-2].unbounded  # prose with spaces; one 97-character "word"


def test_the_shipped_tokenizer_settles_every_long_prose_from_a_prefix(minilm_dir):
    """MiniLM's WordPiece splits at any white space, punctuation and each CJK character: each long text of
    the issue (one word a line, tabs, NBSP, Chinese prose) is settled from its first prefix, exactly."""
    tok = Tokenizer(str(minilm_dir), max_length=256)
    encoded = tok.encode(LONG)
    assert encoded == [whole(tok, t) for t in LONG] and all(e.truncated for e in encoded)
    one_word = tok.encode(["a" * (tok.max_cut_chars + 1)])[0]
    assert one_word.unbounded


def test_a_left_cut_through_digits_grouped_from_the_left_is_exact_or_refused(tmp_path):
    """Llama-3's regex groups a run of digits by three from the run's left: a suffix cut inside the run groups it
    otherwise (58 of 64 tokens differed), so a left cut is kept only where suffixes from three starts agree."""
    tok = Tokenizer(str(build_tokenizer(tmp_path, "llama3")), max_length=64)
    digits, prose = "account " + "1234567" * 2000 + " end", "account 1234567 and 89 end. " * 600
    (run, served), (right, _) = tok.encode([digits, prose], left=True), tok.encode([digits, prose])
    assert tok.left_shifts == 3 and run.unbounded and len(digits) > tok.max_cut_chars  # a 413, never a guess
    assert served == whole(tok, prose, left=True) and served.truncated and not served.unbounded
    assert right == whole(tok, digits) and not right.unbounded  # a prefix groups the run as the whole text does


def test_token_ids_are_wrapped_and_truncated(tokenizer):
    ids = tokenizer._backend.encode("serving a transformer", add_special_tokens=False).ids
    assert tokenizer.wrap(ids) == whole(tokenizer, "serving a transformer")
    long = tokenizer.wrap(list(range(5, 40)))
    assert len(long.ids) == 8 and long.truncated and long.ids[: len(tokenizer.prefix)] == tokenizer.prefix
    tail = tokenizer.wrap(list(range(5, 40)), left=True)
    assert tail.ids == tokenizer.prefix + tuple(range(40 - 8 + tokenizer.specials, 40)) + tokenizer.suffix


def test_invisible_texts_are_empty(minilm_dir):
    tok = Tokenizer(str(minilm_dir), max_length=16)
    empty, real = tok.encode(["\u200b\u200b\x00 \ufeff", "hello"])
    assert tok.empty(empty) and not tok.empty(real)


def whole_pair(tok: Tokenizer, a: str, b: str) -> Encoded:
    """The reference: the tokenizer on the whole pair, truncated longest_first at max_length (CrossEncoder's)."""
    e = tok._backend.encode(a, b)  # token types as the model gets them: where its tokenizer gives them
    return Encoded(tuple(e.ids), bool(e.overflowing), type_ids=tuple(e.type_ids) if tok.token_types else None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(texts, texts), min_size=1, max_size=3))
def test_pairs_are_tokenized_as_the_whole_pair(tokenizer, pairs):
    for (a, b), e in zip(pairs, tokenizer.encode_pairs(pairs)):  # both sides long and one past the cut: refused
        assert e == whole_pair(tokenizer, a, b) or (e.unbounded and max(len(a), len(b)) > tokenizer.max_cut_chars)


@pytest.mark.parametrize("max_length", [7, 8, 9, 12])  # odd and even budgets: which side gets the odd token
def test_long_pairs_split_the_budget_as_the_tokenizer_does(minilm_dir, max_length):
    tok = Tokenizer(str(minilm_dir), max_length)
    pairs = [
        ("word " * 50, "short"),
        ("short", "word " * 50),
        ("word " * 40, "serving " * 41),
        ("serving " * 41, "word " * 40),
        ("a b", "c d"),
        ("word " * 20, "serving " * 20),
    ]
    assert tok.encode_pairs(pairs) == [whole_pair(tok, a, b) for a, b in pairs]
    # A side past max_cut_chars is read from a prefix: the shorter side's count and which is longer settle the split.
    long_query = ("word " * 320, "serving " * 20)  # 1600 characters, past max_cut_chars (at most 1536 here)
    assert tok.encode_pairs([long_query, long_query[::-1]]) == [
        whole_pair(tok, a, b) for a, b in (long_query, long_query[::-1])
    ]
    # Both sides long, past max_cut_chars: halves; an odd budget's extra token goes to the longer, which is unknown.
    (huge,) = tok.encode_pairs([("word " * 3000, "serving " * 3000)])
    budget = max_length - 3  # [CLS] a [SEP] b [SEP]
    same_halves = whole_pair(tok, "word " * 20, "serving " * 20)  # (the whole pair's reference is quadratic here)
    assert huge == same_halves if budget % 2 == 0 else huge.unbounded


class CountingBackend:
    """A tokenizer backend that records the length of every text it is given."""

    def __init__(self, backend):
        self.backend, self.read, self.batches = backend, [], []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def encode(self, text, *args, **kwargs):
        self.read.append(len(text))
        return self.backend.encode(text, *args, **kwargs)

    def encode_batch(self, texts, *args, **kwargs):
        self.read.extend(len(t) for t in texts)
        self.batches.append(len(texts))
        return self.backend.encode_batch(texts, *args, **kwargs)


def test_a_rerank_query_is_read_once_from_a_bounded_prefix_for_all_its_documents(minilm_dir):
    """A long query with 20 long documents (a TEI rerank body): the query was re-read whole for every document."""
    tok = Tokenizer(str(minilm_dir), max_length=16)
    query, docs = "a query word " * 100, [f"document {i} " * 100 for i in range(20)]
    counting = tok._backend = CountingBackend(tok._backend)
    encoded = tok.encode_pairs([(query, d) for d in docs])
    tok._backend = counting.backend
    assert encoded == [whole_pair(tok, query, d) for d in docs]
    # Each text's prefix, then (the sides near in length, the budget odd: which is longer decides) each whole.
    assert counting.read.count(tok.cut_chars) == 21 and counting.read.count(len(query)) == 1
    assert len(counting.read) == 42 and max(counting.read) <= tok.max_cut_chars


def test_a_large_request_is_tokenized_a_slice_of_texts_at_a_time(minilm_dir):
    """The tokenizer's own objects (each token's string, offsets, overflow) for 2,048 texts held 0.1 MB a text at
    once; a request's texts now go to it `ENCODE_SLICE` at a time, each slice reduced to ids, with the same tokens."""
    tok = Tokenizer(str(minilm_dir), max_length=16)
    texts = [f"text {i} " * (1 + i % 40) for i in range(3 * ENCODE_SLICE + 5)]
    pairs = [(f"query {i}", t) for i, t in enumerate(texts)]
    counting = tok._backend = CountingBackend(tok._backend)
    encoded, paired = tok.encode(texts), tok.encode_pairs(pairs)
    tok._backend = counting.backend
    assert encoded == [whole(tok, t) for t in texts]
    assert paired == [whole_pair(tok, q, d) for q, d in pairs]
    assert max(counting.batches) == ENCODE_SLICE and len(counting.batches) >= 2 * 4


def with_normalizer_bomb(folder, n):
    """The folder's tokenizer.json with n x Replace("l", "ll") after its own normalizer (2**n characters an "l")."""
    import json

    path = folder / "tokenizer.json"
    spec = json.loads(path.read_text())
    own = spec["normalizer"]
    replaces = [{"type": "Replace", "pattern": {"String": "l"}, "content": "ll"}] * n
    spec["normalizer"] = {"type": "Sequence", "normalizers": [own, *replaces]}
    path.write_text(json.dumps(spec))
    return folder


def test_a_normalizer_that_multiplies_text_is_refused_at_build_and_at_start(tmp_path):
    """A 1.4 KB tokenizer.json normalizer made every text cost 2**N times its characters after the bounded cut."""
    from model_store import archives
    from tests.models import build_tiny_bert

    folder = with_normalizer_bomb(build_tiny_bert(tmp_path / "bomb", classifier=True), 16)
    with pytest.raises(ValueError, match="normalizer may make 1.57e[+]06 characters of one") as start:
        Tokenizer(str(folder), 8)
    with pytest.raises(archives.ModelFolderError, match="no usable fast tokenizer: .* normalizer may make") as build:
        archives.check_model_dir(folder, "classification")
    assert "\n" not in str(start.value) and "\n" not in str(build.value)
    mild = with_normalizer_bomb(build_tiny_bert(tmp_path / "mild", classifier=True), 2)  # BERT's 24x, then 4x: 96x
    assert Tokenizer(str(mild), 8).encode(["hello"])[0].ids
