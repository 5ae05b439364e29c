"""Sparse encoders through the handler in process, on tiny random models saved by sentence-transformers 6.2 itself:
every answer has the non-zero ids of `SparseEncoder(dir).encode()`, `encode_query()` or `encode_document()` (the
request's `input_type`) and their values within 1e-5, for SPLADE (max and sum pooling, relu and log1p_relu), a
Router (a static query route, a SPLADE document route) and CSR, on both engines (onnxruntime: the graph an archive
built with --engine onnxruntime carries), in every strategy and batch split, cut to the model's or the request's
max_active_dims; in our format, OpenAI's and TEI's /embed_sparse; and what is refused, in one line."""

from __future__ import annotations

import gc
import json
import shutil
import weakref
from pathlib import Path
from typing import Any, cast

import pytest

from tests.handler.test_handler import make_handler, mixed_texts
from tests.models import build_sparse_encoder

np = pytest.importorskip("numpy")
sentence_transformers = pytest.importorskip("sentence_transformers")

TOLERANCE = 1e-5
MAX_LENGTH = 128
PROMPTS = {"query": "query: ", "document": "passage: "}
VARIANTS: dict[str, dict[str, Any]] = {
    "splade-max": {},
    "splade-sum-log1p": {"pooling": "sum", "activation": "log1p_relu", "prompts": PROMPTS, "max_active_dims": 64},
    "router": {"router": True, "prompts": PROMPTS},
    "router-top": {"router": True, "pooling": "sum", "max_active_dims": 24, "seed": 3},
    "transformer-fill-mask": {"legacy": False, "seed": 4},  # sentence-transformers 6's own way to save SPLADE
}
ENCODE = {None: "encode", "query": "encode_query", "document": "encode_document"}
ENGINES = ("torch", "onnxruntime")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sparse")
    return {name: build_sparse_encoder(root / name, **spec) for name, spec in VARIANTS.items()}


def stage_onnxruntime_archive(folder: Path, stage: Path) -> tuple[Path, dict[str, Any]]:
    """`model_store.build --engine onnxruntime --print-commands` for the folder (its task detected): the archive's
    model folder as staged (the graph exported into it) and its model-config."""
    import yaml

    from model_store import build

    argv = ["--model-dir", str(folder), "--strategies", "bucketed", "--engine", "onnxruntime", "--print-commands"]
    assert build.main([*argv, "--stage-dir", str(stage)]) == 0
    (config,) = stage.glob("*.yaml")
    return stage / "extra" / "model", yaml.safe_load(config.read_text())


@pytest.fixture(scope="module")
def archives(folders, csr_folders, csr_routers, tmp_path_factory):
    """Each folder's onnxruntime archive, staged once per module when first asked."""
    cache: dict[str, tuple[Path, dict[str, Any]]] = {}

    def get(variant):
        if variant not in cache:
            source = {**folders, **csr_folders, **csr_routers}[variant]
            cache[variant] = stage_onnxruntime_archive(source, tmp_path_factory.mktemp(f"onnx-{variant}"))
        return cache[variant]

    return get


def model_dir(folders, archives, variant, engine):
    """The folder an engine serves: the saved one (torch), the staged archive's model folder (onnxruntime)."""
    return folders[variant] if engine == "torch" else archives(variant)[0]


@pytest.fixture(scope="module")
def handlers(folders, archives):
    cache = {}

    def get(variant, strategy="bucketed", engine="torch", **section):
        key = (variant, strategy, engine, tuple(sorted(section.items())))
        if key not in cache:
            cache[key] = make_handler(
                model_dir(folders, archives, variant, engine),
                task="sparse",
                strategy=strategy,
                engine=engine,
                max_length=MAX_LENGTH,
                **section,
            )
        return cache[key]

    return get


def serve_at(handler, context, rows, paths):
    """Rows sent to their url_paths (what follows /predictions/NAME/VERSION/; "" the plain path)."""
    context.with_requests(["application/json"] * len(rows), paths)
    bodies = handler.handle([{"body": row} for row in rows], context)
    return [(context.status[i][0], json.loads(b)) for i, b in enumerate(bodies)]


REFERENCES: dict[Any, Any] = {}


def reference(folder, texts, input_type=None, **kwargs):
    """`SparseEncoder(folder)`'s answers as dense rows (kept for the module: each engine compares with the same)."""
    key = (str(folder), tuple(texts), input_type, tuple(sorted(kwargs.items())))
    if key not in REFERENCES:
        model = sentence_transformers.SparseEncoder(str(folder), device="cpu")
        out = getattr(model, ENCODE[input_type])(texts, convert_to_tensor=True, batch_size=len(texts), **kwargs)
        REFERENCES[key] = out.to_dense().numpy()
    return REFERENCES[key]


def mismatches(got, expected):
    """How many answers differ from sentence-transformers': other non-zero ids, or a value off by over 1e-5."""
    assert len(got) == len(expected)
    bad = 0
    for answer, row in zip(got, expected):
        ids = np.flatnonzero(row)
        if (
            answer["indices"] != ids.tolist()
            or np.max(np.abs(np.array(answer["values"]) - row[ids]), initial=0) > TOLERANCE
        ):
            bad += 1
    return bad


def texts_for(variant, input_type, seed=5):
    """Varied lengths, some over max_length (cut as sentence-transformers cuts them: a static route's at its own
    tokenizer's model_max_length, past max_length)."""
    texts = mixed_texts(9, seed=seed) + ["short", "x"]
    return texts + [LONG] if VARIANTS[variant].get("router") and input_type == "query" else texts


# A static route's text past max_length: SparseStaticEmbedding keeps 128 tokens of it (its prompt's 2, then 126 words,
# "gamma blue" among them), where max_length 128 would keep 124 words
LONG = "word " * 120 + "apple cherry alpha beta gamma blue house river green " * 2


def exactness_cases() -> list[tuple[str, str | None, str, str]]:
    """Every variant, input type and strategy on torch; on onnxruntime each in every strategy too, but the input
    types of a variant that has neither prompts nor a Router (they give its graph the same rows as encode())."""
    return [
        (variant, input_type, strategy, engine)
        for variant, spec in VARIANTS.items()
        for input_type in (None, "query", "document")
        for strategy in ("bucketed", "dynamic", "static")
        for engine in ENGINES
        if engine == "torch" or input_type is None or spec.get("prompts") or spec.get("router")
    ]


@pytest.mark.parametrize(("variant", "input_type", "strategy", "engine"), exactness_cases())
def test_answers_equal_sparse_encoder(folders, handlers, variant, input_type, strategy, engine):
    handler, context = handlers(variant, strategy, engine)
    texts = texts_for(variant, input_type)
    options = {"input_type": input_type} if input_type else {}
    rows = [{"texts": texts[:3], **options}, {"texts": texts[3:], **options}, {"text": texts[-3], **options}]
    answers = serve_at(handler, context, rows, ["", "", ""])
    assert [s for s, _ in answers] == [200, 200, 200], answers
    got = [e["embedding"] for e in answers[0][1] + answers[1][1]] + [answers[2][1]["embedding"]]
    assert mismatches(got, reference(folders[variant], texts + [texts[-3]], input_type)) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_requests_of_different_input_types_share_a_batch(folders, handlers, engine):
    """A Router's query and document rows in one delivered batch (one pass plan) each take their own route."""
    handler, context = handlers("router", engine=engine, max_batch_tokens=256, max_response_bytes=1 << 27)
    queries, documents = texts_for("router", "query", seed=7), texts_for("router", "document", seed=8)
    rows = [
        {"texts": queries, "input_type": "query"},
        {"texts": documents, "input_type": "document"},
        {"texts": documents},
    ]
    (s1, q), (s2, d), (s3, n) = serve_at(handler, context, rows, ["", "", ""])
    assert (s1, s2, s3) == (200, 200, 200)
    folder = folders["router"]
    assert mismatches([a["embedding"] for a in q], reference(folder, queries, "query")) == 0
    assert mismatches([a["embedding"] for a in d], reference(folder, documents, "document")) == 0
    assert mismatches([a["embedding"] for a in n], reference(folder, documents)) == 0


@pytest.mark.parametrize("variant", ["splade-max", "router-top"])
def test_a_request_max_active_dims_cuts_as_encode_does(folders, handlers, variant):
    handler, context = handlers(variant)
    texts = texts_for(variant, "document")
    ((status, body),) = serve_at(handler, context, [{"texts": texts, "max_active_dims": 7}], [""])
    assert status == 200
    got = [a["embedding"] for a in body]
    assert all(len(a["indices"]) <= 7 for a in got)
    assert mismatches(got, reference(folders[variant], texts, max_active_dims=7)) == 0


def test_openai_and_tei_answer_sparse_shapes(folders, handlers):
    handler, context = handlers("splade-sum-log1p")
    texts = texts_for("splade-sum-log1p", "query")
    rows = [
        {"input": texts, "model": "m", "input_type": "query"},
        {"inputs": texts, "prompt_name": "query"},
        {"inputs": texts[0]},
    ]
    ((status, info),) = serve_at(handler, context, [None], ["info"])
    assert status == 200 and info["model_type"] == {"embedding": {"pooling": "splade"}}
    (s1, openai), (s2, tei), (s3, single) = serve_at(
        handler, context, rows, ["v1/embeddings", "embed_sparse", "embed_sparse"]
    )
    assert (s1, s2, s3) == (200, 200, 200)
    expected = reference(folders["splade-sum-log1p"], texts, "query")
    assert mismatches([d["embedding"] for d in openai["data"]], expected) == 0
    as_lists = [{"indices": [p["index"] for p in a], "values": [p["value"] for p in a]} for a in tei]
    assert mismatches(as_lists, expected) == 0
    ((status, v1),) = serve_at(handler, context, [{"instances": texts[:2]}], [""])
    assert status == 200
    assert (
        mismatches([p["embedding"] for p in v1["predictions"]], reference(folders["splade-sum-log1p"], texts[:2])) == 0
    )
    plain = reference(folders["splade-sum-log1p"], texts[:1])
    assert (
        len(single) == 1
        and mismatches([{"indices": [p["index"] for p in single[0]], "values": [p["value"] for p in single[0]]}], plain)
        == 0
    )


def test_refusals_are_one_line_in_each_format(handlers):
    handler, context = handlers("router")
    rows = [
        {"texts": ["a"], "input_type": "passage"},
        {"input": "a", "input_type": "queries"},
        {"input": "a", "encoding_format": "base64"},
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
        {"inputs": "a"},
        {"texts": ["a"], "normalize": True},
        {"texts": ["a"], "max_active_dims": 0},
    ]
    paths = ["", "v1/embeddings", "v1/embeddings", "", "embed", "", ""]
    answers = serve_at(handler, context, rows, paths)
    statuses = [s for s, _ in answers]
    assert statuses == [400, 400, 400, 400, 424, 400, 400], answers
    assert "input_type" in answers[0][1]["message"]
    assert answers[1][1]["error"]["param"] == "input_type"
    assert answers[2][1]["error"]["param"] == "encoding_format"
    assert "sparse" in answers[3][1]["message"] and "embed_sparse" in answers[4][1]["error"]
    for _, body in answers:
        assert "\n" not in json.dumps(body)


@pytest.mark.parametrize("strategy", ["bucketed", "dynamic", "static"])
@pytest.mark.parametrize("max_length", [64, MAX_LENGTH])
def test_a_static_route_cuts_texts_where_its_own_tokenizer_does(folders, strategy, max_length):
    """SparseStaticEmbedding cuts a text at its tokenizer's model_max_length of its own tokens (128 here: 2 more
    than max_length 128 leaves beside the special tokens, and past a max_length of 64, which cuts the document
    route alone): served exactly, in any batch, planned as one token a row (a row of 130 tokens fits a budget of
    128), each cut where its route is beside documents cut at max_length."""
    folder = folders["router"]
    handler, context = make_handler(
        folder, task="sparse", strategy=strategy, max_length=max_length, max_batch_tokens=MAX_LENGTH
    )
    queries = [LONG, "word " * 300, *mixed_texts(5, seed=11)]
    short = [" ".join(t.split()[:10]) for t in mixed_texts(4, seed=12)]
    rows = [{"texts": queries, "input_type": "query"}, {"texts": short}, {"texts": [LONG], "input_type": "query"}]
    answers = serve_at(handler, context, rows, ["", "", ""])
    assert [s for s, _ in answers] == [200, 200, 200], answers
    got = [a["embedding"] for a in answers[0][1] + answers[2][1]]
    assert mismatches(got, reference(folder, [*queries, LONG], "query")) == 0
    assert mismatches([a["embedding"] for a in answers[1][1]], reference(folder, short)) == 0
    assert answers[0][1][0]["tokens"] == 130 and answers[0][1][0]["truncated"]
    assert "static route 'query' cut at its tokenizer's model_max_length (128)" in cast(Any, handler.task).ready_note
    cut_at_max_length = reference(folder, [" ".join(LONG.split()[:124])], "query")
    assert np.count_nonzero(reference(folder, [LONG], "query")) > np.count_nonzero(cut_at_max_length)  # not by chance


def test_token_ids_take_their_requests_route(folders, handlers):
    """Token ids (OpenAI's `input` of integers) take the route of their request's input_type, as its texts do."""
    handler, context = handlers("router-top")  # no prompts (token ids take none)
    texts = ["apple cherry alpha", "word " * 40]
    ids = [list(e.ids[1:-1]) for e in handler.tokenizer.encode(texts)]
    rows = [{"input": ids, "model": "m", "input_type": t} for t in ("query", "document")]
    (s1, queries), (s2, documents) = serve_at(handler, context, rows, ["v1/embeddings", "v1/embeddings"])
    assert (s1, s2) == (200, 200)
    folder = folders["router-top"]
    assert mismatches([d["embedding"] for d in queries["data"]], reference(folder, texts, "query")) == 0
    assert mismatches([d["embedding"] for d in documents["data"]], reference(folder, texts, "document")) == 0


def test_a_static_route_text_past_what_is_read_is_refused_in_one_line(folders, monkeypatch):
    """A static route's text is read up to STATIC_REACH of its tokens: one that sentence-transformers cuts further
    (or not at all) is a 413 past it, in one line; its other texts are served."""
    from bucketing.kinds.sparse import task as sparse

    monkeypatch.setattr(sparse, "STATIC_REACH", 16)
    handler, context = make_handler(folders["router"], task="sparse", max_length=MAX_LENGTH)
    rows = [{"texts": ["word " * 20], "input_type": "query"}, {"texts": ["word " * 14], "input_type": "query"}]
    (s1, refused), (s2, served) = serve_at(handler, context, rows, ["", ""])
    assert (s1, s2) == (413, 200)
    assert "static route 'query'" in refused["message"] and "16 tokens" in refused["message"]
    assert "\n" not in json.dumps(refused)
    assert mismatches([served[0]["embedding"]], reference(folders["router"], ["word " * 14], "query")) == 0


def test_a_dense_model_refuses_embed_sparse(tiny_embedder_dir):
    handler, context = make_handler(tiny_embedder_dir, max_length=64)
    ((status, body),) = serve_at(handler, context, [{"inputs": "a"}], ["embed_sparse"])
    assert status == 424 and body["error_type"] == "Backend"


@pytest.mark.parametrize("engine", ENGINES)
def test_reduced_dtypes_are_refused_at_worker_start(folders, engine):
    from bucketing.model.head import EngineError

    with pytest.raises(EngineError, match="handler.dtype bfloat16: a sparse model is served in float32 only"):
        make_handler(folders["splade-max"], task="sparse", max_length=MAX_LENGTH, engine=engine, dtype="bfloat16")


@pytest.mark.parametrize("variant", ["router", "csr"])
def test_an_onnxruntime_archive_carries_its_graph_and_serves(folders, csr_folders, archives, variant):
    """Built with --engine onnxruntime, a sparse folder's archive carries model.onnx (SPLADE: pooled inside it;
    CSR: the dense chain's embedding) and its worker runs the graph, checked against torch at start."""
    staged, cfg = archives(variant)
    assert (staged / "model.onnx").is_file()
    assert cfg["handler"]["task"] == "sparse" and cfg["handler"]["engine"] == "onnxruntime"
    section = {k: v for k, v in cfg["handler"].items() if k != "model_path"} | {"cost": {"calibrate": False}}
    handler, context = make_handler(staged, **section)
    assert handler.task.engine.name == "onnxruntime" and handler.task.engine.device == "cpu"
    note = handler.task.ready_note
    assert ("activations the size of a group's logits" in note) == (variant == "router"), note
    texts = mixed_texts(5, seed=12) + ["x"]
    ((status, body),) = serve_at(handler, context, [{"texts": texts, "input_type": "document"}], [""])
    assert status == 200
    folder = folders[variant] if variant in folders else csr_folders[variant]
    assert mismatches([a["embedding"] for a in body], reference(folder, texts, "document")) == 0


def test_a_missing_foreign_or_tampered_graph_stops_the_worker_in_one_line(folders, archives, tmp_path):
    """No model.onnx, another model's graph, or weights the graph was not exported from: the worker does not
    start, and says why in one line."""
    from bucketing.model.head import EngineError

    def start(folder):
        with pytest.raises(EngineError) as raised:
            make_handler(folder, task="sparse", engine="onnxruntime", max_length=MAX_LENGTH)
        assert "\n" not in str(raised.value)
        return str(raised.value)

    assert "no model.onnx" in start(folders["splade-max"])
    foreign = tmp_path / "foreign"
    shutil.copytree(archives("splade-max")[0], foreign)
    shutil.copy(archives("csr")[0] / "model.onnx", foreign / "model.onnx")  # a CSR graph: other inputs and output
    assert "could not be checked against the torch model" in start(foreign)
    tampered = tmp_path / "tampered"
    shutil.copytree(archives("splade-max")[0], tampered)
    other = build_sparse_encoder(tmp_path / "other", seed=9)
    shutil.copy(other / "model.safetensors", tampered / "model.safetensors")  # the graph no longer matches
    assert "differs from the torch model by" in start(tampered)


def test_calibration_times_the_sparse_head(folders, monkeypatch):
    """The cost model is fitted on passes through the MLM head and SPLADE pooling (the task's own forward)."""
    from bucketing.kinds.sparse.engines import SparseEngine

    shapes = []
    original = SparseEngine.__call__

    def timed(self, ids, mask, route):
        shapes.append(ids.shape)
        return original(self, ids, mask, route)

    monkeypatch.setattr(SparseEngine, "__call__", timed)
    make_handler(folders["splade-max"], task="sparse", max_length=MAX_LENGTH, cost={"calibrate": True})
    assert len(shapes) >= 3 * 4 and (4, 128) in shapes  # a warm-up and three timings of each shape that fits


def test_a_pass_holds_at_most_max_batch_tokens_of_logits(folders):
    """The MLM runs in row groups of at most max_batch_tokens tokens, whatever the strategy planned, and a group's
    logits are freed before the next group's are made."""
    import torch

    handler, context = make_handler(
        folders["splade-max"], task="sparse", strategy="dynamic", max_length=MAX_LENGTH, max_batch_tokens=128
    )
    seen: list[int] = []
    logits: list[Any] = []
    model = cast(Any, handler.task.engine).model
    original = model.forward

    def large() -> list[Any]:
        """Tensors the size of a row group's logits or more (weights of models other tests left alive too)."""
        return [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.numel() >= 64 * 30522]

    before = {id(o) for o in large()}  # what existed before the pass: not this pass's logits

    def counting(*args, **kwargs):
        ids = kwargs["input_ids"]
        seen.append(ids.shape[0] * ids.shape[1])
        assert all(ref() is None for ref in logits), "a row group's logits outlived it"
        held = [o for o in large() if id(o) not in before]
        assert not held, f"{len(held)} vocabulary-wide tensors of an earlier group are still held"
        out = original(*args, **kwargs)
        logits.append(weakref.ref(out[0]))
        return out

    model.forward = counting
    texts = ["word " * 40] * 9
    ((status, _),) = serve_at(handler, context, [{"texts": texts, "max_active_dims": 5}], [""])
    assert status == 200 and len(seen) > 1 and max(seen) <= 128


def csr_chain(transformer, dense=False, normalize=False, layer_norm=False, k=8, include_prompt=True, hidden=None):
    """CSR modules over a Transformer: Pooling (leaving the prompt's tokens out unless `include_prompt`), a Dense and
    Normalize if asked, then a SparseAutoEncoder of `hidden` latents (4 x its input by default), its biases random
    (not its zero init)."""
    import torch
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling
    from sentence_transformers.sparse_encoder.modules import SparseAutoEncoder

    width = transformer.get_embedding_dimension()
    modules: list[Any] = [transformer, Pooling(width, include_prompt=include_prompt)]
    if dense:
        modules.append(Dense(width, width // 2, activation_function=torch.nn.Tanh()))
        width //= 2
    if normalize:
        modules.append(Normalize())
    sae = SparseAutoEncoder(input_dim=width, hidden_dim=hidden or 4 * width, k=k, normalize=layer_norm)
    with torch.no_grad():
        sae.pre_bias.normal_(0, 0.1)
        sae.latent_bias.normal_(0, 0.1)
    return [*modules, sae]


def build_csr(target, dense=False, normalize=False, layer_norm=False, k=8, include_prompt=True, **settings):
    """A SparseAutoEncoder (CSR) over a tiny dense model (Transformer, Pooling, a Dense and Normalize if asked),
    saved by sentence-transformers itself."""
    import torch
    from sentence_transformers.base.modules import Transformer

    from tests.models import build_tiny

    torch.manual_seed(11)
    body = build_tiny(target.parent / f"{target.name}-body", "bert")
    modules = csr_chain(Transformer(str(body)), dense, normalize, layer_norm, k, include_prompt)
    sentence_transformers.SparseEncoder(modules=modules, device="cpu", **settings).save(str(target))
    return target


def build_csr_router(target, query="static", include_prompt=True, hidden=None, shared=True, **settings):
    """A Router saved by sentence-transformers itself whose document route is CSR and whose query route is a
    SparseStaticEmbedding (the Transformer's tokenizer; `hidden` latents: its vocabulary's size by default) or
    (`query="csr"`) another CSR chain over the same Transformer instance (saved once, shared by both routes; with
    `shared` False, over a Transformer of its own)."""
    import torch
    from sentence_transformers.base.modules import Router, Transformer
    from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding

    from tests.models import build_tiny

    torch.manual_seed(13)
    body = build_tiny(target.parent / f"{target.name}-body", "bert")
    transformer = Transformer(str(body))
    vocab = len(transformer.tokenizer)
    if query == "static":
        weight = torch.rand(vocab) * (torch.rand(vocab) > 0.3)  # some ids weigh nothing
        hidden = hidden or vocab
        queries: list[Any] = [SparseStaticEmbedding(tokenizer=transformer.tokenizer, weight=weight, frozen=True)]
    else:
        hidden = hidden or 96
        own = transformer if shared else Transformer(str(body))
        queries = csr_chain(own, dense=True, normalize=True, layer_norm=True, k=5, hidden=hidden)
    documents = csr_chain(transformer, k=12, include_prompt=include_prompt, hidden=hidden)
    router = Router.for_query_document(queries, documents)
    sentence_transformers.SparseEncoder(modules=[router], device="cpu", **settings).save(str(target))
    return target


CSR_VARIANTS: dict[str, dict[str, Any]] = {
    "csr": {},
    "csr-dense-normalized": {"dense": True, "normalize": True, "layer_norm": True, "k": 12, "prompts": PROMPTS},
    "csr-saved-max-active": {"dense": True, "max_active_dims": 5, "prompts": PROMPTS, "default_prompt_name": "query"},
    "csr-prompt-left-out": {"include_prompt": False, "prompts": PROMPTS, "default_prompt_name": "document"},
}


@pytest.fixture(scope="module")
def csr_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("csr")
    return {name: build_csr(root / name, **spec) for name, spec in CSR_VARIANTS.items()}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("strategy", ["bucketed", "dynamic", "static"])
@pytest.mark.parametrize("input_type", [None, "query"])
@pytest.mark.parametrize("variant", list(CSR_VARIANTS))
def test_csr_answers_equal_sparse_encoder(csr_folders, archives, variant, input_type, strategy, engine):
    """CSR: the dense chain's pooled embedding, then the SparseAutoEncoder's top-k, as encode() answers it."""
    handler, context = make_handler(
        model_dir(csr_folders, archives, variant, engine),
        task="sparse",
        strategy=strategy,
        engine=engine,
        max_length=MAX_LENGTH,
    )
    texts = mixed_texts(9, seed=6) + ["short", "x"]
    options = {"input_type": input_type} if input_type else {}
    rows = [{"texts": texts[:4], **options}, {"texts": texts[4:], **options}, {"text": texts[2], **options}]
    answers = serve_at(handler, context, rows, ["", "", ""])
    assert [s for s, _ in answers] == [200, 200, 200], answers
    got = [e["embedding"] for e in answers[0][1] + answers[1][1]] + [answers[2][1]["embedding"]]
    expected = reference(csr_folders[variant], texts + [texts[2]], input_type)
    assert mismatches(got, expected) == 0
    k = CSR_VARIANTS[variant].get("max_active_dims", CSR_VARIANTS[variant].get("k", 8))
    assert all(0 < len(a["indices"]) <= k for a in got)


@pytest.mark.parametrize("max_active_dims", [3, 20])
def test_csr_request_max_active_dims_is_encode_top_k(csr_folders, max_active_dims):
    """A request's max_active_dims is the autoencoder's top-k, as encode(max_active_dims=...) runs it (over the
    folder's k as well as under it)."""
    handler, context = make_handler(csr_folders["csr-dense-normalized"], task="sparse", max_length=MAX_LENGTH)
    texts = mixed_texts(7, seed=9)
    ((status, body),) = serve_at(handler, context, [{"texts": texts, "max_active_dims": max_active_dims}], [""])
    assert status == 200
    got = [a["embedding"] for a in body]
    expected = reference(csr_folders["csr-dense-normalized"], texts, max_active_dims=max_active_dims)
    assert mismatches(got, expected) == 0
    assert max(len(a["indices"]) for a in got) > 12 if max_active_dims == 20 else True
    task = cast(Any, handler.task)
    assert f"CSR: no vocabulary logits; a pass holds rows x {task.dimensions} latents" in task.ready_note


def test_build_detects_a_csr_folder(csr_folders):
    from model_store import archives
    from model_store.build import ArchiveSpec, BuildError

    folder = csr_folders["csr-dense-normalized"]
    assert archives.detect_task(folder) == "sparse"
    (cfg,) = ArchiveSpec(strategies=("bucketed",), model_dir=folder).configs().values()
    assert cfg["handler"]["task"] == "sparse" and cfg["handler"]["engine"] == "torch"
    assert "csr" in next(iter(cfg["model_chain"]["routes"].values()))
    assert cfg["model_chain"]["max_active_dims"] == 12
    (cfg,) = ArchiveSpec(strategies=("bucketed",), model_dir=folder, engine="onnxruntime").configs().values()
    assert cfg["handler"]["engine"] == "onnxruntime"
    with pytest.raises(BuildError, match="--dtype bfloat16: a sparse model is served in float32 only"):
        ArchiveSpec(strategies=("bucketed",), model_dir=folder, dtype="bfloat16").configs()


CSR_ROUTERS: dict[str, dict[str, Any]] = {
    "csr-static-router": {"prompts": PROMPTS},  # a static query route, a CSR document route
    "csr-shared-router": {"query": "csr", "include_prompt": False, "prompts": PROMPTS},  # two CSR routes, one body
}


@pytest.fixture(scope="module")
def csr_routers(tmp_path_factory):
    root = tmp_path_factory.mktemp("csr-router")
    return {name: build_csr_router(root / name, **spec) for name, spec in CSR_ROUTERS.items()}


def csr_router_texts(input_type, seed=6):
    """Varied lengths, some over max_length; a static query route's short (a long one: see its own test)."""
    texts = mixed_texts(9, seed=seed) + ["short", "x"]
    return [" ".join(t.split()[:20]) for t in texts] if input_type == "query" else texts


@pytest.mark.parametrize("strategy", ["bucketed", "dynamic", "static"])
@pytest.mark.parametrize("input_type", [None, "query", "document"])
@pytest.mark.parametrize(
    ("variant", "engine"),
    [("csr-static-router", "torch"), ("csr-static-router", "onnxruntime"), ("csr-shared-router", "torch")],
)
def test_csr_router_answers_equal_sparse_encoder(csr_routers, archives, variant, engine, input_type, strategy):
    """A Router with CSR routes (beside a static route, or two over one shared Transformer; a Pooling that leaves
    the prompt out): each request's route as encode_query / encode_document / encode() takes it, a CSR route cut
    at its own k (SparseEncoder takes no max_active_dims from a SparseAutoEncoder inside a Router); one CSR route
    on either engine (several: torch only, `test_several_csr_routes_are_refused_on_onnxruntime_in_one_line`)."""
    folder = csr_routers[variant]
    served = folder if engine == "torch" else archives(variant)[0]
    handler, context = make_handler(served, task="sparse", strategy=strategy, engine=engine, max_length=MAX_LENGTH)
    texts = csr_router_texts(input_type)
    options = {"input_type": input_type} if input_type else {}
    rows = [{"texts": texts[:4], **options}, {"texts": texts[4:], **options}, {"text": texts[2], **options}]
    answers = serve_at(handler, context, rows, ["", "", ""])
    assert [s for s, _ in answers] == [200, 200, 200], answers
    got = [e["embedding"] for e in answers[0][1] + answers[1][1]] + [answers[2][1]["embedding"]]
    assert mismatches(got, reference(folder, texts + [texts[2]], input_type)) == 0


@pytest.mark.parametrize("max_active_dims", [3, 20])
@pytest.mark.parametrize("variant", list(CSR_ROUTERS))
def test_csr_router_rows_of_both_routes_share_a_batch(csr_routers, variant, max_active_dims):
    """Query and document rows (and encode()'s) in one delivered batch, each by its route, a request's
    max_active_dims cutting each as encode(max_active_dims=...) does (over a CSR route's k as well as under it)."""
    folder = csr_routers[variant]
    handler, context = make_handler(folder, task="sparse", max_length=MAX_LENGTH, max_batch_tokens=256)
    queries, documents = csr_router_texts("query", seed=7), csr_router_texts("document", seed=8)
    rows = [
        {"texts": queries, "input_type": "query"},
        {"texts": documents, "input_type": "document", "max_active_dims": max_active_dims},
        {"texts": documents[:5]},
        {"texts": queries[:5], "input_type": "query", "max_active_dims": max_active_dims},
    ]
    answers = serve_at(handler, context, rows, [""] * 4)
    assert [s for s, _ in answers] == [200] * 4, answers
    expected = [
        reference(folder, queries, "query"),
        reference(folder, documents, "document", max_active_dims=max_active_dims),
        reference(folder, documents[:5]),
        reference(folder, queries[:5], "query", max_active_dims=max_active_dims),
    ]
    for (_, body), want in zip(answers, expected):
        assert mismatches([a["embedding"] for a in body], want) == 0


def test_several_csr_routes_are_refused_on_onnxruntime_in_one_line(csr_routers, tmp_path, capsys):
    """One exported graph holds one dense chain: a Router of two CSR routes is refused on onnxruntime at build and
    at worker start, in one line naming --engine torch."""
    from bucketing.model.head import EngineError
    from model_store import build

    folder = csr_routers["csr-shared-router"]
    argv = ["--model-dir", str(folder), "--strategies", "bucketed", "--engine", "onnxruntime", "--print-commands"]
    assert build.main([*argv, "--stage-dir", str(tmp_path / "stage")]) == 2
    err = capsys.readouterr().err.strip()
    assert "CSR routes" in err and "--engine torch" in err and "\n" not in err
    with pytest.raises(EngineError, match="2 CSR routes .* served on engine torch only") as raised:
        make_handler(folder, task="sparse", engine="onnxruntime", max_length=MAX_LENGTH)
    assert "\n" not in str(raised.value)


def test_a_router_of_splade_and_csr_routes_over_one_transformer_is_refused_in_one_line(csr_routers, tmp_path):
    """One transformer cannot run as a masked LM for a SPLADE route and as an encoder for a CSR route: refused with
    its own line (not as routes of different sizes)."""
    import json
    import shutil

    from bucketing.kinds.sparse.folder import read_sparse
    from bucketing.model.chain import ChainError

    folder = shutil.copytree(csr_routers["csr-shared-router"], tmp_path / "splade-and-csr")
    (folder / "query_9_SpladePooling").mkdir()
    (folder / "query_9_SpladePooling" / "config.json").write_text('{"pooling_strategy": "max"}')
    config = json.loads((folder / "router_config.json").read_text())
    config["types"]["query_9_SpladePooling"] = "sentence_transformers.sparse_encoder.modules.SpladePooling"
    config["structure"]["query"] = ["query_0_Transformer", "query_9_SpladePooling"]
    (folder / "router_config.json").write_text(json.dumps(config))
    (folder / "query_0_Transformer" / "sentence_bert_config.json").write_text('{"transformer_task": "fill-mask"}')
    with pytest.raises(ChainError, match="both SPLADE and CSR routes is not served") as refused:
        read_sparse(folder)
    assert "\n" not in str(refused.value)


def test_build_carries_every_module_of_a_csr_router(csr_routers, tmp_path):
    from bucketing.model.head import EngineError
    from model_store import archives
    from model_store.build import ArchiveSpec, BuildError

    folder = csr_routers["csr-shared-router"]
    assert archives.detect_task(folder) == "sparse"
    (cfg,) = ArchiveSpec(strategies=("bucketed",), model_dir=folder).configs().values()
    assert set(cfg["model_chain"]["routes"]) == {"query", "document"} and cfg["model_chain"]["max_active_dims"] is None
    carried = set(archives.model_files(folder))
    saved = {p.name for p in folder.iterdir() if p.is_dir()}
    assert {"query_0_Transformer", "query_2_Dense", "document_1_Pooling", "document_2_SparseAutoEncoder"} <= saved
    assert saved <= carried
    two = build_csr_router(tmp_path / "two", query="csr", shared=False)  # a Transformer per route
    with pytest.raises(BuildError, match="2 transformers"):
        ArchiveSpec(strategies=("bucketed",), model_dir=two).configs()
    with pytest.raises(EngineError, match="2 transformers"):
        make_handler(two, task="sparse", max_length=MAX_LENGTH)


def test_build_detects_a_sparse_folder_and_refuses_what_is_not_served(folders, tmp_path):
    from bucketing.model.head import EngineError
    from model_store import archives
    from model_store.build import ArchiveSpec, BuildError

    (cfg,) = ArchiveSpec(strategies=("bucketed",), model_dir=folders["router"]).configs().values()
    assert cfg["handler"]["task"] == "sparse" and cfg["handler"]["engine"] == "torch"
    assert set(cfg["model_chain"]["routes"]) == {"query", "document"}
    carried = archives.model_files(folders["router"])
    assert {"query_0_SparseStaticEmbedding", "document_0_MLMTransformer", "document_1_SpladePooling"} <= set(carried)
    with pytest.raises(BuildError, match="--dtype float16: a sparse model is served in float32 only"):
        ArchiveSpec(strategies=("bucketed",), model_dir=folders["router"], dtype="float16").configs()
    sizes = build_csr_router(tmp_path / "sizes", hidden=64)  # a static route of 30522 ids, CSR latents of 64
    with pytest.raises(BuildError, match="routes answer vectors of different sizes") as raised:
        ArchiveSpec(strategies=("bucketed",), model_dir=sizes).configs()
    assert "\n" not in str(raised.value)
    with pytest.raises(EngineError, match="routes answer vectors of different sizes"):
        make_handler(sizes, task="sparse", max_length=MAX_LENGTH)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_folder_sparse_encoder_saved_builds_at_its_own_limit(folders, variant):
    """A SPLADE folder saved by SparseEncoder keeps its transformer at the folder's root (modules.json path ""):
    checked as a model without reading the root's sparse chain as a dense one."""
    from model_store import archives
    from model_store.build import ArchiveSpec

    folder = folders[variant]
    assert archives.detect_task(folder) == "sparse"
    (cfg,) = ArchiveSpec(strategies=("bucketed",), model_dir=folder).configs().values()
    assert cfg["handler"]["task"] == "sparse"
    reference = sentence_transformers.SparseEncoder(str(folder), device="cpu")
    assert archives.check_model_dir(folder, "sparse") == reference.max_seq_length


def test_continuous_batching_plans_static_route_rows_as_one_token(folders, monkeypatch):
    """Under `schedule: continuous` too, a static route's rows (130 tokens here) are planned (scheduled and costed)
    as one token: they fit a budget of 128 beside documents cut at max_length, each answered as encode_query /
    encode_document answers it."""
    from bucketing.planning import scheduler
    from tests.handler.test_continuous import continuous
    from tsctl.inprocess import ContinuousFrontend

    seen: dict[str, tuple[int, ...]] = {}
    pick = scheduler.pick

    def recording(pool, *args, **kwargs):
        seen.update({p.key: p.lengths for p in pool})
        return pick(pool, *args, **kwargs)

    monkeypatch.setattr(scheduler, "pick", recording)
    folder = folders["router"]
    handler, context = continuous(folder, task="sparse", max_length=MAX_LENGTH, max_batch_tokens=MAX_LENGTH)
    front = ContinuousFrontend(handler, context, batch_size=4)
    queries, documents = [LONG, "word " * 300, "short"], ["x", " ".join(["word"] * 20)]
    front.submit("q", {"body": {"texts": queries, "input_type": "query"}})
    front.submit("d", {"body": {"texts": documents, "input_type": "document"}})
    answers = front.drain()
    assert answers["q"][0] == answers["d"][0] == 200, answers
    got = {key: [a["embedding"] for a in json.loads(answers[key][1])] for key in ("q", "d")}
    assert mismatches(got["q"], reference(folder, queries, "query")) == 0
    assert mismatches(got["d"], reference(folder, documents, "document")) == 0
    assert seen["q"] == (1, 1, 1) and seen["d"] == (5, 24)  # a document: its prompt, text and special tokens


def test_a_router_whose_static_weights_are_unreadable_is_refused_in_one_line(tmp_path):
    """A CSR Router's static route whose model.safetensors is not one: read_sparse (build and worker start) says so
    in one ChainError line, not a safetensors traceback."""
    from bucketing.kinds.sparse.folder import read_sparse
    from bucketing.model.chain import ChainError

    folder = build_csr_router(tmp_path / "unreadable")
    (weights,) = [p for p in folder.rglob("model.safetensors") if "SparseStaticEmbedding" in str(p)]
    weights.write_bytes(b"garbage")
    with pytest.raises(ChainError, match="not a safetensors file") as refused:
        read_sparse(folder)
    assert "\n" not in str(refused.value)


def test_two_csr_routes_sharing_one_autoencoder_keep_their_own_pooling(tmp_path):
    """A Router whose query and document routes share the Transformer and the SparseAutoEncoder instance (each saved
    once) but pool differently (cls, mean): each route answers with its own pooling, as encode_query/_document."""
    import torch
    from sentence_transformers.base.modules import Router, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from sentence_transformers.sparse_encoder.modules import SparseAutoEncoder

    from tests.models import build_tiny

    torch.manual_seed(13)
    transformer = Transformer(str(build_tiny(tmp_path / "body", "bert")))
    width = transformer.get_embedding_dimension()
    sae = SparseAutoEncoder(input_dim=width, hidden_dim=96, k=8)
    with torch.no_grad():
        sae.pre_bias.normal_(0, 0.1)
        sae.latent_bias.normal_(0, 0.1)
    queries = [transformer, Pooling(width, pooling_mode="cls"), sae]
    documents = [transformer, Pooling(width, pooling_mode="mean"), sae]
    folder = tmp_path / "shared-autoencoder"
    router = Router.for_query_document(queries, documents)
    sentence_transformers.SparseEncoder(modules=[router], device="cpu").save(str(folder))
    handler, context = make_handler(folder, task="sparse", max_length=64)
    texts = ["apple cherry alpha beta", "word " * 20, "a b c"]
    rows = [{"texts": texts, "input_type": "query"}, {"texts": texts, "input_type": "document"}]
    (s1, queried), (s2, documented) = serve_at(handler, context, rows, ["", ""])
    assert (s1, s2) == (200, 200)
    assert mismatches([a["embedding"] for a in documented], reference(folder, texts, "document")) == 0
    assert mismatches([a["embedding"] for a in queried], reference(folder, texts, "query")) == 0


def test_tei_tokenize_cuts_at_max_length_beside_a_static_route(folders):
    """TEI's /tokenize shows the tokens cut at handler.max_length (tei_tokenize's docstring), also for a Router
    whose static route reads texts further (`task.reach`)."""
    handler, context = make_handler(folders["router"], task="sparse", max_length=64)
    ((status, (tokens,)),) = serve_at(handler, context, [{"inputs": "word " * 300}], ["tokenize"])
    assert status == 200
    assert len(tokens) == 64
