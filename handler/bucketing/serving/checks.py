"""The per-input checks of a tokenized request: each input that normalised to nothing is a 400, one over
max_length a 413 unless it may be cut, a text that chunks past its windows a 413, late chunking's spans checked
against the text, a pair's cut as CrossEncoder's, a request whose answer its tokens show over the response cap a
413 before any pass; the first failing input raises the request's error (its outcome,
made by the serving loop: `Incoming.fail`)."""

from __future__ import annotations

from bucketing.answers import Options, numbers_bytes
from bucketing.config import OVERFLOW_RULES, HandlerConfig
from bucketing.kinds.task import Task
from bucketing.model.encoded import Encoded
from bucketing.model.tokenizer import Tokenizer
from bucketing.protocols import too_large
from bucketing.protocols.base import BadRequest, Limits, Pair, Request, TooLarge
from bucketing.protocols.options import SENTENCES, chunked
from bucketing.serving.long_texts import LongTexts


class Checks:
    """What a worker refuses of a request's tokens (its config, tokenizer, task and limits)."""

    def __init__(
        self, config: HandlerConfig, tokenizer: Tokenizer, task: Task, limits: Limits, long_texts: LongTexts
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.task = task
        self.limits = limits
        self.long_texts = long_texts

    @property
    def excludes_prompt(self) -> bool:
        """Whether the model's pooling leaves prompt tokens out (sentence-transformers' `include_prompt: false`)."""
        chain = self.task.chain
        return chain is not None and not chain.include_prompt

    def check(self, request: Request, encoded: list[Encoded]) -> None:
        """An input that normalised to nothing is a 400; one over max_length is a 413 under `on_overflow: reject`."""
        for index, e in enumerate(encoded):
            if isinstance(request.inputs[index], Pair):
                self._check_pair(request, index, e)
                continue
            if e.chunking and e.truncated:
                raise TooLarge("TextTooLong", self.long_texts.too_long(request, index, e), "input")
            if e.unbounded:
                raise TooLarge(
                    "TextTooLong",
                    f"{request.where(index)} is over "
                    f"{self.tokenizer.max_cut_chars} characters and its first "
                    f"{self.tokenizer.max_cut_chars} hold no word boundary the tokenizer keeps "
                    f"after max_length={self.config.max_length} tokens; split it into "
                    "shorter texts",
                    "input",
                )
            if self.tokenizer.empty(e):
                raise BadRequest(
                    "EmptyText",
                    f"{request.where(index)} has no tokens once normalised "
                    "(only invisible, control or zero-width characters)",
                    "input",
                )
            options = request.options
            refusal = self.task.refuse(e, request.where(index), self.config.max_length)
            if refusal:
                raise TooLarge("TextTooLong", refusal, "input")
            if e.truncated and not self._may_cut(options):
                why = "truncate: false" if options.truncate is False else "on_overflow: reject"
                raise TooLarge(
                    "TextTooLong",
                    f"{request.where(index)} has more than {self._limit(options)} ({why})",
                    "input",
                )
            if options.truncation_direction == "left" and options.prompt and self.excludes_prompt:
                raise BadRequest(
                    "InvalidRequest",
                    'truncation_direction "left" with a prompt is not served '
                    "by this model: its pooling leaves the prompt's tokens out, and a left cut "
                    "removes them first",
                    "truncation_direction",
                )
            if options.spans is not None:
                self._check_late(request, index, e)
        self._check_size(request, encoded)

    def _check_size(self, request: Request, encoded: list[Encoded]) -> None:
        """An answer its tokens already say is over the response cap (one vector per token) is a 413 before any
        pass runs: the same refusal as after one, without the passes and their memory."""
        counts = [self.task.numbers(e, request.options) for e in encoded]
        if not counts or any(c is None for c in counts):
            return
        least = numbers_bytes(sum(c or 0 for c in counts), request.options)
        if least > self.config.max_response_bytes:
            raise too_large(f"at least {least}", self.config.max_response_bytes)

    def _check_late(self, request: Request, index: int, e: Encoded) -> None:
        """Late chunking: a text (not token ids), explicit spans only for one text and within it, each span holding
        a token of what max_length reads."""
        where, text, spans = request.where(index), request.inputs[index], e.spans or ()
        if not isinstance(text, str):
            raise BadRequest(
                "InvalidRequest", f"{where}: late chunking takes texts (its spans are character offsets)", "input"
            )
        if request.options.spans != SENTENCES and len(request.inputs) > 1:
            raise BadRequest(
                "InvalidRequest",
                f'"spans" given as offsets are one text\'s; this request has {len(request.inputs)} texts: send one '
                'text per request, or "spans": "sentences"',
                "spans",
            )
        if not e.pools:
            raise TooLarge("TextTooLong", f"{where}: its tokens' character offsets could not be read", "input")
        for k, ((start, end), pool) in enumerate(zip(spans, e.pools)):
            if end > len(text):
                raise BadRequest(
                    "InvalidRequest", f"spans[{k}] = [{start}, {end}] ends past its {len(text)} characters", "spans"
                )
            if pool:
                continue
            if e.truncated:
                raise TooLarge(
                    "TextTooLong",
                    f"spans[{k}] = [{start}, {end}] of {where} holds no whole token among the first "
                    f"max_length={self.config.max_length} tokens late chunking reads (one pass over the text)",
                    "spans",
                )
            raise BadRequest(
                "InvalidRequest",
                f"spans[{k}] = [{start}, {end}] of {where} holds no whole token (a token is in a span when its "
                "characters lie inside it)",
                "spans",
            )

    def _limit(self, options: Options) -> str:
        """Where a text of this request is cut, for a message: max_length, or a multi-vector model's length for
        the request's input type (query_length, document_length)."""
        cut = self.task.cut(options.input_type, self.config.max_length)
        if cut == self.config.max_length:
            return f"max_length={cut} tokens"
        return f"{cut} tokens (the model's {options.input_type} length)"

    def _may_cut(self, options: Options) -> bool:
        """Whether an input over max_length is cut (the request's `truncate`, else `handler.on_overflow`)."""
        if chunked(options, self.limits):
            return False
        return options.truncate if options.truncate is not None else OVERFLOW_RULES[self.config.on_overflow][0]

    def _check_pair(self, request: Request, index: int, e: Encoded) -> None:
        where, options = request.where(index), request.options
        if options.truncation_direction == "left":
            raise BadRequest(
                "InvalidRequest",
                'truncation_direction "left" is not served for text pairs '
                "(cut longest_first, as CrossEncoder cuts them)",
                "truncation_direction",
            )
        if e.unbounded:
            raise TooLarge(
                "TextTooLong",
                f"{where}: how max_length={self.config.max_length} tokens are split between the two texts "
                f"depends on which is longer, and their first {self.tokenizer.max_cut_chars} characters do not "
                'tell (both that long, or one "word" that long); send shorter texts',
                "input",
            )
        if e.truncated and not self._may_cut(options):
            raise TooLarge(
                "TextTooLong",
                f"{where}: the pair has more than max_length={self.config.max_length} tokens",
                "input",
            )
