"""The sizes that must agree, derived together from one source each: texts per request, the largest answer, and
TorchServe's caps on a request's and a response's bytes.

- `MAX_TEXTS`: texts of one request by default (`handler.max_texts_per_request`): 2,048, OpenAI's own limit, so a
  client that sends OpenAI-sized batches (the OpenAI SDK, LangChain's `OpenAIEmbeddings`) is answered unchanged.
- `answer_bytes`: an upper bound on one answer's bytes (float JSON, the largest wire format: a float32 at its
  longest, 26 characters); base64 and packed answers are smaller and are checked at their real size.
- `RESPONSE_BYTES`: `answer_bytes` of `MAX_TEXTS` embeddings `WIDEST` floats wide (a 1024-wide model: BERT-large,
  bge-large, e5-large), the default of `handler.max_response_bytes` and TorchServe's `max_response_size` in the
  shipped config.properties files (a unit test holds them equal).
- `REQUEST_BYTES`: `MAX_TEXTS` texts of `TEXT_BYTES` each (512 tokens of English at 8 bytes a token, JSON
  escapes included), TorchServe's `max_request_size` in the shipped config.properties files.

`python -m bucketing.sizes` prints the two config.properties lines.
"""

from __future__ import annotations

import sys

MAX_TEXTS = 2048  # OpenAI's limit on the inputs of one embeddings request
WIDEST = 1024  # the widest embedding whose MAX_TEXTS float answers fit RESPONSE_BYTES
FLOAT_CHARS = 26  # the longest float32 as JSON writes it ("-1.2345678901234567e-05"), and ", "
ANSWER_OVERHEAD = 200  # field names, token count, OpenAI's per-embedding object, per input
TEXT_BYTES = 4096  # a typical long text in a request body: 512 tokens at 8 bytes (JSON escapes included)
REQUEST_OVERHEAD = 65536  # the body's own fields (model, options) and headers
# The most padded tokens one pass of `dynamic` or `static` holds (they pad the delivered batch as one pass up to
# this; more is cut into passes in arrival order): 16 requests x 32 texts x 256 tokens, about 2 GB of a worker's
# memory for MiniLM (docs/operations/overload.md, "Memory").
UNSPLIT_TOKENS = 16 * 32 * 256


def answer_bytes(texts: int, per_input: int) -> int:
    """An upper bound on the bytes of an answer to `texts` inputs of `per_input` bytes of values each."""
    return texts * (per_input + ANSWER_OVERHEAD) + ANSWER_OVERHEAD


def embeddings_bytes(texts: int, dimensions: int) -> int:
    """An upper bound on the bytes of `texts` float embeddings of `dimensions`, as JSON."""
    return answer_bytes(texts, dimensions * FLOAT_CHARS)


def texts_that_fit(max_bytes: int, dimensions: int) -> int:
    """The most float embeddings of `dimensions` whose answer fits `max_bytes`."""
    return max(0, (max_bytes - ANSWER_OVERHEAD) // (dimensions * FLOAT_CHARS + ANSWER_OVERHEAD))


RESPONSE_BYTES = embeddings_bytes(MAX_TEXTS, WIDEST)  # 54,935,752: about 52 MiB
REQUEST_BYTES = MAX_TEXTS * TEXT_BYTES + REQUEST_OVERHEAD  # 8,454,144: about 8 MiB


def torchserve_properties() -> dict[str, str]:
    """TorchServe's caps, as config.properties states them."""
    return {"max_request_size": str(REQUEST_BYTES), "max_response_size": str(RESPONSE_BYTES)}


if __name__ == "__main__":
    sys.stdout.write("".join(f"{k}={v}\n" for k, v in torchserve_properties().items()))
