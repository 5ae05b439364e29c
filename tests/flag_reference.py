"""Run by tests (`bgem3_folder.reference`) with FlagEmbedding's own venv (`make flag-venv`): BGEM3FlagModel's encode of
the texts on stdin's request, all three outputs, and its `convert_id_to_token`, as one JSON line on stdout."""

from __future__ import annotations

import json
import sys


def main() -> None:
    request = json.loads(sys.stdin.read())
    from FlagEmbedding import BGEM3FlagModel

    model = BGEM3FlagModel(
        request["folder"],
        use_fp16=False,
        devices="cpu",
        colbert_dim=request["colbert_dim"],
        normalize_embeddings=request.get("normalize_embeddings", True),
        truncate_dim=request.get("truncate_dim"),
    )
    texts = request["texts"]
    out = model.encode(
        texts,
        batch_size=request.get("batch_size", 4),
        max_length=request["max_length"],
        return_dense=True,
        return_sparse=True,
        return_colbert_vecs=True,
    )
    lexical = out["lexical_weights"]
    named = model.convert_id_to_token(lexical)
    tokens = [len(model.tokenizer(t, truncation=True, max_length=request["max_length"])["input_ids"]) for t in texts]
    result = {
        "dense": out["dense_vecs"].tolist(),
        "sparse": [{str(k): float(v) for k, v in w.items()} for w in lexical],
        "sparse_tokens": [{str(k): float(v) for k, v in w.items()} for w in (named if len(texts) > 1 else [named])],
        "colbert": [v.tolist() for v in out["colbert_vecs"]],
        "tokens": tokens,
        "versions": {"FlagEmbedding": _version("FlagEmbedding"), "torch": _version("torch")},
    }
    print(json.dumps(result))


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
