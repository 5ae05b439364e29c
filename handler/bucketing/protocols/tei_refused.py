"""Text Embeddings Inference's `/embed_sparse` and `/embed_all`, refused in TEI's shape (424 Backend, one line):
sparse (SPLADE) and multi-vector (token embeddings) models are other model kinds, not served by this handler yet;
a dense embedding or classification model answers neither (TEI refuses them on such models too)."""

from __future__ import annotations

from typing import Any

from . import tei
from .base import Limits, RequestError
from .tei import error_body as error_body
from .tei import own_error as own_error

NAME = "tei-refused"
SERVED = "POST .../embed_sparse and .../embed_all (refused: sparse and multi-vector models are not served yet)"


def embed_sparse(body: Any, limits: Limits) -> RequestError:
    return tei.backend(
        f"Model is not an embedding model with SPLADE pooling: this is a dense {limits.task} model, and sparse "
        "models are not served by this handler yet; use /embed"
    )


def embed_all(body: Any, limits: Limits) -> RequestError:
    return tei.backend(
        f"/embed_all (token embeddings) is not served: this is a {limits.task} model answered with one vector per "
        "input, and multi-vector models are not served by this handler yet; use /embed"
    )


ROUTES = {"embed_sparse": embed_sparse, "embed_all": embed_all}
