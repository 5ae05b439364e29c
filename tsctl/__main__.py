"""The local TorchServe of `make serve`, the standalone server of `make serve-standalone` and the Ray host of `make
serve-ray`: `python -m tsctl start|standalone|ray|stop|token|status`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from bucketing.config import STRATEGIES
from model_store import archives
from model_store.bulk import BULK_THREADS, BULK_WORKERS, bulk_response_timeout_s  # `start --bulk`: docs/api/bulk.md
from model_store.contents import archived_config

from .client import Endpoints, ServerError
from .process import ROOT, TorchServe
from .ray import RayServe
from .signals import exit_on_signals
from .standalone import Standalone

SERVE_DIR = ROOT / ".tmp" / "serve"
DRAIN_S = 25.0  # `stop`: under Kubernetes' default 30 s grace period, as the standalone host's


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("start", "standalone", "ray", "stop", "token", "status"))
    parser.add_argument("--strategy", default="bucketed", choices=STRATEGIES, help="archive registered at start")
    parser.add_argument("--workdir", type=Path, default=SERVE_DIR)
    parser.add_argument("--free-ports", action="store_true", help="start on free loopback ports, not the config's")
    parser.add_argument("--api", default="inference", choices=("inference", "management"), help="token: whose key")
    parser.add_argument(
        "--bulk",
        action="store_true",
        help=f"start: also register the strategy's {BULK_THREADS}-thread archive as NAME-bulk, {BULK_WORKERS} worker, "
        "for bulk requests (build it first: `python -m model_store.build --bulk --strategies STRATEGY`)",
    )
    parser.add_argument("--standalone-dir", type=Path, default=None, help="the standalone server's folder")
    parser.add_argument(
        "--drain",
        type=float,
        default=DRAIN_S,
        help="stop: seconds TorchServe and the Ray host get to answer what they admitted before SIGTERM (0: none)",
    )
    parser.add_argument("--ray-dir", type=Path, default=None, help="the Ray host's folder (its local cluster's)")
    args = parser.parse_args(argv)
    server = TorchServe(args.workdir, Endpoints.free() if args.free_ports else None)
    try:
        return _run(server, args)
    except ServerError as e:  # what to look at, in one line; no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1


def _run(server: TorchServe, args: argparse.Namespace) -> int:
    alone = Standalone(args.standalone_dir) if args.standalone_dir else Standalone()
    on_ray = RayServe(args.ray_dir) if args.ray_dir else RayServe()
    with exit_on_signals():
        if args.command != "token":
            for stale in (server.clear_stale(), alone.clear_stale(), on_ray.clear_stale()):  # reported, removed
                if stale:
                    print(stale)
        if args.command == "token":
            return token(server, args.api, alone, on_ray)
        if args.command == "start":
            return start(server, args.strategy, args.bulk)
        if args.command == "standalone":
            return start_standalone(alone, args.strategy)
        if args.command == "ray":
            return start_ray(on_ray, args.strategy)
        if args.command == "stop":
            return stop(server, args.strategy, alone, on_ray, args.drain)
        if args.command == "status":
            return status(server, args.strategy, alone, on_ray)
        return COMMANDS[args.command](server, args.strategy)


def token(
    server: TorchServe, api: str = "inference", alone: Standalone | None = None, on_ray: RayServe | None = None
) -> int:
    key = server.client.keys.key(api) if server.pid() else None
    if not key and alone is not None and api == "inference" and alone.pid():  # the standalone server's, else
        key = alone.key()
    if not key and on_ray is not None and api == "inference" and on_ray.pid():  # the Ray host's
        key = on_ray.key()
    if not key:
        print(
            f"no running TorchServe with a key file in {server.workdir} (nor a standalone server, nor a Ray host): "
            "start it with `make serve` (or `make serve-standalone`, `make serve-ray`)",
            file=sys.stderr,
        )
        return 1
    print(key)
    return 0


def stop(
    server: TorchServe,
    strategy: str,
    alone: Standalone | None = None,
    on_ray: RayServe | None = None,
    drain_s: float = 0.0,
) -> int:
    running = server.pid()
    drained = server.stop(drain_s=drain_s)
    if running and not drained:
        print(f"TorchServe still had requests after {drain_s:g} s of draining; stopped anyway.")
    print("TorchServe stopped." if running else "TorchServe was not running.")
    if alone is not None and alone.pid():
        code = alone.stop()
        print("Standalone server stopped." + (f" (exit {code})" if code not in (None, 0) else ""))
    if on_ray is not None and on_ray.pid():
        if drain_s > 0 and not on_ray.drain(drain_s):
            print(f"The Ray host's ingress did not drain in {drain_s:g} s (see {on_ray.log}); stopped anyway.")
        on_ray.stop()
        print("Ray host stopped (its local Ray cluster with it).")
    return 0


def status(server: TorchServe, strategy: str, alone: Standalone | None = None, on_ray: RayServe | None = None) -> int:
    pid = server.pid()
    print(f"running (pid {pid}), models: {', '.join(server.client.models()) or 'none'}" if pid else "not running")
    if alone is not None and (spid := alone.pid()):
        print(f"standalone server running (pid {spid}) on {alone.url}")
    if on_ray is not None and (rpid := on_ray.pid()):
        print(f"Ray host running (head pid {rpid}, cluster {on_ray.address}) on {on_ray.url}")
    return 0


def start(server: TorchServe, strategy: str, bulk: bool = False) -> int:
    """Start (unless running) and register the strategy's archive (and, with `bulk`, its bulk registration); an
    interrupted start stops what it began."""
    name = archives.name(strategy)
    bulk_archive = archives.name(strategy, BULK_THREADS)
    timeout = bulk_response_timeout_s()
    if bulk:
        check_bulk_archive(Path(server.properties["model_store"]) / f"{bulk_archive}.mar", strategy, timeout)
    started = server.pid() is None
    try:
        if started:
            server.start()
        cfg = archives.model_config(strategy)
        registered = server.client.models()
        if name not in registered:
            server.client.register(f"{name}.mar", name, cfg["batchSize"], cfg["maxBatchDelay"], cfg["minWorkers"])
        if bulk and f"{name}-bulk" not in registered:
            server.client.register(
                f"{bulk_archive}.mar", f"{name}-bulk", cfg["batchSize"], cfg["maxBatchDelay"], BULK_WORKERS, timeout
            )
    except BaseException:
        if started:
            server.stop()
        raise
    e = server.endpoints
    print(f"TorchServe is up: inference {e.inference}, management {e.management}, metrics {e.metrics}")
    print(f"model {name} READY; logs in {server.workdir / 'logs'}; inference token: `make -s token`")
    if bulk:
        print(
            f"model {name}-bulk READY ({BULK_WORKERS} worker x {BULK_THREADS} threads, responseTimeout {timeout} s): "
            "send bulk requests there"
        )
    return 0


def check_bulk_archive(mar: Path, strategy: str, timeout: int) -> None:
    """The bulk registration's archive is there and carries a responseTimeout sized for bulk requests (TorchServe
    0.12 takes the model-config's over the registration's): else one line naming the build that makes it."""
    build = f"`.venv/bin/python -m model_store.build --bulk --strategies {strategy}`"
    if not mar.exists():
        raise ServerError(f"--bulk: {mar.name} is not in the model store: build it with {build}")
    given = (archived_config(mar) or {}).get("responseTimeout", 120)
    if not isinstance(given, int) or given < timeout:
        raise ServerError(
            f"--bulk: {mar.name} has responseTimeout {given} s, under the {timeout} s a bulk request needs "
            f"(model_store.bulk): build it again with {build}"
        )


def start_standalone(alone: Standalone, strategy: str) -> int:
    """The strategy's archive on the standalone server (`make serve-standalone`), under the name `make serve`
    registers it with; its URL, once every model is ready."""
    name = archives.name(strategy)
    mar = archives.STORE / f"{name}.mar"
    if not mar.exists():
        raise ServerError(f"{mar} is not built: `make mar` (or `.venv/bin/python -m model_store.build`)")
    if alone.pid() is None:
        alone.start(["--archive", str(mar), "--name", name])
    print(alone.url)
    print(f"model {name} READY (standalone, pid {alone.pid()}); log {alone.log}; inference token: `make -s token`")
    return 0


def start_ray(on_ray: RayServe, strategy: str) -> int:
    """The strategy's archive on a local Ray cluster (`make serve-ray`), under the name `make serve` registers it
    with; its URL, once the model is ready."""
    name = archives.name(strategy)
    mar = archives.STORE / f"{name}.mar"
    if not mar.exists():
        raise ServerError(f"{mar} is not built: `make mar` (or `.venv/bin/python -m model_store.build`)")
    if on_ray.pid() is None:
        on_ray.start(mar, name)
    print(on_ray.url)
    print(
        f"model {name} READY (Ray Serve, head pid {on_ray.pid()}, cluster {on_ray.address}); log {on_ray.log}, "
        f"Ray's logs in {on_ray.temp_dir}; inference token: `make -s token`"
    )
    return 0


COMMANDS: dict[str, Callable[[TorchServe, str], int]] = {"start": start, "stop": stop, "token": token, "status": status}

if __name__ == "__main__":
    sys.exit(main())
