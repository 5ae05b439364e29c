"""Text Embeddings Inference's `/embed_sparse`, refused in TEI's shape (424 Backend, one line): sparse (SPLADE)
models are another model kind, not served by this handler yet; a dense embedding or classification model answers
none (TEI refuses it on such models too). `/embed_all` is its own module (`tei_embed_all`)."""

from __future__ import annotations

from typing import Any

from . import tei
from .base import Limits, RequestError
from .tei import error_body as error_body
from .tei import own_error as own_error

NAME = "tei-refused"
SERVED = "POST .../embed_sparse (refused: sparse models are not served yet)"


def embed_sparse(body: Any, limits: Limits) -> RequestError:
    return tei.backend(
        f"Model is not an embedding model with SPLADE pooling: this is a dense {limits.task} model, and sparse "
        "models are not served by this handler yet; use /embed"
    )


ROUTES = {"embed_sparse": embed_sparse}
