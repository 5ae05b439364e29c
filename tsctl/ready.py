"""Whether a TorchServe's models can answer, for a container's readiness probe: `python -m tsctl.ready --config PATH`.

Ready means every model of the config's `model_snapshot` (the models loaded at start) has at least its
`minWorkers` workers READY, as the management API named in the same config describes them. Exit 0 when ready;
otherwise 1 and one line saying why. TorchServe's own health routes cannot be the probe: `/ping` answers 200 even
"Unhealthy" (and "Healthy" before a snapshot's model is registered), and `/v2/health/ready` always answers ready.
The management API is asked without a token: the KServe image's config has token authorization off and keeps
management on the pod's loopback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .client import Reply, read_properties, request

BUDGET_S = 3.0  # all the probe's calls together: under the runtime's readiness timeoutSeconds (5), with start-up


def snapshot_models(props: dict[str, str]) -> dict[str, int]:
    """The models a config loads at start (its `model_snapshot`), each with the workers it must have READY."""
    raw = props.get("model_snapshot")
    if not raw:
        raise ValueError("the config has no model_snapshot: no model is loaded at start, so none can be waited for")
    try:
        wanted = {}
        for name, versions in json.loads(raw)["models"].items():
            default = next((v for v in versions.values() if v.get("defaultVersion")), next(iter(versions.values())))
            wanted[name] = max(1, int(default.get("minWorkers", 1)))
    except (ValueError, KeyError, TypeError, AttributeError, StopIteration) as e:
        why = f"{type(e).__name__}: {e}" if str(e) else "a model without versions"
        raise ValueError(f"model_snapshot is not TorchServe's snapshot JSON ({why})") from None
    return wanted


def workers_ready(describe: Any, min_workers: int) -> tuple[bool, str]:
    """Whether a `GET /models/NAME` answer shows `min_workers` workers READY, and what it shows."""
    try:
        states = [w.get("status") for w in describe[0].get("workers", [])]
    except (IndexError, KeyError, TypeError, AttributeError):
        return False, "an answer that is not a model description"
    ready = states.count("READY")
    return ready >= min_workers, f"{ready} of {min_workers} workers READY ({', '.join(map(str, states)) or 'none'})"


def management_url(props: dict[str, str]) -> str:
    """The management API's base URL; a wildcard address is reached on loopback."""
    parts = urllib.parse.urlsplit(props.get("management_address", "http://127.0.0.1:8081"))
    host = "127.0.0.1" if parts.hostname in (None, "0.0.0.0", "::") else parts.hostname
    return f"{parts.scheme or 'http'}://{host}:{parts.port or 8081}"


def problems(
    props: dict[str, str],
    budget: float = BUDGET_S,
    ask: Callable[..., Reply] = request,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """What keeps the config's models from being ready; empty when all are. All the calls share `budget` seconds
    (within the probe's own timeout), so a hung management API is named, not killed mid-answer by the kubelet."""
    found = []
    base = management_url(props)
    deadline = clock() + budget
    for name, min_workers in snapshot_models(props).items():
        left = deadline - clock()
        if left <= 0:
            found.append(f"{name}: not asked, the probe's {budget:g} s ran out")
            continue
        try:
            reply = ask(f"{base}/models/{urllib.parse.quote(name)}", timeout=left)
        except OSError as e:
            found.append(f"{name}: management API at {base} unreachable ({type(e).__name__})")
            continue
        if reply.status != 200:
            found.append(f"{name}: HTTP {reply.status} from the management API")
            continue
        try:
            ok, what = workers_ready(reply.json(), min_workers)
        except ValueError:
            ok, what = False, "an answer that is not JSON"
        if not ok:
            found.append(f"{name}: {what}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the config.properties TorchServe was started with")
    parser.add_argument(
        "--timeout", type=float, default=BUDGET_S, help="seconds for all the calls to the management API together"
    )
    args = parser.parse_args(argv)
    try:
        found = problems(read_properties(args.config), args.timeout)
    except (OSError, ValueError) as e:
        print(f"not ready: {e}", file=sys.stderr)
        return 1
    if found:
        print(f"not ready: {'; '.join(found)}", file=sys.stderr)
        return 1
    print("ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
