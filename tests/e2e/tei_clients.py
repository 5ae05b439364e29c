"""Run by test_tei.py with the TEI clients' own venv (`make tei-clients-venv`): LlamaIndex's
`TextEmbeddingsInference` embeds texts against the model URL `.../predictions/NAME/1.0`, as a new user would
write it; prints what came back as JSON. Not collected by pytest. (LangChain's `HuggingFaceEndpointEmbeddings`
1.2.3 refuses a URL as its model, "`model` must be a HuggingFace repo ID, not a URL": it reaches no self-hosted
TEI.)"""

from __future__ import annotations

import json
import sys


def main(url: str, token: str, texts: list[str]) -> None:
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    llama = TextEmbeddingsInference(model_name="minilm", base_url=url, auth_token=token, timeout=60)
    out = {
        "llamaindex_documents": llama.get_text_embedding_batch(texts),
        "llamaindex_query": llama.get_query_embedding(texts[0]),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.stdin.read()))
