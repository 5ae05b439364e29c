"""What answering costs a worker per text, by format: rendering and encoding one request's answers, and their bytes.

`python -m bench.probes.answer_cost [--texts 16] [--repeat 200]`: a request of `--texts` MiniLM-sized (384-float, unit
length) embeddings answered through the real wire formats (`protocols.Incoming.reply`, as a worker answers), best
of `--repeat`, per text; beside each, the same rendered body through `json.dumps` (how every answer was encoded
before `protocols.base.dumps`), with its parsed values checked equal. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from bucketing.answers import Answer, Options
from bucketing.protocols import Incoming, cohere_embed, native, openai
from bucketing.protocols.base import Binary, Request, Wire, dumps

DIMENSIONS = 384  # MiniLM's embedding size


@dataclass(frozen=True)
class Format:
    """One way an answer is asked for: its wire format and the request as parsed."""

    name: str
    wire: Wire
    request: Callable[[tuple[str, ...]], Request]


FORMATS = (
    Format("ours, float JSON", native.WIRE, lambda t: native.TextRequest(t, False)),
    Format("OpenAI, float", openai.WIRE, lambda t: openai.EmbeddingsRequest(t)),
    Format("OpenAI, base64", openai.WIRE, lambda t: openai.EmbeddingsRequest(t, encoding_format="base64")),
    Format("ours, binary", native.WIRE, lambda t: native.TextRequest(t, False, Options(precision="binary"))),
    Format("Cohere, binary", cohere_embed.WIRE, lambda t: cohere_embed.CohereEmbedRequest(t, ("binary",))),
)


@dataclass(frozen=True)
class Cost:
    """One format's answer per text: bytes, and microseconds to render and encode (ours, then json.dumps')."""

    name: str
    bytes_per_text: float
    us_per_text: float
    json_us_per_text: float | None  # the same body through json.dumps (None: a binary body, not JSON)


def answers(n: int, seed: int = 0) -> list[Answer]:
    """`n` unit-length float32 embeddings, as a normalised MiniLM answers them."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, DIMENSIONS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [Answer(v, 12, False, None, "identity", False) for v in vectors]


def best_us(run: Callable[[], object], repeat: int) -> float:
    """The fastest of `repeat` runs, in microseconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def encoded_by_json(request: Request, given: list[Answer]) -> str:
    """The answer rendered and encoded as before `protocols.base.dumps`: json.dumps."""
    return json.dumps(request.render(given, "minilm"))


def measure(formats: tuple[Format, ...] = FORMATS, n: int = 16, repeat: int = 200) -> list[Cost]:
    """Each format's cost per text for one request of `n` answers."""
    given = answers(n)
    texts = tuple(f"text {i}" for i in range(n))
    costs = []
    for f in formats:
        incoming = Incoming(f.wire, f.request(texts))
        reply = incoming.reply(given, "minilm", 1 << 30)
        if reply.status != 200:
            raise RuntimeError(f"{f.name}: answered {reply.status}: {reply.body!r}")
        ours = best_us(partial(incoming.reply, given, "minilm", 1 << 30), repeat)
        request = f.request(texts)
        rendered = request.render(given, "minilm")
        before = None
        if not isinstance(rendered, Binary):
            if json.loads(dumps(rendered)) != json.loads(json.dumps(rendered)):
                raise RuntimeError(f"{f.name}: the encoded answer parses to other values than json.dumps'")
            before = best_us(partial(encoded_by_json, request, given), repeat) / n
        costs.append(Cost(f.name, len(reply.body) / n, ours / n, before))
    return costs


def table(costs: list[Cost]) -> str:
    """The costs as a markdown table, bytes as a share of float JSON's."""
    base = costs[0].bytes_per_text
    lines = [
        "| format | bytes/text | x fewer than float JSON | us/text (ours) | us/text (json.dumps) | cheaper |",
        "|---|---|---|---|---|---|",
    ]
    for c in costs:
        before = f"{c.json_us_per_text:.1f}" if c.json_us_per_text is not None else "n/a"
        ratio = f"{c.json_us_per_text / c.us_per_text:.1f}x" if c.json_us_per_text is not None else "n/a"
        lines.append(
            f"| {c.name} | {c.bytes_per_text:.0f} | {base / c.bytes_per_text:.1f} | {c.us_per_text:.1f} | "
            f"{before} | {ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--texts", type=int, default=16, help="answers per request (default 16)")
    parser.add_argument("--repeat", type=int, default=200, help="runs of each, the best kept (default 200)")
    args = parser.parse_args(argv)
    print(table(measure(FORMATS, args.texts, args.repeat)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
