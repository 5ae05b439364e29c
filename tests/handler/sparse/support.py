"""What the sparse encoder tests share: the variants saved by sentence-transformers 6.2 (SPLADE, Routers, CSR
alone and in Routers) and how to build them, the folder each engine serves, rows sent to their url paths, and
`SparseEncoder`'s own answers to compare with (non-zero ids equal, values within 1e-5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.handler.test_handler import mixed_texts

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
CSR_VARIANTS: dict[str, dict[str, Any]] = {
    "csr": {},
    "csr-dense-normalized": {"dense": True, "normalize": True, "layer_norm": True, "k": 12, "prompts": PROMPTS},
    "csr-saved-max-active": {"dense": True, "max_active_dims": 5, "prompts": PROMPTS, "default_prompt_name": "query"},
    "csr-prompt-left-out": {"include_prompt": False, "prompts": PROMPTS, "default_prompt_name": "document"},
}
CSR_ROUTERS: dict[str, dict[str, Any]] = {
    "csr-static-router": {"prompts": PROMPTS},  # a static query route, a CSR document route
    "csr-shared-router": {"query": "csr", "include_prompt": False, "prompts": PROMPTS},  # two CSR routes, one body
}


def stage_onnxruntime_archive(folder: Path, stage: Path) -> tuple[Path, dict[str, Any]]:
    """`model_store.build --engine onnxruntime --print-commands` for the folder (its task detected): the archive's
    model folder as staged (the graph exported into it) and its model-config."""
    import yaml

    from model_store import build

    argv = ["--model-dir", str(folder), "--strategies", "bucketed", "--engine", "onnxruntime", "--print-commands"]
    assert build.main([*argv, "--stage-dir", str(stage)]) == 0
    (config,) = stage.glob("*.yaml")
    return stage / "extra" / "model", yaml.safe_load(config.read_text())


def model_dir(folders, archives, variant, engine):
    """The folder an engine serves: the saved one (torch), the staged archive's model folder (onnxruntime)."""
    return folders[variant] if engine == "torch" else archives(variant)[0]


REFERENCES: dict[Any, Any] = {}


def reference(folder, texts, input_type=None, **kwargs):
    """`SparseEncoder(folder)`'s answers as dense rows (kept for the module: each engine compares with the same)."""
    key = (str(folder), tuple(texts), input_type, tuple(sorted(kwargs.items())))
    if key not in REFERENCES:
        import sentence_transformers

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
    import sentence_transformers
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
    import sentence_transformers
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
