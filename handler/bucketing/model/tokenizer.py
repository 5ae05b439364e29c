"""Tokenization without padding (each text once, exactly as the whole text tokenizes), and collation of a pass."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bucketing.model.encoded import Encoded
from bucketing.model.normalizers import EXPANSION, check_normalizer, lowercase_first


class Tokenizer:
    """A fast tokenizer used once per delivered batch, truncating at max_length and never padding.

    A fast tokenizer reads a whole text before truncating, so its cost grows with the body, not with max_length
    (6 MB of prose took 11 s). Each long text is therefore tokenized from a prefix of `cut_chars` characters, and
    the result is kept only when the prefix alone overflowed max_length and held at least one whole pre-token (a
    "word" as the tokenizer's own pre-tokenizer splits it: white space and punctuation for WordPiece, each CJK
    character for BERT, the byte-level regex for BPE, the metaspace for Unigram) between the last kept token's
    word and the last word of the prefix, which the cut may have damaged. Every tokenizer model tokenizes each
    pre-token alone, so the kept tokens are then the tokens the whole text gives. Otherwise the prefix grows once
    (4x, `max_cut_chars`); a text longer than that whose prefix still settles nothing (one "word" of 32k
    characters, say) is marked `unbounded` and refused, so no text costs more than reading `max_cut_chars`.
    """

    def __init__(self, model_dir: str, max_length: int, lower_case: bool = False) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from transformers import AutoTokenizer

        check_normalizer(model_dir, EXPANSION["Lowercase"] if lower_case else 1)
        hf = AutoTokenizer.from_pretrained(model_dir)
        if not getattr(hf, "is_fast", False):
            raise ValueError(f"{model_dir}: a fast tokenizer (tokenizer.json) is required")
        if len(hf) <= len(set(hf.all_special_ids)) + 1:  # transformers builds an empty one when files are missing
            raise ValueError(f"{model_dir}: the tokenizer has no vocabulary (tokenizer.json, or vocab.txt/merges.txt)")
        self.pad_id = int(hf.pad_token_id if hf.pad_token_id is not None else 0)
        limit = int(getattr(hf, "model_max_length", 0) or 0)
        self.model_max_length = limit if 0 < limit < 10**6 else None  # what the tokenizer says the model takes
        self.max_length = max_length
        # Token types reach the model only where its tokenizer gives them (BERT's do; RoBERTa's do not).
        self.token_types = "token_type_ids" in getattr(hf, "model_input_names", ())
        self._backend = hf.backend_tokenizer
        if lower_case:
            lowercase_first(self._backend)
        self._backend.no_padding()
        self._backend.no_truncation()
        self.prefix, self.suffix = self._special_tokens()
        self.pair = self._pair_template()
        self.left_shifts = self._left_shifts()
        self._backend.enable_truncation(max_length)
        self.vocab_size = int(self._backend.get_vocab_size(with_added_tokens=True))
        self.cut_chars = CUT_CHARS_PER_TOKEN * max_length
        self._prompt_lengths: dict[str, int] = {}
        self.special_ids = frozenset(int(i) for i in hf.all_special_ids)
        self.unk_id: int | None = int(hf.unk_token_id) if hf.unk_token_id is not None else None

    @property
    def max_cut_chars(self) -> int:
        """The most characters of one text ever tokenized: the longest prefix tried."""
        return self.cut_chars * GROWTH

    def _special_tokens(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ids the tokenizer puts before and after a text's own tokens (e.g. [CLS] and [SEP])."""
        bare = self._backend.encode(PROBE, add_special_tokens=False).ids
        full = self._backend.encode(PROBE).ids
        for start in range(len(full) - len(bare) + 1):
            if full[start : start + len(bare)] == bare:
                return tuple(full[:start]), tuple(full[start + len(bare) :])
        raise ValueError("cannot locate a text's tokens among the special tokens the tokenizer adds")

    def _left_shifts(self) -> int:
        """From how many consecutive starts a left cut's suffix must give the same tokens: 1 where a suffix's words
        after its first are the whole text's; else, over runs where they are not (Llama-3's regex groups digits by
        three from the left of their run; a normalizer may pair spaces), the most starts until one where the suffix
        tokenizes as the whole text's end (3 for Llama-3's digits)."""
        shifts = 1
        for probe in LEFT_PROBES:
            whole = self._backend.encode(probe, add_special_tokens=False)
            tokens = list(zip(whole.ids, whole.offsets))
            tails = [self._backend.encode(probe[k:], add_special_tokens=False) for k in range(len(probe))]
            shifted = [[(i, (a + k, b + k)) for i, (a, b) in zip(t.ids, t.offsets)] for k, t in enumerate(tails)]
            words = [[w != t.word_ids[0] for w in t.word_ids] for t in tails]
            after = [[x for x, later in zip(s, w) if later] for s, w in zip(shifted, words)]
            if all(not a or a == tokens[len(tokens) - len(a) :] for a in after):
                continue
            aligned = [bool(s) and s == tokens[len(tokens) - len(s) :] for s in shifted]
            for k in range(1, len(probe)):
                shifts = max(shifts, next((j for j in range(k, len(probe)) if aligned[j]), len(probe)) - k + 1)
        return shifts

    def _pair_template(self) -> PairTemplate | None:
        """Where the tokenizer puts its special tokens and token types around a pair's two texts (None: it has no
        pair template)."""
        a, b = (self._backend.encode(t, add_special_tokens=False).ids for t in PAIR_PROBE)
        full = self._backend.encode(*PAIR_PROBE)
        ids, types = full.ids, full.type_ids
        for i in range(len(ids)):
            if ids[i : i + len(a)] != a:
                continue
            for j in range(i + len(a), len(ids)):
                if ids[j : j + len(b)] == b:
                    cut = (i, i + len(a), j, j + len(b))
                    segments = [(0, cut[0]), cut[:2], (cut[1], cut[2]), cut[2:], (cut[3], len(ids))]
                    before, between, after = (tuple(ids[x:y]) for x, y in segments[::2])
                    kinds = [tuple(types[x:y]) for x, y in segments]
                    return PairTemplate(before, between, after, kinds, types[i], types[j])
        return None

    def encode_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[Encoded]:
        """Each pair's tokens as the tokenizer gives them for the whole pair truncated `longest_first` at
        max_length (what CrossEncoder does). Each distinct text (a rerank request's query: once for all its
        documents) is read from a bounded prefix (`_read_sides`): its first tokens and its token count, or a lower
        bound of it; the split depends on the counts only through the shorter side's and which is longer, so a
        bound mostly settles it (`_settle`). Else the prefix grows once, to `max_cut_chars`; a pair that still is
        not settled (both sides that long, of an odd budget; or a side of one huge "word") is `unbounded`."""
        if self.pair is None:
            raise ValueError("this tokenizer has no pair template (post-processor): it cannot encode text pairs")
        budget = self.max_length - self.pair.specials
        known: dict[tuple[str, int], _Side] = {}
        out: list[Encoded] = [Encoded((), True, unbounded=True)] * len(pairs)
        pending = list(range(len(pairs)))
        for chars in (self.cut_chars, self.max_cut_chars):
            self._read_sides([t for k in pending for t in pairs[k]], chars, known)
            retry = []
            for k in pending:
                a, b = (known[t, min(len(t), chars)] for t in pairs[k])
                counts = _settle(a, b, budget)
                keep = longest_first(*counts, budget) if counts else (budget + 1, 0)
                if counts is None or keep[0] > len(a.ids) or keep[1] > len(b.ids):
                    retry.append(k)
                    continue
                joined = self.pair.join(a.ids, b.ids, *counts, self.max_length)
                out[k] = joined if self.token_types else replace(joined, type_ids=None)
            pending = retry
        return out

    def _read_sides(self, texts: Sequence[str], chars: int, known: dict[tuple[str, int], _Side]) -> None:
        """Each text not yet in `known` read from its first `chars` characters, untruncated, without special
        tokens: all its tokens (the whole text fit), or those before the prefix's last two words, which a cut may
        damage (the whole text's, as in `_settled`), and a count one above them."""
        keys = list(dict.fromkeys((t, min(len(t), chars)) for t in texts if (t, min(len(t), chars)) not in known))
        if not keys:
            return
        self._backend.no_truncation()
        try:
            for (text, n), e in zip(keys, _slices(self._backend, [t[:n] for t, n in keys], add_special_tokens=False)):
                if n == len(text):
                    known[text, n] = _Side(tuple(e.ids), len(e.ids), True)
                    continue
                last = max((w for w in e.word_ids if w is not None), default=-1)
                valid = next((k for k, w in enumerate(e.word_ids) if w is None or w > last - 2), len(e.ids))
                known[text, n] = _Side(tuple(e.ids[:valid]), valid + 1, False)
        finally:
            self._backend.enable_truncation(self.max_length)

    def read_whole(self, texts: Sequence[str], most: int) -> list[tuple[int, ...] | None]:
        """Each text's own tokens (no special tokens) as the whole text gives them: all of them when it has at
        most `most`, else its first `most + 1` (one over: the caller refuses it); None for a text whose prefix of
        `CUT_CHARS_PER_TOKEN` characters per token settles neither (one huge "word"). Read from a prefix of
        `LONG_CHARS_PER_TOKEN` characters per token first, then of `CUT_CHARS_PER_TOKEN`: no text costs more
        than reading that many characters, whatever its size."""
        known: dict[tuple[str, int], _Side] = {}
        out: list[tuple[int, ...] | None] = [None] * len(texts)
        pending = list(range(len(texts)))
        for per_token in (LONG_CHARS_PER_TOKEN, CUT_CHARS_PER_TOKEN):
            chars = per_token * (most + 1)
            self._read_sides([texts[i] for i in pending], chars, known)
            retry = []
            for i in pending:
                side = known[texts[i], min(len(texts[i]), chars)]
                if side.exact or len(side.ids) > most:
                    out[i] = side.ids[: most + 1]
                else:
                    retry.append(i)
            pending = retry
        return out

    def offsets(self, text: str, ids: Sequence[int]) -> tuple[list[tuple[int, int]], list[bool]] | None:
        """The character offsets of a text's tokens as `encode` gave them (`ids`, cut on the right at max_length),
        each trimmed of the white space before its text (a byte-level BPE's `Ġword` under a TemplateProcessing
        post-processor keeps the space before it, which RoBERTa's `trim_offsets` would drop: a sentence's first word
        then lay outside the sentence's span), and which are special tokens; None where its prefix of
        `max_cut_chars` does not give those ids."""
        e = self._backend.encode(text[: self.max_cut_chars])
        if tuple(e.ids) != tuple(ids):
            return None
        return [trimmed(text, a, b) for a, b in e.offsets], [bool(m) for m in e.special_tokens_mask]

    @property
    def specials(self) -> int:
        """How many special tokens every input carries."""
        return len(self.prefix) + len(self.suffix)

    def encode(self, texts: Sequence[str], left: bool = False) -> list[Encoded]:
        """Each text's tokens, truncated at max_length (`left`: its last tokens kept, not its first), exactly as the
        tokenizer gives them for the whole text (or `unbounded`, for a text over `max_cut_chars` characters that
        its prefix, or suffix, does not settle)."""
        if left:
            self._backend.enable_truncation(self.max_length, direction="left")
        try:
            return self._encode(texts, left)
        finally:
            if left:
                self._backend.enable_truncation(self.max_length)

    def _encode(self, texts: Sequence[str], left: bool) -> list[Encoded]:
        out: list[Encoded | None] = [None] * len(texts)
        pending, budget = list(range(len(texts))), self.cut_chars
        while pending:
            pieces = [texts[i][-budget:] if left else texts[i][:budget] for i in pending]
            retry = []
            for i, piece, e in zip(pending, pieces, _slices(self._backend, pieces)):
                if len(piece) == len(texts[i]):
                    out[i] = Encoded(tuple(e.ids), bool(e.overflowing))
                elif e.overflowing and (self._aligned(texts[i], budget, e) if left else _settled(e)):
                    out[i] = Encoded(tuple(e.ids), True)
                elif budget >= self.max_cut_chars:
                    out[i] = Encoded((), True, unbounded=True)
                else:
                    retry.append(i)
            pending, budget = retry, budget * GROWTH
        return [e for e in out if e is not None]

    def _aligned(self, text: str, budget: int, e: Any) -> bool:
        """Whether a left-truncated suffix's kept tokens are the whole text's: a whole word of the suffix lies
        before them, and (`left_shifts` > 1) the suffixes starting 1 to left_shifts - 1 characters later keep the
        same tokens (one of them starts where a word of the whole text starts, as in a run of digits)."""
        if not _settled_left(e) or self.left_shifts > MAX_LEFT_SHIFTS:
            return False
        shifted = [text[len(text) - budget + d :] for d in range(1, self.left_shifts)]
        return all(s.ids == e.ids for s in self._backend.encode_batch(shifted)) if shifted else True

    def prompt_length(self, prompt: str) -> int:
        """Tokens of a prompt as sentence-transformers counts them to leave out of pooling: the prompt tokenized
        alone, special tokens included, less a trailing special token; the PROMPT_CACHE most recently used kept (a
        request's own prompts are unbounded in number)."""
        length = self._prompt_lengths.pop(prompt, None)
        if length is None:
            ids = self._backend.encode(prompt).ids
            length = len(ids) - (1 if ids and ids[-1] in self.special_ids else 0)
            if len(self._prompt_lengths) >= PROMPT_CACHE:
                del self._prompt_lengths[next(iter(self._prompt_lengths))]  # the least recently used
        self._prompt_lengths[prompt] = length
        return length

    def wrap(self, ids: Sequence[int], left: bool = False) -> Encoded:
        """Token ids given without special tokens, truncated to fit max_length (`left`: the last ones kept) and
        wrapped in the special tokens."""
        room = self.max_length - self.specials
        kept = tuple(ids[-room:] if left else ids[:room]) if len(ids) > room else tuple(ids)
        return Encoded(self.prefix + kept + self.suffix, len(ids) > room)

    def empty(self, encoded: Encoded) -> bool:
        """Whether a text gave no token of its own (only invisible or control characters, say)."""
        return len(encoded.ids) <= self.specials


PROBE = "hello"
# Runs whose words a left cut may shift (digits grouped from the left, collapsed spaces), probed at start-up.
LEFT_PROBES = ("1234567890" * 2, "\u0661\u0662\u0663\u0664\u0665" * 4, " " * 20, "\n" * 20, "." * 20, "ab 12, cd.")
MAX_LEFT_SHIFTS = 8  # a tokenizer whose left cut needs more is cut on the left only when the whole text is read
PAIR_PROBE = ("hello", "world")


@dataclass(frozen=True)
class PairTemplate:
    """A tokenizer's pair layout: special tokens before, between and after the two texts, and token types."""

    before: tuple[int, ...]
    between: tuple[int, ...]
    after: tuple[int, ...]
    kinds: list[tuple[int, ...]]  # token types of: before, first text, between, second text, after
    first_type: int
    second_type: int

    @property
    def specials(self) -> int:
        return len(self.before) + len(self.between) + len(self.after)

    def join(self, a: Sequence[int], b: Sequence[int], n_a: int, n_b: int, max_length: int) -> Encoded:
        """The pair's ids and types, its texts cut as the tokenizers library's `longest_first` does; `n_a`, `n_b`:
        each text's token count (at least what is given, plus one when more was cut off)."""
        keep_a, keep_b = longest_first(n_a, n_b, max_length - self.specials)
        a, b = tuple(a[:keep_a]), tuple(b[:keep_b])
        ids = self.before + a + self.between + b + self.after
        k = self.kinds
        types = k[0] + (self.first_type,) * len(a) + k[2] + (self.second_type,) * len(b) + k[4]
        return Encoded(ids, keep_a < n_a or keep_b < n_b, type_ids=types)


def longest_first(n1: int, n2: int, budget: int) -> tuple[int, int]:
    """How many tokens of each text `longest_first` truncation keeps (the tokenizers library's rule): the longer is
    cut to what the shorter leaves; if that is not enough, both to half the budget (the longer gets the odd one)."""
    if n1 + n2 <= budget:
        return n1, n2
    swap = n1 > n2
    short, _ = (n2, n1) if swap else (n1, n2)
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget // 2 + budget % 2
    return (long, short) if swap else (short, long)


PROMPT_CACHE = 64  # prompt token counts kept: the model's few prompts, and the latest of requests' own


@dataclass(frozen=True)
class _Side:
    """One side of a pair as read from a prefix: its first tokens, and its token count (`exact`) or a lower bound."""

    ids: tuple[int, ...]
    n: int
    exact: bool


def _settle(a: _Side, b: _Side, budget: int) -> tuple[int, int] | None:
    """Counts for `longest_first` that split the pair as the true counts do, or None when the bounds do not tell.
    Both past half the budget: halves (an even budget: whichever is longer); else the split needs the shorter
    side's count and which is longer, so an inexact side must be the longer of a pair already over the budget."""
    if a.exact and b.exact:
        return a.n, b.n
    if a.n + b.n <= budget:
        return None
    if 2 * min(a.n, b.n) > budget and budget % 2 == 0:
        return a.n, b.n
    return (a.n, b.n) if (a.exact and b.n > a.n) or (b.exact and a.n > b.n) else None


def _slices(backend: Any, texts: Sequence[str], **options: Any) -> Iterator[Any]:
    """`encode_batch` over `ENCODE_SLICE` texts at a time: the tokenizer's own objects (every token's string,
    offsets, overflow) live for one slice at once, not for all of a request's texts (2,048 of them held 0.1 MB a
    text), and the caller keeps only the ids."""
    for start in range(0, len(texts), ENCODE_SLICE):
        yield from backend.encode_batch(texts[start : start + ENCODE_SLICE], **options)


ENCODE_SLICE = 64  # texts per encode_batch call
CUT_CHARS_PER_TOKEN = 32  # the first prefix tried: enough for max_length tokens of any ordinary prose
LONG_CHARS_PER_TOKEN = 8  # a long text's first prefix (`read_whole`): most prose holds its tokens in it
GROWTH = 4  # the one longer prefix tried when the first settles nothing (so a text costs at most 1 + 4 prefixes)


def _settled_left(e: Any) -> bool:
    """For a left-truncated suffix: a whole word of the suffix lies between its first word (the one a cut may have
    damaged) and the first kept token's word."""
    kept = min((w for w in e.word_ids if w is not None), default=0)
    return kept >= 2


def _settled(e: Any) -> bool:
    """Whether a truncated prefix's kept tokens are the whole text's: a whole word of the prefix lies between
    the last kept token's word and the prefix's last word (the one a cut may have damaged)."""
    kept = max((w for w in e.word_ids if w is not None), default=-1)
    last = max((w for o in e.overflowing for w in o.word_ids if w is not None), default=-1)
    return last >= kept + 2


def trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """A token's `[start, end)` without the white space before its text (a token of white space alone: empty)."""
    while start < end and text[start].isspace():
        start += 1
    return start, end
