"""What the wire-format tests (`test_protocols_*.py`) share: a request as `protocols.parse` sees it, limits, an
answer, a KServe v2 body, the error a parser's helper raises."""

from __future__ import annotations

import numpy as np
import pytest

from bucketing import protocols
from bucketing.answers import Answer
from bucketing.protocols.base import Limits, Meta, RequestError

JSON = "application/json"
LIMITS = Limits(max_texts=4, max_length=16, vocab_size=1000, task="embedding", dimensions=4)
CLASSIFIER = Limits(4, 16, 1000, "classification", 1)


def incoming(body, content_type=None, url_path=None, limits=LIMITS, row=None, headers=None):
    meta = Meta(content_type, url_path, headers or {})
    return protocols.parse(row if row is not None else {"body": body}, meta, limits)


def parse(body, content_type=None, max_texts=4):
    return incoming(body, content_type, limits=Limits(max_texts, 16, 1000, "embedding", 4)).outcome


def raised(function, *args, **kwargs) -> RequestError:
    """The request error a call raises (the test fails if it raises none)."""
    with pytest.raises(RequestError) as caught:
        function(*args, **kwargs)
    return caught.value


def answer(values, tokens=3, truncated=False, labels=None, activation="identity", normalize=False):
    """An answer whose values are answered as given (identity activation, no normalisation, unless told)."""
    return Answer(np.asarray(values, dtype=np.float32), tokens, truncated, labels, activation, normalize)


def v2(data, shape=None, datatype="BYTES", **extra):
    tensor = {"name": "text", "datatype": datatype, "shape": shape if shape is not None else [len(data)], "data": data}
    return {"inputs": [tensor], **extra}
