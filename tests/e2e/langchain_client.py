"""Run by test_openai.py with the clients' own venv (`make tei-clients-venv`): LangChain's `OpenAIEmbeddings`, as a
user points it at our OpenAI route, embeds the texts given on stdin with `embed_documents` (its own chunks of
1,000 inputs a request); prints the embeddings as JSON. `check_embedding_ctx_length=False` sends the texts
themselves (otherwise LangChain sends OpenAI's tiktoken ids, which mean nothing to this model). Not collected by
pytest."""

from __future__ import annotations

import json
import sys


def main(base_url: str, token: str, texts: list[str]) -> None:
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model="minilm", base_url=base_url, api_key=token, check_embedding_ctx_length=False, max_retries=0, timeout=600
    )
    print(json.dumps(embeddings.embed_documents(texts)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.stdin.read()))
