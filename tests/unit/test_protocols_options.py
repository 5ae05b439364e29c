"""Request options in every wire format: prompts (by name, given, the model's default), their mistakes as 400s
saying what is wrong, a lone surrogate in a query or prompt."""

from __future__ import annotations

import pytest

from bucketing.protocols.base import Limits, RequestError
from tests.unit.wire import CLASSIFIER, JSON, incoming

PROMPTED = Limits(4, 16, 1000, "embedding", 4, prompts=(("query", "query: "), ("doc", "")), default_prompt="query")


@pytest.mark.parametrize(
    ("body", "url_path", "prompt"),
    [
        ({"text": "a"}, None, "query: "),  # the model's default prompt
        ({"text": "a", "prompt_name": "doc"}, None, ""),
        ({"text": "a", "prompt": "custom: "}, None, "custom: "),
        ({"input": "a", "prompt_name": "doc"}, "v1/embeddings", ""),  # OpenAI: an extra field
        ({"input": ["a"]}, "v1/embeddings", "query: "),
        (
            {
                "inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
                "parameters": {"prompt": "p: "},
            },
            None,
            "p: ",
        ),  # KServe v2: in parameters
        ({"instances": ["a"]}, None, "query: "),  # KServe v1: no parameters, the default
    ],
)
def test_every_wire_format_picks_a_prompt(body, url_path, prompt):
    request = incoming(body, JSON, url_path=url_path, limits=PROMPTED).outcome
    assert not isinstance(request, RequestError), request
    assert request.options.prompt == prompt


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            {"text": "a", "prompt_name": "nope"},
            "\"prompt_name\" 'nope' is not a prompt of this model; its prompts: 'query', 'doc', 'document'",
        ),
        ({"text": "a", "prompt_name": "doc", "prompt": "x"}, 'send "prompt_name" or "prompt", not both'),
        ({"text": "a", "normalize": "yes"}, '"normalize" must be true or false, got string'),
        ({"text": "a", "dimensions": 5}, '"dimensions" must be an integer from 1 to 4'),
        ({"text": "a", "prompt": 3}, '"prompt" must be a string of at most 4096 characters'),
    ],
)
def test_option_mistakes_are_400s_saying_what_is_wrong(body, words):
    error = incoming(body, JSON, limits=PROMPTED).outcome
    assert isinstance(error, RequestError) and error.status == 400 and words in error.message


def test_a_classifier_without_prompts_says_so():
    error = incoming({"texts": ["a"], "prompt_name": "query"}, JSON, limits=CLASSIFIER).outcome
    assert error.message.endswith("its prompts: none (this model has no prompts)")


@pytest.mark.parametrize("role", ["query", "document"])
def test_an_encoder_always_has_a_query_and_a_document_prompt(role):
    """As sentence-transformers' encoders: empty unless the model sets them, so naming one is never a 400."""
    request = incoming({"text": "a", "prompt_name": role}, JSON).outcome
    assert not isinstance(request, RequestError), request
    assert request.options.prompt == ""
    error = incoming({"text": "a", "prompt_name": "passage"}, JSON).outcome
    assert error.message.endswith("its prompts: 'query', 'document'")


@pytest.mark.parametrize(
    ("body", "url_path", "limits", "param"),
    [
        ({"query": "q\ud800", "texts": ["a"]}, "rerank", CLASSIFIER, "query"),
        ({"query": "\ud800", "documents": ["a"]}, "v1/rerank", CLASSIFIER, "query"),
        ({"text": "a", "prompt": "p\ud800: "}, None, PROMPTED, "prompt"),
        ({"input": ["a"], "prompt": "\udfff"}, "v1/embeddings", PROMPTED, "prompt"),
        (
            {
                "inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
                "parameters": {"prompt": "\ud800"},
            },
            None,
            PROMPTED,
            "prompt",
        ),
    ],
)
def test_a_lone_surrogate_in_a_query_or_prompt_is_the_clients_400(body, url_path, limits, param):
    """Valid JSON ("\\ud800") that no tokenizer can read: InvalidEncoding, as in a text, never a 500."""
    error = incoming(body, JSON, url_path=url_path, limits=limits).outcome
    assert isinstance(error, RequestError), error
    assert (error.status, error.type, error.param) == (400, "InvalidEncoding", param) and "surrogate" in error.message
