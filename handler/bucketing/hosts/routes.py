"""The one route table of every host that owns its HTTP (the standalone server; a Ray Serve host later): which
requests reach a model's worker, with the `url_path` TorchServe would give it, and which the host answers itself.

Served paths (`NAME`: a model's name, `VERSION`: its version, `1.0` for our archives):

- TorchServe's: `/predictions/NAME`, `/predictions/NAME/VERSION` and `/predictions/NAME/VERSION/<route>` for every
  route a wire format declares (`bucketing.protocols.ROUTES`: `v1/embeddings`, `v1/models`, `embed`, `rerank`,
  `v2/embed`, ...; any other `<route>` reaches the worker too, which answers its 404 listing what is served, as
  behind TorchServe); KServe v1 `POST /v1/models/NAME:predict` and v2 `POST /v2/models/NAME/infer` (no `url_path`,
  as TorchServe sets none there); `GET /ping`.
- KServe's own: `GET /v2/health/live`, `/v2/health/ready`, `/v2`, `/v2/models/NAME`, `/v2/models/NAME/ready`,
  `/v1/models/NAME`; OpenAI's at `/openai/v1/...` (as KServe's Hugging Face server serves them) and at the root
  `/v1/...` (`ROOT_ROUTES`: each names the wire route it is, on the one model served, or the one the body names).
- The host's: `GET /metrics`.

Pure: no I/O. `match` is the whole table; `served_paths` lists it for one model (docs and tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bucketing.protocols import ROUTES

# Root paths of OpenAI's API (and KServe's Hugging Face server's `/openai` prefix) -> the wire route they are.
ROOT_ROUTES: dict[str, str] = {
    "/v1/embeddings": "v1/embeddings",
    "/v1/models": "v1/models",
    "/openai/v1/embeddings": "v1/embeddings",
    "/openai/v1/models": "v1/models",
    "/openai/v1/rerank": "v1/rerank",
}
for _path, _route in ROOT_ROUTES.items():  # a root route names a route some wire format declares
    if _route not in ROUTES:
        raise RuntimeError(f"hosts.routes: {_path} names {_route!r}, which no wire format routes")

# What the host answers itself (`Match.action`), besides "predict" (the model's worker).
HOST_ACTIONS = ("ping", "live", "ready", "server_meta", "model_ready", "model_v1", "model_v2", "metrics")
# TorchServe's own errors (`torchserve_error`), and KServe's for a model it does not know.
ERROR_ACTIONS = ("not_found", "model_not_found", "version_not_found", "method_not_allowed", "kserve_model_not_found")


@dataclass(frozen=True)
class Match:
    """Where a request goes: `action` (`predict`, one of `HOST_ACTIONS` or `ERROR_ACTIONS`), the model it names,
    the `url_path` TorchServe would give the handler (None where it gives none), and the version it asked."""

    action: str
    model: str | None = None
    url_path: str | None = None
    version: str | None = None
    by_body: bool = False  # a root OpenAI route with several models: the body's `model` picks one


def java_split(path: str) -> list[str]:
    """`path.split("/")` as Java's `String.split` does it (trailing empty strings dropped), as TorchServe splits."""
    parts = path.split("/")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def match(method: str, path: str, models: Mapping[str, str]) -> Match:
    """The route of `method path` (the path without its query) on a host serving `models` (name -> version)."""
    get, post = method in ("GET", "HEAD"), method == "POST"
    segments = java_split(path)
    head = segments[1] if len(segments) > 1 else ""
    if path == "/ping" and (get or post):
        return Match("ping")
    if path == "/metrics":
        return Match("metrics") if get else Match("method_not_allowed")
    if head == "predictions":
        return _predictions(segments, models, get or post or method == "PUT")
    if path in ROOT_ROUTES:
        route = ROOT_ROUTES[path]
        if not (post or (get and route == "v1/models")):
            return Match("method_not_allowed")
        if not models:
            return Match("model_not_found", "")
        name = next(iter(models))
        return Match("predict", name, route, models[name], by_body=len(models) > 1 and post)
    if head in ("v1", "v2"):
        return _kserve(head, segments, models, get, post)
    return Match("not_found")


def _predictions(segments: list[str], models: Mapping[str, str], allowed: bool) -> Match:
    if len(segments) < 3:
        return Match("not_found")
    if not allowed:
        return Match("method_not_allowed")
    name = segments[2]
    version = segments[3] if len(segments) > 3 else None
    if name not in models:
        return Match("model_not_found", name)
    if version is not None and version != models[name]:
        return Match("version_not_found", name, version=version)
    return Match("predict", name, "/".join(segments[4:]), version)


def _kserve(head: str, segments: list[str], models: Mapping[str, str], get: bool, post: bool) -> Match:
    rest = segments[2:]
    if head == "v2" and rest in (["health", "live"], ["health", "ready"]):
        return Match("live" if rest[1] == "live" else "ready") if get else Match("method_not_allowed")
    if head == "v2" and not rest:
        return Match("server_meta") if get else Match("method_not_allowed")
    if len(rest) < 2 or rest[0] != "models":
        return Match("not_found")
    if head == "v1" and len(rest) == 2:
        name, _, verb = rest[1].partition(":")
        if verb == "predict" and post:  # TorchServe's KFV1 route: the model's, no url_path
            return Match("predict", name, None) if name in models else Match("model_not_found", name)
        if not verb and get:
            return Match("model_v1", name) if name in models else Match("kserve_model_not_found", name)
        return Match("not_found")
    name = rest[1]
    tail = rest[2:]
    if tail == ["infer"] and post:  # TorchServe's KFV2 route
        return Match("predict", name, None) if name in models else Match("model_not_found", name)
    if tail in ([], ["ready"]) and get:
        if name not in models:
            return Match("kserve_model_not_found", name)
        return Match("model_v2" if not tail else "model_ready", name)
    return Match("not_found")


def served_paths(name: str, version: str = "1.0") -> list[str]:
    """Every path served for one model (wire routes under the predictions path, the KServe and OpenAI ones)."""
    base = f"/predictions/{name}/{version}"
    wire = [f"{base}/{route}" if route else base for route in ROUTES]
    kserve = [f"/v1/models/{name}:predict", f"/v2/models/{name}/infer", f"/v1/models/{name}"]
    kserve += [f"/v2/models/{name}", f"/v2/models/{name}/ready", "/v2/health/live", "/v2/health/ready", "/v2"]
    return [f"/predictions/{name}", *wire, *kserve, *ROOT_ROUTES, "/ping", "/metrics"]


__all__ = ["ERROR_ACTIONS", "HOST_ACTIONS", "ROOT_ROUTES", "Match", "java_split", "match", "served_paths"]
