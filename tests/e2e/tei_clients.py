"""Run by test_tei.py with the TEI clients' own venv (`make tei-clients-venv`): LlamaIndex's
`TextEmbeddingsInference` embeds texts against the model URL `.../predictions/NAME/1.0`, as a new user would
write it; prints what came back as JSON. Not collected by pytest. (LangChain's `HuggingFaceEndpointEmbeddings`
1.2.3 refuses a URL as its model, "`model` must be a HuggingFace repo ID, not a URL": it reaches no self-hosted
TEI.) Beside them, Cohere's own SDK (`cohere.ClientV2.embed`, which posts to `{base_url}/v2/embed`) asks every
embedding type we answer. With `sparse` as a third argument: Haystack's TEI sparse embedders (a hybrid-search
client's lexical side) instead, against a BGE-M3 model URL."""

from __future__ import annotations

import json
import os
import sys


def main(url: str, token: str, texts: list[str]) -> None:
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    llama = TextEmbeddingsInference(model_name="minilm", base_url=url, auth_token=token, timeout=60)
    out = {
        "llamaindex_documents": llama.get_text_embedding_batch(texts),
        "llamaindex_query": llama.get_query_embedding(texts[0]),
        "cohere": cohere_embed(url, token, texts),
    }
    print(json.dumps(out))


def cohere_embed(url: str, token: str, texts: list[str]) -> dict[str, object]:
    """Cohere's SDK against our model URL: each embedding type, and a query's."""
    import cohere

    client = cohere.ClientV2(api_key=token, base_url=url, timeout=60)
    types = ["float", "binary", "ubinary"]
    documents = client.embed(texts=texts, input_type="search_document", embedding_types=types, model="minilm")
    query = client.embed(texts=texts[:1], input_type="search_query", embedding_types=["float"], model="minilm")
    try:
        ranged = client.embed(texts=texts, input_type="search_document", embedding_types=["int8"], model="minilm")
        int8: object = {"values": ranged.embeddings.int8}
    except cohere.core.api_error.ApiError as error:
        int8 = {"status": error.status_code, "body": error.body}
    return {
        "documents": {t: getattr(documents.embeddings, "float_" if t == "float" else t) for t in types},
        "query": query.embeddings.float_,
        "int8": int8,
    }


def haystack_sparse(url: str, token: str, texts: list[str]) -> None:
    """Haystack's HuggingFaceTEISparseDocumentEmbedder (documents, two requests of its batch_size) and
    HuggingFaceTEISparseTextEmbedder (a query) against the model URL, each its own POST to `{url}/embed_sparse`."""
    os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"  # nothing leaves the machine
    from haystack import Document
    from haystack.utils import Secret
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceTEISparseDocumentEmbedder,
        HuggingFaceTEISparseTextEmbedder,
    )

    secret = Secret.from_token(token)
    documents = HuggingFaceTEISparseDocumentEmbedder(
        api_base_url=url, token=secret, batch_size=max(1, len(texts) // 2), progress_bar=False, timeout=60
    ).run(documents=[Document(content=t) for t in texts])["documents"]
    query = HuggingFaceTEISparseTextEmbedder(api_base_url=url, token=secret, timeout=60).run(text=texts[0])
    out = [d.sparse_embedding.to_dict() for d in documents]
    print(json.dumps({"documents": out, "query": query["sparse_embedding"].to_dict()}))


if __name__ == "__main__":
    run = haystack_sparse if sys.argv[3:] == ["sparse"] else main
    run(sys.argv[1], sys.argv[2], json.loads(sys.stdin.read()))
