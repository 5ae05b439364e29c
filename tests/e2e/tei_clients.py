"""Run by test_tei.py with the TEI clients' own venv (`make tei-clients-venv`): LlamaIndex's
`TextEmbeddingsInference` embeds texts against the model URL `.../predictions/NAME/1.0`, as a new user would
write it; prints what came back as JSON. Not collected by pytest. (LangChain's `HuggingFaceEndpointEmbeddings`
1.2.3 refuses a URL as its model, "`model` must be a HuggingFace repo ID, not a URL": it reaches no self-hosted
TEI.) Beside them, Cohere's own SDK (`cohere.ClientV2.embed`, which posts to `{base_url}/v2/embed`) asks every
embedding type we answer."""

from __future__ import annotations

import json
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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.stdin.read()))
