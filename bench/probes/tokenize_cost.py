"""What one long text costs the handler's tokenizer: 6 MB bodies of prose and of the shapes that once cost seconds.

`python -m bench.probes.tokenize_cost [--mb 6] [--repeat 5]`: each body through `Tokenizer.encode` as a worker runs it
(MiniLM, max_length 256), best of `--repeat`, and its cost as a multiple of English prose's; then a rerank body
(a 5.6 KB query, 100 documents of 11 KB: 1.1 MB) through `Tokenizer.encode_pairs`, against its texts alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from bucketing.model.tokenizer import Tokenizer
from model_store.archives import SERVED, minilm_dir

SHAPES = {
    "English prose": "The quick brown fox jumps over the lazy dog. ",
    "Chinese prose (no spaces)": "中文的句子很长，没有空格。",
    "one word a line": "word\n",
    "tab-separated": "word\t",
    "NBSP-separated": "word\u00a0",
    "one word (no boundary)": "a",
}


def bodies(chars: int) -> dict[str, str]:
    """Each shape repeated to `chars` characters."""
    return {name: unit * (chars // len(unit)) for name, unit in SHAPES.items()}


def best_seconds(tokenizer: Tokenizer, text: str, repeat: int) -> float:
    return best_of(lambda: tokenizer.encode([text]), repeat)


def best_of(run: Callable[[], object], repeat: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """The least time of `repeat` runs on `clock` (wall time by default; `pass_cost` passes the CPU clock)."""
    times = []
    for _ in range(repeat):
        start = clock()
        run()
        times.append(clock() - start)
    return min(times)


def rerank_body() -> tuple[str, list[str]]:
    """A long query and 100 long documents of prose (each over max_length tokens)."""
    unit = SHAPES["English prose"]
    return unit * 125, [f"document {i}: " + unit * 250 for i in range(100)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=6.0, help="characters per body, in millions")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--max-length", type=int, default=SERVED.max_length)
    args = parser.parse_args(argv)
    tokenizer = Tokenizer(str(minilm_dir()), args.max_length)
    base = None
    print(f"{'body':28} {'ms':>8} {'x prose':>8}  outcome")
    for name, text in bodies(int(args.mb * 1e6)).items():
        seconds = best_seconds(tokenizer, text, args.repeat)
        base = base or seconds
        (e,) = tokenizer.encode([text])
        outcome = "refused (413 TextTooLong)" if e.unbounded else f"{len(e.ids)} tokens, truncated={e.truncated}"
        print(f"{name:28} {seconds * 1e3:8.1f} {seconds / base:8.1f}  {outcome}")
    query, documents = rerank_body()
    pairs = best_of(lambda: tokenizer.encode_pairs([(query, d) for d in documents]), args.repeat)
    texts = best_of(lambda: tokenizer.encode([query, *documents]), args.repeat)
    size = len(query) + sum(map(len, documents))
    print(f"rerank body, {size} characters: as pairs {pairs * 1e3:.1f} ms, its texts alone {texts * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
