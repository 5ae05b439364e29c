"""`python -m bucketing.hosts.ray.drain --address HOST:GCS_PORT [--app bucketing] [--timeout 25]`: drain the Ray
host's ingress before its cluster (or its node) stops, so that no admitted request is cut.

A Ray head's SIGTERM ends the proxy, the ingress and the replicas with what they hold in flight, and
`serve.shutdown()` does likewise. This driver connects to the cluster and calls the ingress's `drain` through its
deployment handle (`app.Ingress.drain`, `front.Front.drain`): from then on predictions get a 503 with `Retry-After`
and readiness says no, those admitted are answered, and newcomers keep getting 503 until none came for a second.
Then stop the cluster. `make stop` runs it before the head's SIGTERM (`tsctl.ray.RayServe.drain`); on KubeRay, a
head pod's `preStop` hook may run it. It prints one line; exit 0: every admitted request answered, 1: some still
running when the time was up, 2: the ingress could not be reached (said why).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from bucketing.hosts.ray.args import INGRESS

CONNECT_S = 60.0  # beyond the drain's own time: joining the cluster and reaching the ingress
APP = "bucketing"  # the application's name in config/ray/serve.yaml


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="python -m bucketing.hosts.ray.drain", description="Drain the Ray ingress.")
    made.add_argument("--address", required=True, help="the cluster's GCS address, HOST:PORT")
    made.add_argument("--app", default=APP, help=f"the Serve application's name (default {APP})")
    made.add_argument("--timeout", type=float, default=25.0, help="s given to what was admitted (default 25)")
    return made


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import ray
    from ray import serve

    try:
        ray.init(address=args.address, logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)
        try:
            handle = serve.get_deployment_handle(INGRESS, app_name=args.app)
            result = handle.drain.remote(args.timeout).result(timeout_s=args.timeout + CONNECT_S)
        finally:
            ray.shutdown()
    except Exception as e:  # noqa: BLE001 - said in one line: the caller stops the cluster anyway
        print(f"drain: the ingress of {args.app!r} at {args.address} was not reached: {type(e).__name__}: {e}")
        return 2
    if result["answered"]:
        print("drain: every admitted request answered")
        return 0
    print(f"drain: {result['in_flight']} request(s) still running after {args.timeout:g} s")
    return 1


if __name__ == "__main__":
    sys.exit(main())
