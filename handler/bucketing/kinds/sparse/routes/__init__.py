"""The sparse kind's route kinds, one module each (`base.RouteKind`: how its modules are read, what it answers on
torch and on the graph engines, what it refuses): adding one is its module and one line below (and its name in
`base.RouteKindName`). The route kinds import none of the modules above this registry (`folder`, `task`, `onnx`):
those find a route's kind here (`kind_of`) and hand it what it needs."""

from __future__ import annotations

from bucketing.kinds.sparse.routes.base import Loaded, Route, RouteKind, RouteKindName
from bucketing.kinds.sparse.routes.csr import CSR
from bucketing.kinds.sparse.routes.splade import SPLADE
from bucketing.kinds.sparse.routes.static import STATIC

__all__ = ["ROUTE_KINDS", "Loaded", "Route", "RouteKind", "RouteKindName", "kind_of"]

ROUTE_KINDS: dict[str, RouteKind] = {k.name: k for k in (SPLADE, STATIC, CSR)}  # by name, in the order lines say them


def kind_of(route: Route) -> RouteKind:
    """What a route's kind does."""
    return ROUTE_KINDS[route.kind]
