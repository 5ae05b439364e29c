"""Text Embeddings Inference's `/embed_all`, refused in TEI's shape (424 Backend, one line): multi-vector (token
embeddings) models are another model kind, not served by this handler yet; a dense embedding or classification
model does not answer it (TEI refuses it on such models too). `/embed_sparse` is `tei_embed_sparse`'s."""

from __future__ import annotations

from typing import Any

from . import tei
from .base import Limits, RequestError
from .tei import error_body as error_body
from .tei import own_error as own_error

NAME = "tei-refused"
SERVED = "POST .../embed_all (refused: multi-vector models are not served yet)"


def embed_all(body: Any, limits: Limits) -> RequestError:
    return tei.backend(
        f"/embed_all (token embeddings) is not served: this is a {limits.task} model answered with one vector per "
        "input, and multi-vector models are not served by this handler yet; use /embed"
    )


ROUTES = {"embed_all": embed_all}
