"""An HTTP request as TorchServe 0.12 hands it to the handler: the row (`{"body": ...}`) and its `Meta`.

What TorchServe does, read from its frontend (`InferenceRequestHandler.parseRequest`) and worker
(`ts/protocol/otf_message_handler.py`, `_retrieve_input_data`; `ts/service.py`): a form body
(`application/x-www-form-urlencoded`, `multipart/form-data`) becomes one parameter per field, anything else the one
parameter `body` (the raw bytes) typed with the request's media type (the Content-Type before any `;`); the worker
`json.loads` a body typed exactly `application/json` (forwarding the bytes when that fails) and decodes a `text*` one
to a string (forwarding the bytes when it is not UTF-8); every request header reaches the handler (plus `url_path`,
the path after `/predictions/NAME/VERSION/`, and `explain`). The handler (`bucketing_handler.request_meta`) takes the
body parameter's type as the request's Content-Type, else the request's own header. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bucketing.protocols.base import Meta

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def media_type(content_type: str | None) -> str:
    """The media type TorchServe records for a body (Netty's `HttpUtil.getMimeType`): before any `;`, trimmed."""
    return (content_type or "").split(";", 1)[0].strip()


def torchserve_value(body: bytes, media: str) -> Any:
    """The body parameter's value as TorchServe's worker decodes it."""
    if media == "application/json":
        try:
            return json.loads(body.decode("utf-8"))
        except Exception:  # noqa: BLE001 - TorchServe forwards the bytes whatever failed
            return body
    if media.startswith("text"):
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            return body
    return body


def torchserve_row(body: bytes, headers: Mapping[str, str], url_path: str | None) -> tuple[dict[str, Any], Meta]:
    """The row and `Meta` the handler gets for this request; `headers` with lower-case names; `url_path` as
    TorchServe sets it (None on the KServe routes, where it sets none)."""
    content_type = headers.get("content-type")
    media = media_type(content_type)
    plain = dict(headers)
    if url_path is not None:
        plain["url_path"] = url_path
    plain["explain"] = "False"
    if media.lower() in FORM_TYPES:  # its fields became parameters; none is a body the handler reads
        return {}, Meta(content_type, url_path, plain)
    return {"body": torchserve_value(body, media)}, Meta(media or None, url_path, plain)


__all__ = ["FORM_TYPES", "media_type", "torchserve_row", "torchserve_value"]
