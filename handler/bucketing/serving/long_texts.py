"""Long texts: `on_overflow: chunk` (a text over max_length read whole, up to its windows' reach, and split into
windows of its own tokens, each run as its own row) and late chunking (one pass over a text, pooled per span), both
applied in place to a batch's tokens as `Pipeline.encode` gives them; and why a text that chunks is refused."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from bucketing import chunks
from bucketing.config import ConfigError, HandlerConfig
from bucketing.model.encoded import Encoded
from bucketing.model.tokenizer import CUT_CHARS_PER_TOKEN, Tokenizer
from bucketing.protocols.base import Limits, Pair, Request
from bucketing.protocols.options import SENTENCES, chunked


class Merged:
    """Several requests' inputs as one, so the batch is tokenized in one call; `split` gives each its share."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self.counts = [len(r.inputs) for r in requests]
        self.inputs = tuple(x for r in requests for x in r.inputs)
        self.options = tuple(r.options for r in requests for _ in r.inputs)

    def split(self, encoded: list[Encoded]) -> list[list[Encoded]]:
        out, start = [], 0
        for n in self.counts:
            out.append(encoded[start : start + n])
            start += n
        return out


class LongTexts:
    """How this worker cuts long texts into windows (`chunk`) and spans (`late`), with its tokenizer."""

    def __init__(self, config: HandlerConfig, tokenizer: Tokenizer) -> None:
        self.config = config
        self.tokenizer = tokenizer

    def windows(self, prompt: str) -> chunks.Windows:
        """How a text after this prompt is cut into windows: `chunk_tokens`, within what max_length leaves after the
        special tokens and the prompt's own tokens."""
        room = self.config.max_length - self.tokenizer.specials - self.prompt_tokens(prompt)
        tokens = min(self.config.chunk_tokens or room, room)
        return chunks.Windows(tokens, self.config.chunk_overlap, self.config.max_chunks)

    def check_overlap(self, prompts: Sequence[tuple[str, str]]) -> None:
        """At start: `chunk_overlap` below the real window (max_length less the special tokens, and less the default
        prompt's tokens where the model has one), else every long text would be refused; a ConfigError in one line."""
        for name, prompt in (("", ""), *prompts):
            windows = self.windows(prompt)
            if windows.stride >= 1:
                continue
            with_prompt = f" and the default prompt {name!r}'s {self.prompt_tokens(prompt)}" if prompt else ""
            raise ConfigError(
                f"handler.chunk_overlap: got {windows.overlap}; allowed: fewer than a window's tokens "
                f"({windows.tokens}: chunk_tokens, else max_length={self.config.max_length} less this model's "
                f"{self.tokenizer.specials} special tokens{with_prompt})"
            )

    def prompt_tokens(self, prompt: str) -> int:
        """A prompt's own tokens (without special tokens), as they lead its text's tokens."""
        return self.tokenizer.prompt_length(prompt) - len(self.tokenizer.prefix) if prompt else 0

    def chunk(self, merged: Merged, out: list[Encoded | None], limits: Limits) -> None:
        """In place: each input of a request that chunks marked so, and each over max_length (a text, or token ids)
        read whole, up to its windows' reach, and split into windows (`chunks.Windows`); one past that reach stays
        `truncated` with no windows (refused by `Checks.check`), as does a text whose prompt leaves no room."""
        long: dict[int, tuple[str, chunks.Windows]] = {}
        for i, e in enumerate(out):
            options = merged.options[i]
            if e is None or isinstance(merged.inputs[i], Pair) or not chunked(options, limits):
                continue
            out[i] = e = replace(e, chunking=True)
            windows = self.windows(options.prompt if isinstance(merged.inputs[i], str) else "")
            if e.truncated and windows.stride >= 1:
                long[i] = (options.prompt, windows)
        reading: dict[int, list[int]] = {}  # texts by the tokens to read of them: their prompt's and windows' reach
        for i, (prompt, windows) in long.items():
            if isinstance(merged.inputs[i], str):
                reading.setdefault(self.prompt_tokens(prompt) + windows.reach, []).append(i)
        read: dict[int, tuple[int, ...] | None] = {}
        for most, which in reading.items():
            texts = [merged.options[i].prompt + str(merged.inputs[i]) for i in which]
            read.update(zip(which, self.tokenizer.read_whole(texts, most)))
        for i, (prompt, windows) in long.items():
            e, x = out[i], merged.inputs[i]
            if e is None:
                continue
            lead = self.prompt_tokens(prompt) if i in read else 0
            ids = read[i] if i in read else tuple(x)  # type: ignore[arg-type]  # token ids
            if ids is None:
                out[i] = replace(e, ids=(), unbounded=True)
                continue
            head, body = tuple(ids[:lead]), tuple(ids[lead:])
            if len(body) > windows.reach:
                continue  # over max_chunks windows: stays truncated, refused by `Checks.check`
            prefix, suffix = self.tokenizer.prefix, self.tokenizer.suffix
            spans = windows.spans(len(body))
            parts = tuple(replace(e, ids=prefix + head + body[a:b] + suffix, truncated=False) for a, b in spans)
            weights = tuple(b - a for a, b in spans)
            out[i] = replace(e, ids=prefix + head + body + suffix, truncated=False, chunks=parts, weights=weights)

    def late(self, merged: Merged, out: list[Encoded | None]) -> None:
        """In place: each text of a late-chunking request given its spans ("sentences", or the request's) and the
        positions of each span's tokens among those read (`chunks.span_tokens`); a given span with none is refused by
        `Checks.check`, as is a text whose token offsets cannot be read; a sentence with none (past max_length) is left
        out."""
        for i, e in enumerate(out):
            options, x = merged.options[i], merged.inputs[i]
            if e is None or options.spans is None or not isinstance(x, str):
                continue
            spans = tuple(chunks.sentences(x)) if options.spans == SENTENCES else options.spans
            read = self.tokenizer.offsets(options.prompt + x, e.ids) if not e.unbounded else None
            pools = chunks.span_tokens(*read, len(options.prompt), spans) if read else ()
            if options.spans == SENTENCES and pools:  # sentences past max_length are left out (`truncated` says so)
                spans, pools = tuple(s for s, p in zip(spans, pools) if p), tuple(p for p in pools if p)
            out[i] = replace(e, spans=spans, pools=pools)

    def too_long(self, request: Request, index: int, e: Encoded) -> str:
        """Why a text of a request that chunks is refused: too many windows, no room for one, or unreadable."""
        where, prompt = request.where(index), request.options.prompt
        windows = self.windows(prompt if isinstance(request.inputs[index], str) else "")
        if windows.stride < 1:
            return (
                f"{where} is over max_length={self.config.max_length} tokens, and with its prompt a window holds "
                f"{windows.tokens} of its tokens, not more than chunk_overlap={windows.overlap}"
            )  # a request's own prompt: the worker's start refused an overlap no window without one could hold
        if e.unbounded:
            chars = CUT_CHARS_PER_TOKEN * (self.prompt_tokens(prompt) + windows.reach + 1)
            return (
                f"{where}: its first {chars} characters give fewer than the {windows.reach} tokens "
                f"max_chunks={windows.most} windows hold and end in one unbroken run the tokenizer reads as a single "
                "word; split it into shorter texts"
            )
        return (
            f"{where} has more than max_chunks={windows.most} windows of {windows.tokens} tokens "
            f"({windows.reach} tokens with chunk_overlap={windows.overlap}); split it, or raise handler.max_chunks"
        )
