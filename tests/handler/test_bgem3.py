"""BGE-M3 in process: every answer's dense, sparse (lexical weights) and ColBERT outputs equal FlagEmbedding 1.4's
`BGEM3FlagModel.encode(return_dense, return_sparse, return_colbert_vecs)` for tiny random folders laid out as
BAAI/bge-m3 (the same ids, every value within 1e-5): on every engine, every strategy, texts of mixed lengths (some cut
at max_length) split over requests planned together, whatever the batch. FlagEmbedding runs in its own venv
(`make flag-venv`; these tests skip without it). Each wire format answers what it carries (our JSON and KServe v1
any subset, KServe v2 a tensor per output, TEI's /embed, /embed_sparse and /embed_all one each, OpenAI dense) and
refuses the rest in one line."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from model_store.archives import detect_task, engine_model_dir, left_out, model_files
from tests.bgem3_folder import FLAG_PYTHON, HIDDEN, build_bgem3, reference
from tests.handler.test_handler import count_forward_rows, make_handler, mixed_texts, serve, serve_at

TOLERANCE = 1e-5
MAX_LENGTH = 48
ALL = ["dense", "sparse", "colbert"]
# repeated tokens (a weight per id: its largest), an id outside the vocabulary (<unk>: dropped), one token, and
# texts over MAX_LENGTH (cut)
SPECIAL_TEXTS = [
    "short queries and long documents served together",
    "x",
    "caf\u00e9 \U0001f600 \u6f22\u5b57 \u03a9 \u00ff",
]
FOLDERS = {"m3": HIDDEN, "narrow": 16}  # name: its ColBERT size (FlagEmbedding's colbert_dim)
FIGURES: dict[str, float] = {}  # the largest difference seen per engine and output, printed at the end (-s)


def texts_for(seed: int) -> list[str]:
    return SPECIAL_TEXTS + mixed_texts(7, seed=seed)


@pytest.fixture(scope="module")
def flag() -> None:
    if not (FLAG_PYTHON.parent.parent / ".installed").exists():
        pytest.skip("FlagEmbedding's venv is missing: run `make flag-venv` (CI does)")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("bgem3")
    return {
        name: build_bgem3(root / name, colbert_dim=dim, seed=len(name), sentence_transformers=name == "m3")
        for name, dim in FOLDERS.items()
    }


@pytest.fixture(scope="module")
def expected(flag, folders):
    """FlagEmbedding's outputs for each folder's texts (one subprocess per folder and setting)."""
    texts = texts_for(seed=5)
    out = {name: reference(folders[name], texts, MAX_LENGTH, FOLDERS[name]) for name in FOLDERS}
    out["m3-cut"] = reference(folders["m3"], texts, MAX_LENGTH, truncate_dim=8)
    out["m3-raw"] = reference(folders["m3"], texts, MAX_LENGTH, normalize_embeddings=False)
    return texts, out


def handler_for(folder, engine, tmp_path, **section):
    model_dir = engine_model_dir(folder, engine, "bgem3", tmp_path / f"{engine}-{folder.name}")
    return make_handler(model_dir, task="bgem3", engine=engine, max_length=MAX_LENGTH, **section)


def differences(got: list[dict[str, Any]], want: dict[str, Any]) -> dict[str, float]:
    """The largest difference per output between our answers and FlagEmbedding's; an AssertionError where an answer
    holds other ids or another number of vectors."""
    out = {"dense": 0.0, "sparse": 0.0, "colbert": 0.0}
    for i, answer in enumerate(got):
        assert answer["tokens"] == want["tokens"][i], i
        if "embedding" in answer:
            out["dense"] = max(out["dense"], float(np.abs(np.asarray(answer["embedding"]) - want["dense"][i]).max()))
        if "sparse" in answer:
            sparse = answer["sparse"]
            theirs = {int(k): v for k, v in want["sparse"][i].items()}
            assert sparse["indices"] == sorted(theirs), (i, sparse["indices"], sorted(theirs))
            diff = max((abs(v - theirs[k]) for k, v in zip(sparse["indices"], sparse["values"])), default=0.0)
            out["sparse"] = max(out["sparse"], diff)
        if "colbert" in answer:
            vectors, reference = np.asarray(answer["colbert"]), np.asarray(want["colbert"][i])
            assert vectors.shape == reference.shape, (i, vectors.shape, reference.shape)
            out["colbert"] = max(out["colbert"], float(np.abs(vectors - reference).max()))
    return out


def check(got: list[dict[str, Any]], want: dict[str, Any], label: str) -> None:
    diffs = differences(got, want)
    for output, diff in diffs.items():
        key = f"{label} {output}"
        FIGURES[key] = max(FIGURES.get(key, 0.0), diff)
    assert max(diffs.values()) <= TOLERANCE, diffs


def first(want: dict[str, Any], n: int) -> dict[str, Any]:
    """FlagEmbedding's outputs for the first `n` texts."""
    return {k: v[:n] for k, v in want.items() if isinstance(v, list)}


def served(handler, context, texts, size: int = 3, **options) -> list[dict[str, Any]]:
    """The texts in requests of `size`, one delivered batch, all three outputs asked (unless `options` say)."""
    body = {"outputs": ALL, **options}
    rows = [{"body": {"texts": texts[i : i + size], **body}} for i in range(0, len(texts), size)]
    answers = serve(handler, context, rows)
    assert all(status == 200 for status, _ in answers), answers
    return [a for _, part in answers for a in part]


@pytest.mark.parametrize("engine", ["torch", "onnxruntime", "openvino"])
@pytest.mark.parametrize("name", list(FOLDERS))
def test_every_output_equals_flagembedding_on_every_engine(folders, expected, name, engine, tmp_path):
    texts, want = expected
    handler, context = handler_for(folders[name], engine, tmp_path)
    check(served(handler, context, texts), want[name], engine)


@pytest.mark.parametrize("strategy", ["dynamic", "static"])
def test_other_strategies_answer_the_same(folders, expected, strategy, tmp_path):
    texts, want = expected
    handler, context = handler_for(folders["m3"], "torch", tmp_path, strategy=strategy)
    check(served(handler, context, texts, size=4), want["m3"], "torch")


def test_an_answer_does_not_depend_on_its_batch(folders, expected, tmp_path):
    texts, want = expected
    handler, context = handler_for(folders["narrow"], "torch", tmp_path, max_batch_tokens=96)
    for size in (1, 3, len(texts)):
        check(served(handler, context, texts, size=size), want["narrow"], "torch")


def test_dimensions_and_normalize_as_truncate_dim_and_normalize_embeddings(folders, expected, tmp_path):
    """A request's `dimensions` cuts the dense and ColBERT vectors before normalising them (FlagEmbedding's
    truncate_dim); `normalize: false` answers them as the model computes them (normalize_embeddings=False)."""
    texts, want = expected
    handler, context = handler_for(folders["m3"], "torch", tmp_path)
    check(served(handler, context, texts, dimensions=8), want["m3-cut"], "torch")
    check(served(handler, context, texts, normalize=False), want["m3-raw"], "torch")


def test_outputs_default_to_dense_and_answer_any_subset_in_order(folders, expected, tmp_path):
    texts, want = expected
    handler, context = handler_for(folders["m3"], "torch", tmp_path)
    ((status, body),) = serve(handler, context, [{"body": {"text": texts[0]}}])
    assert status == 200 and list(body) == ["embedding", "tokens", "truncated"]
    check([body], first(want["m3"], 1), "torch")
    ((status, body),) = serve(handler, context, [{"body": {"texts": texts[:2], "outputs": ["colbert", "sparse"]}}])
    assert status == 200 and [list(a) for a in body] == [["colbert", "sparse", "tokens", "truncated"]] * 2
    ((status, body),) = serve(
        handler, context, [{"body": {"text": texts[0], "outputs": ["sparse"], "sparse_tokens": True}}]
    )
    named = want["m3"]["sparse_tokens"][0]
    assert status == 200 and dict(zip(body["sparse"]["tokens"], body["sparse"]["values"])).keys() == named.keys()


def test_a_row_keeps_only_the_outputs_its_request_renders(folders, expected, tmp_path):
    """Every pass computes all three outputs; right after it each row keeps what its request renders (a request of
    2,048 texts asking dense alone held every pass's packed output until it was answered: +1.7 GB,
    bench.probes.memory): the native `outputs` (dense by default), TEI's /embed_sparse its lexical weights,
    /embed_all its ColBERT vectors; and each still answers as FlagEmbedding."""
    texts, want = expected
    handler, context = handler_for(folders["m3"], "torch", tmp_path)
    task = handler.worker.task
    made: list[Any] = []
    forward = task.forward

    def spy(rows):
        made.extend(forward(rows))
        return made[-len(rows.ids) :]

    task.forward = spy

    def kept() -> set[str]:
        kinds = {("sparse", bool(len(r.weights))) for r in made} | {("colbert", bool(len(r.colbert))) for r in made}
        made.clear()
        return {name for name, held in kinds if held}

    ((status, body),) = serve(handler, context, [{"body": {"texts": texts[:3]}}])
    assert status == 200 and kept() == set()
    check(body, first(want["m3"], 3), "dense alone")
    ((status, body),) = serve(handler, context, [{"body": {"texts": texts[:3], "outputs": ["colbert"]}}])
    assert status == 200 and kept() == {"colbert"}
    ((status, body),) = serve_at(handler, context, [{"inputs": texts[:3]}], ["embed_sparse"])
    assert status == 200 and kept() == {"sparse"}
    assert [{d["index"]: d["value"] for d in row} for row in body] == [
        pytest.approx({int(k): v for k, v in row.items()}, abs=1e-5) for row in want["m3"]["sparse"][:3]
    ]
    ((status, body),) = serve_at(handler, context, [{"inputs": texts[:3]}], ["embed_all"])
    assert status == 200 and kept() == {"colbert"}
    assert max(np.abs(np.array(got) - np.array(ref)).max() for got, ref in zip(body, want["m3"]["colbert"])) <= 1e-5


def test_the_lexical_weights_drop_special_and_unknown_tokens(folders, expected, tmp_path):
    texts, _ = expected
    handler, context = handler_for(folders["m3"], "torch", tmp_path)
    ((status, body),) = serve(handler, context, [{"body": {"text": texts[2], "outputs": ["sparse"]}}])
    assert status == 200 and not {0, 1, 2, 3} & set(body["sparse"]["indices"])  # <s>, <pad>, </s>, <unk>
    assert all(v > 0 for v in body["sparse"]["values"])


def test_each_wire_format_answers_what_it_carries(folders, expected, tmp_path):
    texts, want = expected
    m3 = want["m3"]
    handler, context = handler_for(folders["m3"], "torch", tmp_path)
    few = texts[:4]
    rows = [
        {"inputs": few},  # TEI /embed
        {"inputs": few},  # TEI /embed_sparse
        {"inputs": few},  # TEI /embed_all
        {"input": few},  # OpenAI
        {"instances": few, "parameters": {"outputs": ALL}},  # KServe v1
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [4], "data": few}], "parameters": {"outputs": ALL}},
    ]
    paths = ["embed", "embed_sparse", "embed_all", "v1/embeddings", "", ""]
    answers = serve_at(handler, context, rows, paths)
    assert [status for status, _ in answers] == [200] * len(rows), answers
    (_, dense), (_, sparse), (_, colbert), (_, openai), (_, v1), (_, v2) = answers
    cut = first(m3, 4)
    check([{"embedding": e, "tokens": t, "truncated": False} for e, t in zip(dense, cut["tokens"])], cut, "torch")
    as_native = [{"indices": [p["index"] for p in a], "values": [p["value"] for p in a]} for a in sparse]
    check([{"sparse": s, "tokens": t, "truncated": False} for s, t in zip(as_native, cut["tokens"])], cut, "torch")
    check([{"colbert": c, "tokens": t, "truncated": False} for c, t in zip(colbert, cut["tokens"])], cut, "torch")
    openai_dense = [d["embedding"] for d in openai["data"]]
    check(
        [{"embedding": e, "tokens": t, "truncated": False} for e, t in zip(openai_dense, cut["tokens"])], cut, "torch"
    )
    check(v1["predictions"], cut, "torch")
    tensors = {t["name"]: t for t in v2["outputs"]}
    assert list(tensors) == [
        "embedding",
        "sparse_indices",
        "sparse_values",
        "sparse_lengths",
        "colbert",
        "colbert_lengths",
        "tokens",
        "truncated",
    ]
    assert tensors["colbert"]["shape"] == [sum(t - 1 for t in cut["tokens"]), HIDDEN]
    check(from_v2(tensors), cut, "torch")


def from_v2(tensors: dict[str, Any]) -> list[dict[str, Any]]:
    """KServe v2's tensors back to one answer per input (a ragged output split by its lengths)."""
    n = tensors["tokens"]["shape"][0]
    out: list[dict[str, Any]] = [{"tokens": tensors["tokens"]["data"][i], "truncated": False} for i in range(n)]
    if "embedding" in tensors:
        dense = np.asarray(tensors["embedding"]["data"]).reshape(tensors["embedding"]["shape"])
        for i in range(n):
            out[i]["embedding"] = dense[i].tolist()
    if "sparse_lengths" in tensors:
        ends = np.cumsum(tensors["sparse_lengths"]["data"])
        for i in range(n):
            part = slice(ends[i - 1] if i else 0, ends[i])
            out[i]["sparse"] = {
                "indices": tensors["sparse_indices"]["data"][part],
                "values": tensors["sparse_values"]["data"][part],
            }
    if "colbert_lengths" in tensors:
        flat = np.asarray(tensors["colbert"]["data"]).reshape(tensors["colbert"]["shape"])
        ends = np.cumsum(tensors["colbert_lengths"]["data"])
        for i in range(n):
            out[i]["colbert"] = flat[(ends[i - 1] if i else 0) : ends[i]].tolist()
    return out


def test_kserve_v2_named_tensors_ask_their_outputs(folders, expected, tmp_path):
    texts, want = expected
    handler, context = handler_for(folders["narrow"], "torch", tmp_path)
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": texts[:3]}],
        "outputs": [{"name": n} for n in ("colbert_lengths", "colbert", "sparse_values", "sparse_indices", "tokens")],
    }
    ((status, answer),) = serve_at(handler, context, [body], [""])
    assert status == 200, answer
    tensors = {t["name"]: t for t in answer["outputs"]}
    assert list(tensors) == ["colbert_lengths", "colbert", "sparse_values", "sparse_indices", "tokens"]
    tensors["sparse_lengths"] = {"data": [len(want["narrow"]["sparse"][i]) for i in range(3)]}
    check(from_v2(tensors), first(want["narrow"], 3), "torch")


def test_formats_that_cannot_carry_an_output_refuse_it_in_one_line(folders, tmp_path):
    handler, context = handler_for(folders["m3"], "torch", tmp_path)
    rows = [
        {"input": ["a"], "outputs": ["dense", "colbert"]},  # OpenAI: dense only
        {"inputs": ["a"], "outputs": ["sparse"]},  # TEI: one output per route
        {"texts": ["a"], "outputs": ["lexical"]},  # not an output
        {"texts": ["a"], "sparse_tokens": True},  # tokens of an output not asked
        {"texts": ["a"], "on_overflow": "chunk"},
        {"texts": ["a"], "chunking": "late", "spans": "sentences"},
        {"texts": ["a"], "max_active_dims": 4},
    ]
    paths = ["v1/embeddings", "embed", "", "", "", "", ""]
    answers = serve_at(handler, context, rows, paths)
    for (status, body), param in zip(
        answers, ["outputs", "outputs", "outputs", "sparse_tokens", "on_overflow", "chunking", "max_active_dims"]
    ):
        message = json.dumps(body)
        assert status in (400, 422) and "\\n" not in message, body
        assert param in message, body
    assert "embed_all" in json.dumps(answers[0][1]) and "/embed_sparse" in json.dumps(answers[1][1])


def test_a_text_over_max_length_is_cut_or_refused_as_on_overflow_says(folders, expected, tmp_path):
    texts, want = expected
    long = next(i for i, t in enumerate(want["m3"]["tokens"]) if t == MAX_LENGTH)
    handler, context = handler_for(folders["m3"], "torch", tmp_path)
    ((status, body),) = serve(handler, context, [{"body": {"text": texts[long], "outputs": ALL}}])
    assert status == 200 and body["truncated"] and body["tokens"] == MAX_LENGTH
    assert len(body["colbert"]) == MAX_LENGTH - 1
    ((status, body),) = serve(handler, context, [{"body": {"text": texts[long], "on_overflow": "reject"}}])
    assert status == 413, body


def test_colbert_vectors_their_tokens_show_too_large_run_no_pass(folders, tmp_path, monkeypatch):
    """The ColBERT vectors' size is known from the tokens: a request over the response cap is a 413 before any
    pass; the same texts asking the dense vector alone are served."""
    from bucketing.kinds.bgem3.task import BgeM3Task

    handler, context = handler_for(folders["m3"], "torch", tmp_path, max_response_bytes=40000, max_texts_per_request=16)
    ran = count_forward_rows(monkeypatch, BgeM3Task)
    texts = ["x " * 40] * 16
    ((status, body),) = serve(handler, context, [{"body": {"texts": texts, "outputs": ["dense", "colbert"]}}])
    assert status == 413 and body["type"] == "ResponseTooLarge" and ran == [], body
    assert body["message"].startswith("the answer would be at least ") and "over the 40000 bytes" in body["message"]
    ((status, body),) = serve(handler, context, [{"body": {"texts": texts, "outputs": ["dense"]}}])
    assert status == 200 and len(body) == len(texts) and sum(ran) == len(texts)


def test_the_build_detects_the_layout_and_carries_both_heads(folders):
    for folder in folders.values():
        assert detect_task(folder) == "bgem3"
        assert {"sparse_linear.pt", "colbert_linear.pt"} <= set(model_files(folder))
        assert left_out(folder) == ["README.md"]


def test_a_bgem3_folder_served_as_an_embedding_model_is_refused_in_one_line(folders):
    from bucketing.model.head import EngineError

    with pytest.raises(EngineError, match="handler.task bgem3"):
        make_handler(folders["m3"], task="embedding", max_length=MAX_LENGTH)


def test_reduced_dtypes_are_refused_in_one_line(folders):
    from bucketing.model.head import EngineError

    with pytest.raises(EngineError, match="float32 only"):
        make_handler(folders["m3"], task="bgem3", dtype="bfloat16", max_length=MAX_LENGTH)


def test_the_ready_line_names_the_outputs(folders, tmp_path, caplog):
    handler, _ = handler_for(folders["narrow"], "torch", tmp_path)
    line = handler.worker.ready_line()
    assert "dense (32)" in line and "sparse (lexical weights" in line and "colbert (16 per token)" in line


def test_zz_report_the_figures(expected):
    """The largest difference per engine and output seen by the tests above (run with -s to read them)."""
    print("\nBGE-M3 against FlagEmbedding, max abs diff:", json.dumps(FIGURES, indent=1, sort_keys=True))
