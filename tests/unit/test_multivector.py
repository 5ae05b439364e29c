"""Multi-vector models' pure parts: reading a MultiVectorEncoder folder's files (and refusing what is not served,
token pooling first), where each input type cuts its texts, which tokens are kept, how a text is recut and expanded,
the answer's shape, `input_type` in our native format, and the multi-vector refusal of the other wire formats."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bucketing.answers import Options
from bucketing.kinds.multivector.folder import Expansion, MultiVectorSpec, is_multivector, read_multivector
from bucketing.kinds.multivector.task import Keep, MultiVectorAnswer
from bucketing.model.chain import Chain, ChainError
from bucketing.model.encoded import Encoded, recut
from bucketing.model_kinds import answer_fields
from bucketing.protocols import parse
from bucketing.protocols.base import Limits, Meta, RequestError, dumps

ST = "sentence_transformers."
TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": ST + "base.modules.transformer.Transformer"}
MASK = {"idx": 1, "name": "1", "path": "1_Mask", "type": ST + "multi_vector_encoder.modules.MultiVectorMask"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": ST + "base.modules.normalize.Normalize"}


def folder(tmp_path: Path, modules=(TRANSFORMER, MASK, NORMALIZE), bert=None, mask=None, st_config=None) -> Path:
    """A MultiVectorEncoder folder's sentence-transformers files alone (no weights: reading them is pure)."""
    (tmp_path / "modules.json").write_text(json.dumps(list(modules)))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps(bert or {}))
    (tmp_path / "1_Mask").mkdir(exist_ok=True)
    (tmp_path / "1_Mask" / "config.json").write_text(json.dumps(mask or {"skiplist_words": [",", "."]}))
    (tmp_path / "2_Normalize").mkdir(exist_ok=True)
    config = {"model_type": "MultiVectorEncoder", "prompts": {"query": "[Q] ", "document": "[D] "}}
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps(st_config or config))
    return tmp_path


def test_a_saved_folder_is_read(tmp_path):
    bert = {
        "query_length": 32,
        "document_length": 180,
        "query_expansion": {"strategy": "fixed", "attend": False, "token": None, "length": 32},
    }
    spec = read_multivector(folder(tmp_path, bert=bert))
    assert is_multivector(tmp_path)
    assert (spec.query_length, spec.document_length) == (32, 180)
    assert spec.expansion == Expansion("fixed", False, None, 32)
    assert spec.skiplist_words == (",", ".") and spec.skiplist_tasks == ("document",)
    assert spec.chain.normalize is True and dict(spec.chain.prompts) == {"query": "[Q] ", "document": "[D] "}


@pytest.mark.parametrize(
    "change, words",
    [
        (
            {
                "modules": (
                    TRANSFORMER,
                    MASK,
                    {**NORMALIZE, "type": ST + "multi_vector_encoder.modules.HierarchicalTokenPooling"},
                )
            },
            "token pooling is not served",
        ),
        (
            {"modules": (TRANSFORMER, MASK, {**NORMALIZE, "type": "my.LambdaTokenPooling"})},
            "token pooling is not served",
        ),
        ({"modules": (TRANSFORMER, {**MASK, "type": ST + "sentence_transformer.modules.Pooling"})}, "is not served"),
        ({"modules": (TRANSFORMER, NORMALIZE)}, "one MultiVectorMask"),
        ({"modules": (TRANSFORMER, NORMALIZE, MASK)}, "Normalize must be the last module"),
        ({"st_config": {"model_type": "MultiVectorEncoder", "query_prefix": "[Q]"}}, "PyLate/Stanford-NLP"),
        ({"bert": {"transformer_task": "retrieval"}}, "transformer_task"),
        ({"bert": {"query_expansion": {"strategy": "grow", "length": 8}}}, "query_expansion"),
        ({"bert": {"query_length": 8, "query_expansion": {"strategy": "min", "length": 16}}}, "below"),
        ({"mask": {"skiplist_words": "abc"}}, "skiplist_words"),
    ],
)
def test_what_is_not_served_is_refused_in_one_line(tmp_path, change, words):
    with pytest.raises(ChainError, match=words) as e:
        read_multivector(folder(tmp_path, **change))
    assert "\n" not in str(e.value)


def test_a_dense_folder_is_not_multi_vector(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps([TRANSFORMER]))
    assert not is_multivector(tmp_path)


EXPAND = Expansion("fixed", False, None, 16)


@pytest.mark.parametrize(
    "spec, input_type, ceiling, cut",
    [
        (MultiVectorSpec(Chain(), 24, 100, None), "query", 64, 24),
        (MultiVectorSpec(Chain(), 24, 100, None), "document", 64, 64),
        (MultiVectorSpec(Chain(), 24, 40, None), "document", 64, 40),
        (MultiVectorSpec(Chain(), 24, 40, None), None, 64, 64),
        (MultiVectorSpec(Chain(), None, None, EXPAND), "query", 64, 16),  # fixed: the expansion length
        (MultiVectorSpec(Chain(), 32, None, EXPAND), "query", 64, 16),
        (MultiVectorSpec(Chain(), None, None, Expansion("min", True, None, 16)), "query", 64, 64),
        (MultiVectorSpec(Chain(), 24, None, Expansion("min", True, None, 16)), "query", 64, 24),
    ],
)
def test_where_each_input_type_cuts_its_texts(spec, input_type, ceiling, cut):
    assert spec.cut(input_type, ceiling) == cut


def test_which_tokens_are_kept():
    keep = Keep(frozenset({5}), ("document",), None)
    ids = (1, 5, 7, 5, 2)
    assert keep.positions(ids, None) == [0, 2, 4]  # no input type counts as a document
    assert keep.positions(ids, "document") == [0, 2, 4]
    assert keep.positions(ids, "query") == [0, 1, 2, 3, 4]
    only = Keep(frozenset(), ("document",), frozenset({7}))
    assert only.positions(ids, "document") == [2] and only.positions(ids, "query") == [0, 1, 2, 3, 4]


@given(body=st.lists(st.integers(3, 50), max_size=30), length=st.integers(2, 40), left=st.booleans())
def test_recut_keeps_the_special_tokens_and_cuts_the_text(body, length, left):
    encoded = Encoded((1, *body, 2), False)
    got = recut(encoded, length, (1, 1), left)
    if len(body) + 2 <= length:
        assert got == encoded
    else:
        room = length - 2
        assert got.ids == (1, *(body[len(body) - room :] if left else body[:room]), 2) and got.truncated


def test_the_answer_keeps_tokens_by_input_type_and_normalises_each():
    values = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    answer = MultiVectorAnswer(values, 3, False, normalize=True, ids=(1, 5, 2), keep=Keep(frozenset({5})))
    assert json.loads(dumps(answer.fields(Options(input_type="document")))) == {  # as a JSON answer writes it
        "embeddings": [[0.6000000238418579, 0.800000011920929], [0.0, 1.0]],
        "tokens": 3,
        "truncated": False,
    }
    assert len(answer.fields(Options(input_type="query"))["embeddings"]) == 3
    assert answer.vectors(Options(normalize=False, dimensions=1)).tolist() == [[3.0], [0.0]]
    assert tuple(answer.fields()) == answer_fields("multivector")


LIMITS = Limits(max_texts=4, max_length=16, vocab_size=1000, task="multivector", dimensions=4)


def test_input_type_is_read_and_checked_in_our_format():
    request = parse({"body": {"texts": ["a"], "input_type": "query"}}, Meta("application/json"), LIMITS).outcome
    assert not isinstance(request, RequestError) and request.options.input_type == "query"
    for bad in ("passage", 1, ["query"]):
        error = parse({"body": {"text": "a", "input_type": bad}}, Meta("application/json"), LIMITS).outcome
        assert isinstance(error, RequestError) and error.status == 400 and error.param == "input_type"


def test_input_type_picks_the_models_prompt_as_encode_query_does():
    limits = Limits(4, 16, 1000, "multivector", 4, prompts=(("query", "[Q] "),), default_prompt="query")
    options = [
        parse({"body": {"text": "a", **extra}}, Meta("application/json"), limits).outcome.options  # type: ignore[union-attr]
        for extra in (
            {},
            {"input_type": "query"},
            {"input_type": "document"},
            {"input_type": "document", "prompt": "p "},
        )
    ]
    assert [o.prompt for o in options] == ["[Q] ", "[Q] ", "", "p "]


@pytest.mark.parametrize(
    "body, path",
    [
        ({"input": "a", "model": "m"}, "v1/embeddings"),
        ({"instances": ["a"]}, ""),
        ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}, ""),
        ({"inputs": "a"}, "embed"),
        ({"inputs": "a"}, ""),
    ],
)
def test_other_wire_formats_refuse_a_multi_vector_model(body, path):
    error = parse({"body": body}, Meta("application/json", path), LIMITS).outcome
    assert isinstance(error, RequestError) and error.status == 400
    assert "multi-vector" in error.message and "embed_all" in error.message and "\n" not in error.message
