"""Every refusal that names the loaded model's kind names it as the kinds' declaration does, article included:
"an embedding model", "a classification model", "a sparse model" (SPLADE and CSR alike), "a multi-vector model"."""

from __future__ import annotations

import re

import pytest

from bucketing import protocols
from bucketing.model_kinds import MODEL_KINDS
from bucketing.protocols.base import Limits, RequestError
from tests.unit.wire import incoming

NAMED = {
    "embedding": "an embedding model",
    "classification": "a classification model",
    "sparse": "a sparse model",
    "multivector": "a multi-vector model",
    "bgem3": "a BGE-M3 model",
}
BODIES = [
    {"inputs": ["a"]},
    {"input": "a", "model": "m"},
    {"query": "q", "texts": ["a"]},
    {"query": "q", "documents": ["a"]},
    {"inputs": {"source_sentence": "a", "sentences": ["b"]}},
    {"pairs": [["a", "b"]]},
    {"text": "a", "max_active_dims": 3},
]
WRONG_ARTICLE = re.compile(r"\ba [aeiou][\w-]* model\b|\ban [^aeiou\W][\w-]* model\b", re.IGNORECASE)


def refusals(kind: str) -> set[str]:
    """Every route's refusal lines, and the engine refusal's."""
    limits = Limits(4, 16, 1000, kind, 3)
    lines = set()
    for path in protocols.ROUTES:
        for body in BODIES:
            outcome = incoming(body, "application/json", url_path=path, limits=limits).outcome
            if isinstance(outcome, RequestError):
                lines.add(outcome.message)
    for setting, dtype in (("--dtype", "float16"), ("handler.dtype", "bfloat16")):
        line = MODEL_KINDS[kind].refused("openvino", dtype, setting)
        if line:
            lines.add(line)
    return lines


@pytest.mark.parametrize("kind", sorted(MODEL_KINDS))
def test_every_refusal_names_the_kind_as_declared(kind):
    lines = refusals(kind)
    saying_what = [line for line in lines if re.search(r"this (model )?is ", line)]
    assert saying_what
    for line in saying_what:
        assert NAMED[kind] in line, line
    for line in lines:
        assert not WRONG_ARTICLE.search(line), line
        assert not re.search(r"model has an? [\w-]+ model", line), line
        assert "SPLADE)" not in line and "multivector model" not in line, line


def test_each_kind_is_named_from_its_title():
    assert {name: kind.a_model for name, kind in MODEL_KINDS.items()} == NAMED
