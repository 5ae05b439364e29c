"""`input_type` picks the prompt sentence-transformers 6.2's own `encode_query` / `encode_document` pick, for every
kind (dense, SPLADE, CSR, multi-vector), on our native route and OpenAI's: the model's `query` prompt, and its
`document` prompt (empty when it has none; sentence-transformers always has one, so a `passage` or `corpus` prompt
is never a document's unless named). Folders saved by 6.2 (prompts `query`, `passage`, and an empty `document`), by
older layouts (no `document` entry), and a plain folder given `handler.prompts`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.handler.sparse.support import build_csr
from tests.handler.sparse.support import mismatches as sparse_mismatches
from tests.handler.test_handler import make_handler, mixed_texts, serve_at
from tests.models import build_multi_vector_encoder, build_sentence_transformer, build_sparse_encoder, build_tiny_bert

np = pytest.importorskip("numpy")
sentence_transformers = pytest.importorskip("sentence_transformers")

TOLERANCE = 1e-5
MAX_LENGTHS = {"dense": 128, "splade": 128, "csr": 128, "multivector": 64}  # each folder's max_seq_length
PROMPTS = {"query": "query: ", "passage": "passage: "}  # e5's, as saved before a `document` entry was kept
INPUT_TYPES = ("query", "document")
LAYOUTS = ("saved-by-6.2", "older")
BUILDERS: dict[str, Any] = {
    "dense": lambda target: build_sentence_transformer(target, prompts=PROMPTS),
    "splade": lambda target: build_sparse_encoder(target, pooling="sum", activation="log1p_relu", prompts=PROMPTS),
    "csr": lambda target: build_csr(target, dense=True, prompts=PROMPTS),
    "multivector": lambda target: build_multi_vector_encoder(target, prompts=PROMPTS),
}
TASKS = {"dense": "embedding", "splade": "sparse", "csr": "sparse", "multivector": "multivector"}
ENCODERS = {
    "dense": "SentenceTransformer",
    "splade": "SparseEncoder",
    "csr": "SparseEncoder",
    "multivector": "MultiVectorEncoder",
}


def older_layout(folder: Path) -> Path:
    """The folder as saved before sentence-transformers kept a `document` prompt: its prompts as given."""
    path = folder / "config_sentence_transformers.json"
    config = json.loads(path.read_text())
    assert config["prompts"] == {**PROMPTS, "document": ""}  # what 6.2 saves
    config["prompts"] = dict(PROMPTS)
    path.write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    cache: dict[tuple[str, str], Path] = {}

    def get(kind: str, layout: str) -> Path:
        if (kind, layout) not in cache:
            folder = BUILDERS[kind](tmp_path_factory.mktemp(f"{kind}-{layout}") / "model")
            cache[kind, layout] = older_layout(folder) if layout == "older" else folder
        return cache[kind, layout]

    return get


def reference(kind: str, folder: Path, texts: list[str], input_type: str, **settings: Any) -> list[Any]:
    """sentence-transformers' own encode_query / encode_document of the folder, as dense rows or token matrices."""
    model = getattr(sentence_transformers, ENCODERS[kind])(str(folder), device="cpu", **settings)
    encode = getattr(model, f"encode_{input_type}")
    if kind in ("splade", "csr"):
        return list(encode(texts, convert_to_tensor=True, batch_size=len(texts)).to_dense().numpy())
    return [np.asarray(e) for e in encode(texts, batch_size=len(texts), convert_to_numpy=True)]


def answers(kind: str, folder: Path, texts: list[str], input_type: str, **section: Any) -> dict[str, list[Any]]:
    """Ours for `input_type`, by route: native `texts` and (but for multi-vector, which OpenAI's route refuses)
    OpenAI's `input`, in one delivered batch."""
    handler, context = make_handler(folder, task=TASKS[kind], max_length=MAX_LENGTHS[kind], **section)
    rows: list[dict[str, Any]] = [{"texts": texts, "input_type": input_type}]
    paths = [""]
    if kind != "multivector":
        rows.append({"input": texts, "model": "m", "input_type": input_type})
        paths.append("v1/embeddings")
    served = serve_at(handler, context, rows, paths)
    assert [s for s, _ in served] == [200] * len(rows), served
    field = "embeddings" if kind == "multivector" else "embedding"
    out = {"native": [a[field] for a in served[0][1]]}
    if len(served) > 1:
        out["openai"] = [d["embedding"] for d in served[1][1]["data"]]
    return out


def differences(kind: str, got: list[Any], expected: list[Any]) -> list[str]:
    """Where our answers differ from sentence-transformers' (none: equal within 1e-5)."""
    if kind in ("splade", "csr"):
        bad = sparse_mismatches(got, expected)
        return [f"{bad} sparse answers differ"] if bad else []
    out = []
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        g = np.asarray(g, dtype=np.float32).reshape(e.shape) if np.size(g) == e.size else np.asarray(g)
        if g.shape != e.shape:
            out.append(f"text {i}: shape {g.shape}, expected {e.shape}")
        elif float(np.max(np.abs(g - e), initial=0)) > TOLERANCE:
            out.append(f"text {i}: off by {float(np.max(np.abs(g - e))):.3g}")
    return out


@pytest.mark.parametrize("input_type", INPUT_TYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", list(BUILDERS))
def test_input_type_picks_the_prompt_encode_query_and_encode_document_pick(folders, kind, layout, input_type):
    folder, texts = folders(kind, layout), mixed_texts(5, seed=3) + ["short"]
    expected = reference(kind, folder, texts, input_type)
    got = answers(kind, folder, texts, input_type)
    assert {route: differences(kind, g, expected) for route, g in got.items()} == {route: [] for route in got}


@pytest.mark.parametrize("input_type", INPUT_TYPES)
def test_a_plain_folder_given_prompts_resolves_them_as_sentence_transformers(input_type, tmp_path_factory):
    """A Hugging Face folder (mean pooling, normalised) with `handler.prompts` is SentenceTransformer(dir,
    prompts=...)."""
    folder = build_tiny_bert(tmp_path_factory.mktemp("plain"), classifier=False)
    texts = mixed_texts(5, seed=4) + ["short"]
    expected = [e / np.linalg.norm(e) for e in reference("dense", folder, texts, input_type, prompts=PROMPTS)]
    got = answers("dense", folder, texts, input_type, prompts=PROMPTS)
    assert {route: differences("dense", g, expected) for route, g in got.items()} == {route: [] for route in got}


def named(kind: str, folder: Path, texts: list[str], prompt_name: str) -> list[Any]:
    """sentence-transformers' own `encode(prompt_name=...)` of the folder."""
    model = getattr(sentence_transformers, ENCODERS[kind])(str(folder), device="cpu")
    if kind in ("splade", "csr"):
        encoded = model.encode(texts, prompt_name=prompt_name, convert_to_tensor=True, batch_size=len(texts))
        return list(encoded.to_dense().numpy())
    return [np.asarray(e) for e in model.encode(texts, prompt_name=prompt_name, batch_size=len(texts))]


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_prompt_name_query_or_document_is_served_where_the_model_lacks_it(folders, kind):
    """sentence-transformers' encoders always have a `query` and a `document` prompt (empty unless set), so naming
    one the folder does not save (the older layout has no `document`) is no prompt, not a 400."""
    folder, texts = folders(kind, "older"), mixed_texts(3, seed=5) + ["short"]
    handler, context = make_handler(folder, task=TASKS[kind], max_length=MAX_LENGTHS[kind])
    served = serve_at(handler, context, [{"texts": texts, "prompt_name": "document"}], [""])
    assert served[0][0] == 200, served
    field = "embeddings" if kind == "multivector" else "embedding"
    got = [a[field] for a in served[0][1]]
    assert differences(kind, got, named(kind, folder, texts, "document")) == []


def test_a_classifier_has_no_query_or_document_prompt_of_its_own(tmp_path_factory):
    """A CrossEncoder keeps no default prompts: naming `document` on one that saves none is the client's 400."""
    folder = build_tiny_bert(tmp_path_factory.mktemp("cross"), classifier=True)
    handler, context = make_handler(folder, task="classification")
    served = serve_at(handler, context, [{"texts": ["a text"], "prompt_name": "document"}], [""])
    assert served[0][0] == 400, served
    assert "is not a prompt of this model" in json.dumps(served[0][1]), served
