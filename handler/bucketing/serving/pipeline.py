"""One delivered batch from request rows to replies, each request isolated: the serving loop (the handler only wires
TorchServe to it).

Steps, each over plain frozen data: parse every row in its own wire format (`protocols`), tokenize every input
once (long texts cut into windows or spans: `long_texts`), check each request's inputs (`checks`), plan the
sub-batches and run them (`passes`), then render each request's answer in its format. A request that fails at any
step gets its own error (4xx for its own mistake, 500 for a server fault) while the rest are served: a batch whose
tokenizing or forward passes fail is redone request by request. A request's error is raised where it is found (the
checks, its tokenizing alone) and made its outcome by the loop over requests (`Incoming.fail`). The batch's figures
(`BatchStats`) count every forward pass that ran, the one-by-one retries included. The worker's settings are
checked against the loaded model once, at start-up (`startup_checks`).

A call is one `Pipeline.step`: new rows admitted (parsed and tokenized; a request that fails is answered at once),
the rows `choose` picks of the requests in flight run, and each request whose rows have all run answered. A batch
call (`Pipeline.serve`) runs every row, before its deadline (`deadline`); the continuous pool (`continuous`) runs a
slice and keeps the rest in flight across calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bucketing import protocols
from bucketing.answers import Answer
from bucketing.config import OVERFLOW_RULES, ConfigError, HandlerConfig
from bucketing.kinds.task import Task
from bucketing.metrics import BatchStats
from bucketing.model.encoded import Encoded
from bucketing.model.tokenizer import Tokenizer
from bucketing.planning.planner import CostModel
from bucketing.protocols import Incoming, Reply, tei
from bucketing.protocols.base import Limits, Meta, Pair, Request, RequestError, ServerError
from bucketing.serving.checks import Checks
from bucketing.serving.deadline import RESPONSE_TIMEOUT_S, deadline_of, out_of_time
from bucketing.serving.long_texts import LongTexts, Merged
from bucketing.serving.passes import Deadline, Item, Planner, answers_of, compute, items_of
from bucketing.startup_checks import check_fits, model_prompts

logger = logging.getLogger(__name__)


@dataclass
class InFlight:
    """A request admitted and not yet answered: its parsed form, its rows (`Item.request` 0), the outputs of those
    run so far."""

    incoming: Incoming
    items: list[Item]
    outputs: list[np.ndarray | None] = field(default_factory=list)

    @property
    def remaining(self) -> list[Item]:
        return self.items[len(self.outputs) :]


# Given the requests in flight by row, the rows to run now: (row, how many of its remaining rows), in run order.
Choose = Callable[[dict[int, InFlight]], Sequence[tuple[int, int]]]


def everything(flight: dict[int, InFlight]) -> list[tuple[int, int]]:
    """A batch call's choice: every remaining row of every request, in row order."""
    return [(row, len(f.remaining)) for row, f in flight.items()]


class Pipeline:
    """Serves delivered batches with one tokenizer, task and planner (built once per worker)."""

    def __init__(
        self,
        config: HandlerConfig,
        tokenizer: Tokenizer,
        task: Task,
        plan: Planner,
        response_timeout: float = RESPONSE_TIMEOUT_S,
        cost: CostModel | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.task = task
        self.plan = plan
        self.response_timeout = response_timeout  # TorchServe's, in s: a call starts no pass after its share
        self.cost = cost or CostModel()  # what a pass costs: none starts that would end past the deadline
        self.long_texts = LongTexts(config, tokenizer)
        prompts, default_prompt = model_prompts(config, task.settings)
        if task.chunk_refusal is None:  # chunking served: an overlap no window can hold refused at start
            self.long_texts.check_overlap([(default_prompt, prompts[default_prompt])] if default_prompt else [])
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
            chunk_reach=self.long_texts.windows("").reach,
        )
        if self.limits.chunking and OVERFLOW_RULES[config.on_overflow][1]:
            raise ConfigError(f"handler.on_overflow: got 'chunk'; it {self.limits.chunking}")
        self.checks = Checks(config, tokenizer, task, self.limits, self.long_texts)
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
        """One reply per row, in row order, and the batch's figures: every row run, before the call's deadline."""
        start = time.perf_counter()
        done, stats = self.step(
            rows, meta, [None] * len(rows), everything, model_name, deadline_of(start, self.response_timeout, self.cost)
        )
        replies = [r for r in done if isinstance(r, Reply)]
        if len(replies) != len(rows):
            raise RuntimeError(f"{len(rows)} requests but {len(replies)} replies")
        return replies, call_stats(stats, replies, start)

    def step(
        self,
        rows: Sequence[Any],
        meta: Sequence[Meta],
        held: Sequence[InFlight | None],
        choose: Choose,
        model_name: str,
        deadline: Deadline | None = None,
    ) -> tuple[list[Reply | InFlight], BatchStats]:
        """One call's work: each new row (None in `held`; the others are requests in flight from earlier calls)
        parsed and tokenized, a request that fails (or has no rows) answered at once; of the rows of every request
        in flight, those `choose` picks run (none after `deadline`); each request whose rows have all run answered.
        Per row: its reply, or its request still in flight; and the passes' figures."""
        new = [i for i, h in enumerate(held) if h is None]
        parsed, items = self.tokenize([protocols.parse(rows[i], meta[i], self.limits) for i in new])
        by_request: dict[int, list[Item]] = {}
        for item in items:
            by_request.setdefault(item.request, []).append(replace(item, request=0))
        out: list[Reply | InFlight | None] = list(held)
        admitted = dict(zip(new, parsed))
        incoming = [h.incoming if h is not None else admitted[i] for i, h in enumerate(held)]
        for j, i in enumerate(new):
            mine = by_request.get(j, [])
            if parsed[j].request is None or not mine:
                out[i] = self.reply(parsed[j], [], model_name)
            else:
                out[i] = InFlight(parsed[j], mine)
        flight = {i: f for i, f in enumerate(out) if isinstance(f, InFlight)}
        run = [replace(x, request=i) for i, n in choose(flight) for x in flight[i].remaining[:n]]
        outcome, outputs, stats = self.run(incoming, run, deadline)
        ran: dict[int, list[np.ndarray | None]] = {}
        for item, output in zip(run, outputs):
            ran.setdefault(item.request, []).append(output)
        for i, results in ran.items():
            f = flight[i]
            if outcome[i].request is None:  # a pass holding its rows failed, or the deadline came: its own error
                out[i] = self.reply(outcome[i], [], model_name)
                continue
            f.outputs.extend(results)
            if not f.remaining:
                out[i] = self.reply(f.incoming, answers_of(self.task, f.items, f.outputs).get(0, []), model_name)
        return [o for o in out if o is not None], stats

    def reply(self, incoming: Incoming, answers: list[Answer], model_name: str) -> Reply:
        """The request's answer (or error) rendered and encoded, with what that took (`Reply.answer_ms`)."""
        start = time.perf_counter()
        try:
            reply = incoming.reply(answers, model_name, self.config.max_response_bytes)
        except Exception as e:  # noqa: BLE001 - a rendering fault fails this request alone
            logger.exception("rendering an answer failed")
            reply = incoming.fail(server_error(f"answering failed: {type(e).__name__}")).reply([], model_name, 0)
        return replace(reply, answer_ms=(time.perf_counter() - start) * 1000.0)

    def encode(self, request: Request | Merged) -> list[Encoded]:
        """The tokens of one request's inputs: texts tokenized after their prompt (the pooling leaves the prompt's
        tokens out where the model's chain says so), token ids wrapped in the special tokens; each cut at the end
        its request says (`truncation_direction`)."""
        merged = request if isinstance(request, Merged) else Merged([request])
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
                o = merged.options[i]
                out[i] = replace(e, skip=skip, input_type=o.input_type, max_active=o.max_active_dims)
            for i in mine:
                if isinstance(x := merged.inputs[i], tuple):
                    o = merged.options[i]
                    out[i] = replace(
                        self.tokenizer.wrap(x, left), input_type=o.input_type, max_active=o.max_active_dims
                    )
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
        self.long_texts.chunk(merged, out, self.limits)
        self.long_texts.late(merged, out)
        missing = [i for i, e in enumerate(out) if e is None]
        if missing:  # an input of no known kind: fail the request rather than shift its answers
            raise TypeError(f"input {missing[0]} is neither a text, token ids nor a pair")
        return [e for e in out if e is not None]

    @property
    def excludes_prompt(self) -> bool:
        """Whether the model's pooling leaves prompt tokens out (sentence-transformers' `include_prompt: false`)."""
        return self.checks.excludes_prompt

    def tokenize(self, incoming: list[Incoming]) -> tuple[list[Incoming], list[Item]]:
        """Every input's tokens, one tokenizer call for the batch (redone per request if it fails)."""
        live = {i: request for i, inc in enumerate(incoming) if (request := inc.request) is not None}
        shares: list[list[Encoded]] | None
        try:
            merged = Merged(list(live.values()))
            shares = merged.split(self.encode(merged))
        except Exception:  # noqa: BLE001 - find the request at fault
            logger.exception("tokenizing a batch of %d requests failed; redoing it request by request", len(live))
            shares = None
        out, items = list(incoming), list[Item]()
        for k, (i, request) in enumerate(live.items()):
            try:
                encoded = shares[k] if shares is not None else self.encode_alone(request)
                self.checks.check(request, encoded)
            except RequestError as error:
                out[i] = incoming[i].fail(error)
                continue
            items.extend(items_of(i, encoded))
        return out, items

    def encode_alone(self, request: Request) -> list[Encoded]:
        """One request's tokens; a fault raises a 500 for this request alone."""
        try:
            return self.encode(request)
        except Exception as e:  # noqa: BLE001 - answered as a 500 for this request alone
            logger.exception("tokenizing a request failed")
            raise server_error(f"tokenizing failed: {type(e).__name__}") from e

    def run(
        self, incoming: list[Incoming], items: list[Item], deadline: Deadline | None = None
    ) -> tuple[list[Incoming], list[np.ndarray | None], BatchStats]:
        """Outputs for every item (None where its request failed), in item order; redone per request on failure;
        a request whose rows did not all run before `deadline` gets its 503 (`out_of_time`)."""
        if not items:
            return incoming, [], BatchStats(batches=0)
        pad_id = self.tokenizer.pad_id
        try:
            computed = compute(items, self.plan, self.task, pad_id, deadline)
            return (*out_of_time(incoming, items, list(computed.outputs), self.response_timeout), computed.stats)
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
        return (*out_of_time(out, items, outputs, self.response_timeout), stats)


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
