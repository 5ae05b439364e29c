"""Real peers measured in the same run as our handler: `--peer infinity`, `--peer litserve`.

`PEERS` is the registry of peer kinds (`kind.PeerKind`), one module each (`infinity`, `litserve`): each owns how it
is installed (its pinned requirements under `requirements/`, in stages: torch first, so the local CPU wheel is the
one kept), its command line, its layout, the precisions it runs, the route it answers and the body it takes. A peer
runs in its own venv, as its own process group on a loopback port (`server.PeerServer`), and is stopped with its
whole group however the run ends. Both kinds answer OpenAI-style embeddings; the bench sends them the same texts and
load as our handler, and checks their answers against our float32 reference. Adding a peer: its module here and a
line in `PEERS`.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.inputs.configuration import Configuration
from bench.peers.infinity import Infinity
from bench.peers.kind import PEER_DTYPES, REQUIREMENTS, PeerKind, PeerSetup, PeerUnavailable, venv
from bench.peers.litserve import SERVERS, LitServe
from bench.peers.server import PeerServer, spot_check

PEERS: dict[str, PeerKind] = {kind.name: kind for kind in (Infinity(), LitServe())}

__all__ = [
    "PEERS",
    "PEER_DTYPES",
    "REQUIREMENTS",
    "SERVERS",
    "Infinity",
    "LitServe",
    "PeerKind",
    "PeerServer",
    "PeerSetup",
    "PeerUnavailable",
    "peer_configs",
    "spot_check",
    "venv",
]


def peer_configs(configs: Sequence[Configuration], peer: str, dtypes: Sequence[str] = ()) -> list[Configuration]:
    """The peer on each distinct load of the plan, in each of `dtypes` (none given: each load's own dtype, so a
    peer row has ours of the same precision beside it)."""
    kind = PEERS[peer]
    loads = [kind.config(c, dtype) for c in configs if c.peer is None for dtype in (dtypes or [c.dtype or "float32"])]
    return list(dict.fromkeys(loads))
