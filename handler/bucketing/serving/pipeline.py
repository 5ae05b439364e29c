"""One delivered batch from request rows to replies, each request isolated: the handler only wires TorchServe to it.

Steps, each over plain frozen data: parse every row in its own wire format (`protocols`), tokenize every input
once, plan the sub-batches and run them, then render each request's answer in its format. A request that fails
at any step gets its own error (4xx for its own mistake, 500 for a server fault) while the rest are served: a
batch whose tokenizing or forward passes fail is redone request by request. A request's error is raised where it is
found (`_check`, its tokenizing alone) and made its outcome by the loop over requests (`Incoming.fail`). The
batch's figures (`BatchStats`) count every forward pass that ran, the one-by-one retries included. The worker's
settings are checked against the loaded model once, at start-up (`startup_checks`).

A call never outlives TorchServe's `responseTimeout` (which restarts the worker and fails the whole batch): after
`DEADLINE_SHARE` of it no further pass starts, and each request whose rows did not all run gets its own 503 naming
the limit and the fix, while the requests whose rows all ran are answered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from bucketing import chunks, protocols
from bucketing.answers import Answer, Options
from bucketing.config import OVERFLOW_RULES, ConfigError, HandlerConfig
from bucketing.kinds.task import Rows, Task
from bucketing.metrics import BatchStats
from bucketing.model.tokenizer import CUT_CHARS_PER_TOKEN, Encoded, Tokenizer, collate
from bucketing.planning.planner import CostModel, Plan, plan_bucketed, plan_dynamic, plan_static
from bucketing.protocols import Incoming, Reply, tei
from bucketing.protocols.base import (
    BadRequest,
    Limits,
    Meta,
    Pair,
    Request,
    RequestError,
    ServerError,
    TooLarge,
    Unavailable,
)
from bucketing.protocols.options import SENTENCES, chunked
from bucketing.startup_checks import check_fits, model_prompts

logger = logging.getLogger(__name__)

Planner = Callable[[Sequence[int]], Plan]
RESPONSE_TIMEOUT_S = 120  # TorchServe's default_response_timeout: a model-config without responseTimeout gets it
DEADLINE_SHARE = 0.75  # of responseTimeout: no pass starts after it (the last pass and the answers fit the rest)


def response_timeout_s(model_config: Any) -> float:
    """TorchServe's responseTimeout of the model-config (its top-level key, seconds), else TorchServe's default."""
    top = model_config if isinstance(model_config, dict) else {}
    value = top.get("responseTimeout", RESPONSE_TIMEOUT_S)
    return float(value) if isinstance(value, (int, float)) and value > 0 else float(RESPONSE_TIMEOUT_S)


@dataclass(frozen=True)
class Item:
    """One row to run: the request it belongs to, and its tokens (an input's, or one window of a chunked text's:
    the windows of one text are consecutive items, each holding the whole text's `Encoded`)."""

    request: int
    encoded: Encoded
    whole: Encoded | None = None  # a window's text (`on_overflow: chunk`); None: the row is the input itself
    weight: int = 0  # a window's own tokens of its text


def items_of(request: int, encoded: Sequence[Encoded]) -> list[Item]:
    """The rows of one request's inputs: one per input, or one per window of a chunked text."""
    out: list[Item] = []
    for e in encoded:
        if e.chunks:
            out.extend(Item(request, w, e, n) for w, n in zip(e.chunks, e.weights))
        else:
            out.append(Item(request, e))
    return out


def answers_of(task: Task, items: Sequence[Item], outputs: Sequence[np.ndarray | None]) -> dict[int, list[Answer]]:
    """Each request's answers, one per input in order: a chunked text's from its windows' outputs combined
    (`Task.combine`); none for a request whose outputs are None (it failed)."""
    out: dict[int, list[Answer]] = {}
    windows: list[np.ndarray] = []
    for item, output in zip(items, outputs):
        if output is None:
            continue
        whole = item.whole
        if whole is None:
            answer = task.answer(output, item.encoded)
        else:
            windows.append(output)
            if len(windows) < len(whole.chunks):
                continue
            answer = task.answer(task.combine(windows, whole.weights, whole.input_type), whole)
            windows = []
        chunking = item.encoded.chunking or whole is not None
        out.setdefault(item.request, []).append(
            replace(answer, chunks=len(whole.chunks) if whole else 1) if chunking else answer
        )
    return out


@dataclass(frozen=True)
class Computed:
    """One output per item, in item order (None: its pass did not start before the deadline), and what running
    them cost."""

    outputs: tuple[np.ndarray | None, ...]
    stats: BatchStats


def make_planner(config: HandlerConfig, cost: CostModel) -> Planner:
    """The planner for the configured strategy, with its constants bound."""
    if config.strategy == "static":
        return partial(plan_static, max_length=config.max_length)
    if config.strategy == "dynamic":
        return partial(plan_dynamic, pad_to_multiple_of=config.pad_to_multiple_of)
    return partial(
        plan_bucketed,
        cost=cost,
        max_batch_tokens=config.max_batch_tokens,
        pad_to_multiple_of=config.pad_to_multiple_of,
    )


def compute(
    items: Sequence[Item], plan_fn: Planner, task: Task, pad_id: int, deadline: float | None = None
) -> Computed:
    """Plan the sub-batches, run each forward pass, and restore item order; no pass starts after `deadline` (a
    `time.perf_counter()` value), its items' outputs are then None."""
    plan = plan_fn([task.planned(item.encoded) for item in items])
    start = time.perf_counter()
    results: list[list[np.ndarray]] = []
    ran = []
    for sb in plan.sub_batches:
        if deadline is not None and time.perf_counter() > deadline:
            break
        ran.append(sb)
        encoded = [items[i].encoded for i in sb.indices]
        width = max(sb.padded_len, *(len(e.ids) for e in encoded))  # a row planned shorter than it is fits too
        ids, mask = collate([e.ids for e in encoded], width, pad_id)
        types = None
        if any(e.type_ids for e in encoded):
            types, _ = collate([e.type_ids or (0,) * len(e.ids) for e in encoded], width, 0)
        if any(e.attention for e in encoded):  # query expansion the encoder does not attend to
            mask, _ = collate([e.attention or (1,) * len(e.ids) for e in encoded], width, 0)
        routes = tuple(e.input_type for e in encoded) if task.routed else ()
        pools = tuple(e.pools for e in encoded) if any(e.pools for e in encoded) else ()
        results.append(list(task.forward(Rows(ids, mask, tuple(e.skip for e in encoded), types, routes, pools))))
    forward_ms = (time.perf_counter() - start) * 1000.0
    stats = BatchStats(
        batches=0,
        texts=sum(sb.rows for sb in ran),
        real_tokens=sum(sb.real_tokens for sb in ran),
        padded_tokens=sum(sb.padded_tokens for sb in ran),
        sub_batches=len(ran),
        forward_ms=round(forward_ms, 3),
        passes=tuple((sb.rows, sb.padded_tokens) for sb in ran),
    )
    if len(ran) == len(plan.sub_batches):
        return Computed(tuple(plan.restore(results)), stats)
    outputs: list[np.ndarray | None] = [None] * len(items)
    for sb, result in zip(ran, results):
        for i, output in zip(sb.indices, result):
            outputs[i] = output
    return Computed(tuple(outputs), stats)


class Pipeline:
    """Serves delivered batches with one tokenizer, task and planner (built once per worker)."""

    def __init__(
        self,
        config: HandlerConfig,
        tokenizer: Tokenizer,
        task: Task,
        plan: Planner,
        response_timeout: float = RESPONSE_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.task = task
        self.plan = plan
        self.response_timeout = response_timeout  # TorchServe's, in s: a call starts no pass after its share
        prompts, default_prompt = model_prompts(config, task.settings)
        self.limits = Limits(
            max_texts=config.max_texts_per_request,
            max_length=config.max_length,
            vocab_size=tokenizer.vocab_size,
            task=task.name,
            dimensions=task.dimensions,
            prompts=tuple(prompts.items()),
            default_prompt=default_prompt,
            model=tei.model_facts(config, task, tokenizer),
            ranges=task.ranges,
            chunking=task.chunk_refusal,
            on_overflow=config.on_overflow,
            late=task.late_refusal,
            truncate_dim=task.truncate_dim,
        )
        self.limits = replace(self.limits, chunk_reach=self.windows("").reach)
        if self.limits.chunking and OVERFLOW_RULES[config.on_overflow][1]:
            raise ConfigError(f"handler.on_overflow: got 'chunk'; it {self.limits.chunking}")
        self.model_limit = check_fits(config, task, tokenizer, self.limits)

    def limit_note(self) -> str:
        """For the ready line: what a max_length below the model's own limit means (empty when it is that limit)."""
        if self.config.max_length >= self.model_limit:
            return ""
        return (
            f"; max_length {self.config.max_length} is below the model's own limit of {self.model_limit} tokens: "
            f"texts over {self.config.max_length} tokens differ from sentence-transformers' answers"
        )

    def serve(self, rows: Sequence[Any], meta: Sequence[Meta], model_name: str) -> tuple[list[Reply], BatchStats]:
        """One reply per row, in row order, and the batch's figures."""
        start = time.perf_counter()
        incoming = [protocols.parse(row, m, self.limits) for row, m in zip(rows, meta)]
        incoming, items = self.tokenize(incoming)
        incoming, outputs, stats = self.run(incoming, items, start + DEADLINE_SHARE * self.response_timeout)
        answers = answers_of(self.task, items, outputs)
        replies = [self.reply(inc, answers.get(i, []), model_name) for i, inc in enumerate(incoming)]
        if len(replies) != len(rows):
            raise RuntimeError(f"{len(rows)} requests but {len(replies)} replies")
        return replies, call_stats(stats, replies, start)

    def reply(self, incoming: Incoming, answers: list[Answer], model_name: str) -> Reply:
        """The request's answer (or error) rendered and encoded, with what that took (`Reply.answer_ms`)."""
        start = time.perf_counter()
        try:
            reply = incoming.reply(answers, model_name, self.config.max_response_bytes)
        except Exception as e:  # noqa: BLE001 - a rendering fault fails this request alone
            logger.exception("rendering an answer failed")
            reply = incoming.fail(server_error(f"answering failed: {type(e).__name__}")).reply([], model_name, 0)
        return replace(reply, answer_ms=(time.perf_counter() - start) * 1000.0)

    def encode(self, request: Request | _Merged) -> list[Encoded]:
        """The tokens of one request's inputs: texts tokenized after their prompt (the pooling leaves the prompt's
        tokens out where the model's chain says so), token ids wrapped in the special tokens; each cut at the end
        its request says (`truncation_direction`)."""
        merged = request if isinstance(request, _Merged) else _Merged([request])
        out: list[Encoded | None] = [None] * len(merged.inputs)
        for left in (False, True):
            mine = [i for i, o in enumerate(merged.options) if (o.truncation_direction == "left") == left]
            texts = {i: x for i in mine if isinstance(x := merged.inputs[i], str)}
            encoded = (
                self.tokenizer.encode([merged.options[i].prompt + x for i, x in texts.items()], left) if texts else []
            )
            for i, e in zip(texts, encoded):
                prompt = merged.options[i].prompt
                skip = self.tokenizer.prompt_length(prompt) if prompt and self.excludes_prompt else 0
                out[i] = replace(e, skip=skip, input_type=merged.options[i].input_type)
            for i in mine:
                if isinstance(x := merged.inputs[i], tuple):
                    out[i] = replace(self.tokenizer.wrap(x, left), input_type=merged.options[i].input_type)
        pairs = {i: x for i, x in enumerate(merged.inputs) if isinstance(x, Pair)}
        if pairs:  # a cross-encoder's query (after the prompt) and document, cut longest_first as CrossEncoder does
            encoded = self.tokenizer.encode_pairs(
                [(merged.options[i].prompt + x.query, x.document) for i, x in pairs.items()]
            )
            for i, e in zip(pairs, encoded):
                out[i] = e
        specials = (len(self.tokenizer.prefix), len(self.tokenizer.suffix))
        shape, ceiling = self.task.shape, self.config.max_length
        out = [e if e is None else shape(e, o, ceiling, specials) for e, o in zip(out, merged.options)]
        self._chunk(merged, out)
        self._late(merged, out)
        missing = [i for i, e in enumerate(out) if e is None]
        if missing:  # an input of no known kind: fail the request rather than shift its answers
            raise TypeError(f"input {missing[0]} is neither a text, token ids nor a pair")
        return [e for e in out if e is not None]

    def windows(self, prompt: str) -> chunks.Windows:
        """How a text after this prompt is cut into windows: `chunk_tokens`, within what max_length leaves after the
        special tokens and the prompt's own tokens."""
        room = self.config.max_length - self.tokenizer.specials - self._prompt_tokens(prompt)
        tokens = min(self.config.chunk_tokens or room, room)
        return chunks.Windows(tokens, self.config.chunk_overlap, self.config.max_chunks)

    def _prompt_tokens(self, prompt: str) -> int:
        """A prompt's own tokens (without special tokens), as they lead its text's tokens."""
        return self.tokenizer.prompt_length(prompt) - len(self.tokenizer.prefix) if prompt else 0

    def _chunk(self, merged: _Merged, out: list[Encoded | None]) -> None:
        """In place: each input of a request that chunks marked so, and each over max_length (a text, or token ids)
        read whole, up to its windows' reach, and split into windows (`chunks.Windows`); one past that reach stays
        `truncated` with no windows (refused by `_check`), as does a text whose prompt leaves no room."""
        long: dict[int, tuple[str, chunks.Windows]] = {}
        for i, e in enumerate(out):
            options = merged.options[i]
            if e is None or isinstance(merged.inputs[i], Pair) or not chunked(options, self.limits):
                continue
            out[i] = e = replace(e, chunking=True)
            windows = self.windows(options.prompt if isinstance(merged.inputs[i], str) else "")
            if e.truncated and windows.stride >= 1:
                long[i] = (options.prompt, windows)
        reading: dict[int, list[int]] = {}  # texts by the tokens to read of them: their prompt's and windows' reach
        for i, (prompt, windows) in long.items():
            if isinstance(merged.inputs[i], str):
                reading.setdefault(self._prompt_tokens(prompt) + windows.reach, []).append(i)
        read: dict[int, tuple[int, ...] | None] = {}
        for most, which in reading.items():
            texts = [merged.options[i].prompt + str(merged.inputs[i]) for i in which]
            read.update(zip(which, self.tokenizer.read_whole(texts, most)))
        for i, (prompt, windows) in long.items():
            e, x = out[i], merged.inputs[i]
            if e is None:
                continue
            lead = self._prompt_tokens(prompt) if i in read else 0
            ids = read[i] if i in read else tuple(x)  # type: ignore[arg-type]  # token ids
            if ids is None:
                out[i] = replace(e, ids=(), unbounded=True)
                continue
            head, body = tuple(ids[:lead]), tuple(ids[lead:])
            if len(body) > windows.reach:
                continue  # over max_chunks windows: stays truncated, refused by `_check`
            prefix, suffix = self.tokenizer.prefix, self.tokenizer.suffix
            spans = windows.spans(len(body))
            parts = tuple(replace(e, ids=prefix + head + body[a:b] + suffix, truncated=False) for a, b in spans)
            weights = tuple(b - a for a, b in spans)
            out[i] = replace(e, ids=prefix + head + body + suffix, truncated=False, chunks=parts, weights=weights)

    def _late(self, merged: _Merged, out: list[Encoded | None]) -> None:
        """In place: each text of a late-chunking request given its spans ("sentences", or the request's) and the
        positions of each span's tokens among those read (`chunks.span_tokens`); a given span with none is refused by
        `_check`, as is a text whose token offsets cannot be read; a sentence with none (past max_length) is left
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

    @property
    def excludes_prompt(self) -> bool:
        """Whether the model's pooling leaves prompt tokens out (sentence-transformers' `include_prompt: false`)."""
        chain = self.task.chain
        return chain is not None and not chain.include_prompt

    def tokenize(self, incoming: list[Incoming]) -> tuple[list[Incoming], list[Item]]:
        """Every input's tokens, one tokenizer call for the batch (redone per request if it fails)."""
        live = {i: request for i, inc in enumerate(incoming) if (request := inc.request) is not None}
        shares: list[list[Encoded]] | None
        try:
            merged = _Merged(list(live.values()))
            shares = merged.split(self.encode(merged))
        except Exception:  # noqa: BLE001 - find the request at fault
            logger.exception("tokenizing a batch of %d requests failed; redoing it request by request", len(live))
            shares = None
        out, items = list(incoming), list[Item]()
        for k, (i, request) in enumerate(live.items()):
            try:
                encoded = shares[k] if shares is not None else self._encode_alone(request)
                self._check(request, encoded)
            except RequestError as error:
                out[i] = incoming[i].fail(error)
                continue
            items.extend(items_of(i, encoded))
        return out, items

    def _encode_alone(self, request: Request) -> list[Encoded]:
        """One request's tokens; a fault raises a 500 for this request alone."""
        try:
            return self.encode(request)
        except Exception as e:  # noqa: BLE001 - answered as a 500 for this request alone
            logger.exception("tokenizing a request failed")
            raise server_error(f"tokenizing failed: {type(e).__name__}") from e

    def _check(self, request: Request, encoded: list[Encoded]) -> None:
        """An input that normalised to nothing is a 400; one over max_length is a 413 under `on_overflow: reject`."""
        for index, e in enumerate(encoded):
            if isinstance(request.inputs[index], Pair):
                self._check_pair(request, index, e)
                continue
            if e.chunking and e.truncated:
                raise TooLarge("TextTooLong", self._too_long(request, index, e), "input")
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

    def _too_long(self, request: Request, index: int, e: Encoded) -> str:
        """Why a text of a request that chunks is refused: too many windows, no room for one, or unreadable."""
        where, prompt = request.where(index), request.options.prompt
        windows = self.windows(prompt if isinstance(request.inputs[index], str) else "")
        if windows.stride < 1:
            return (
                f"{where} is over max_length={self.config.max_length} tokens, and with its prompt a window holds "
                f"{windows.tokens} of its tokens, not more than chunk_overlap={windows.overlap}"
            )
        if e.unbounded:
            chars = CUT_CHARS_PER_TOKEN * (self._prompt_tokens(prompt) + windows.reach + 1)
            return (
                f"{where}: its first {chars} characters give fewer than the {windows.reach} tokens "
                f"max_chunks={windows.most} windows hold and end in one unbroken run the tokenizer reads as a single "
                "word; split it into shorter texts"
            )
        return (
            f"{where} has more than max_chunks={windows.most} windows of {windows.tokens} tokens "
            f"({windows.reach} tokens with chunk_overlap={windows.overlap}); split it, or raise handler.max_chunks"
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

    def run(
        self, incoming: list[Incoming], items: list[Item], deadline: float | None = None
    ) -> tuple[list[Incoming], list[np.ndarray | None], BatchStats]:
        """Outputs for every item (None where its request failed), in item order; redone per request on failure;
        a request whose rows did not all run before `deadline` gets its 503 (`out_of_time`)."""
        if not items:
            return incoming, [], BatchStats(batches=0)
        pad_id = self.tokenizer.pad_id
        try:
            computed = compute(items, self.plan, self.task, pad_id, deadline)
            return self.out_of_time(incoming, items, list(computed.outputs), computed.stats)
        except Exception:  # noqa: BLE001 - isolate a poison request instead of failing its neighbours
            logger.exception("a batch of %d inputs failed; redoing it request by request", len(items))
        out, stats = list(incoming), BatchStats(batches=0)
        outputs: list[np.ndarray | None] = [None] * len(items)
        for owner in sorted({item.request for item in items}):
            positions = [k for k, item in enumerate(items) if item.request == owner]
            try:
                computed = compute([items[k] for k in positions], self.plan, self.task, pad_id, deadline)
            except Exception as e:  # noqa: BLE001 - answered as a 500 for this request alone
                logger.exception("request %d failed alone", owner)
                out[owner] = incoming[owner].fail(server_error(f"inference failed: {type(e).__name__}"))
                continue
            stats = stats + computed.stats
            for k, output in zip(positions, computed.outputs):
                outputs[k] = output
        return self.out_of_time(out, items, outputs, stats)

    def out_of_time(
        self, incoming: list[Incoming], items: list[Item], outputs: list[np.ndarray | None], stats: BatchStats
    ) -> tuple[list[Incoming], list[np.ndarray | None], BatchStats]:
        """Each request with a row left unrun (None) and no outcome yet: a 503 naming the limit; its other rows'
        outputs dropped."""
        unrun = {item.request for item, output in zip(items, outputs) if output is None}
        late = {owner for owner in unrun if incoming[owner].request is not None}
        if not late:
            return incoming, outputs, stats
        out = list(incoming)
        message = (
            f"the batch ran {DEADLINE_SHARE:.0%} of the worker's responseTimeout ({self.response_timeout:g} s) "
            "before this request's texts were all run; send fewer or shorter texts per request, or raise "
            "responseTimeout in the model-config (handler.schedule: continuous cuts a large request across calls)"
        )
        for owner in late:
            out[owner] = incoming[owner].fail(Unavailable("ServiceUnavailable", message))
        logger.warning("%d request(s) answered 503: the call reached its share of responseTimeout", len(late))
        kept = [None if item.request in late else output for item, output in zip(items, outputs)]
        return out, kept, stats


class _Merged:
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


def call_stats(stats: BatchStats, replies: Sequence[Reply], start: float) -> BatchStats:
    """One handler call's figures: its passes' (`stats`) with the requests it answered, and its time."""
    return replace(
        stats,
        batches=1,
        requests=len(replies),
        rejected=sum(400 <= r.status < 500 for r in replies),
        failed=sum(r.status >= 500 for r in replies),
        errors=tuple((r.error, r.status) for r in replies if r.error),
        answer_ms=round(sum(r.answer_ms for r in replies), 3),
        answer_bytes=sum(len(r.body) for r in replies if r.status == 200),
        handler_ms=round((time.perf_counter() - start) * 1000.0, 3),
    )


def server_error(message: str) -> ServerError:
    """A server fault on one request (a 500), to raise or record as its outcome."""
    return ServerError("InternalServerError", message)
