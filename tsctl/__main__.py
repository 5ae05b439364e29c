"""The local TorchServe of `make serve`: `python -m tsctl start|stop|token|status`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from bucketing.config import STRATEGIES
from model_store import archives

from .client import Endpoints, ServerError
from .process import ROOT, TorchServe
from .signals import exit_on_signals

SERVE_DIR = ROOT / ".tmp" / "serve"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("start", "stop", "token", "status"))
    parser.add_argument("--strategy", default="bucketed", choices=STRATEGIES, help="archive registered at start")
    parser.add_argument("--workdir", type=Path, default=SERVE_DIR)
    parser.add_argument("--free-ports", action="store_true", help="start on free loopback ports, not the config's")
    parser.add_argument("--api", default="inference", choices=("inference", "management"), help="token: whose key")
    args = parser.parse_args(argv)
    server = TorchServe(args.workdir, Endpoints.free() if args.free_ports else None)
    try:
        return _run(server, args)
    except ServerError as e:  # what to look at, in one line; no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1


def _run(server: TorchServe, args: argparse.Namespace) -> int:
    with exit_on_signals():
        if args.command != "token":
            stale = server.clear_stale()  # reported, removed, never acted on
            if stale:
                print(stale)
        if args.command == "token":
            return token(server, args.api)
        return COMMANDS[args.command](server, args.strategy)


def token(server: TorchServe, api: str = "inference") -> int:
    key = server.client.keys.key(api) if server.pid() else None
    if not key:
        print(f"no running TorchServe with a key file in {server.workdir}: start it with `make serve`", file=sys.stderr)
        return 1
    print(key)
    return 0


def stop(server: TorchServe, strategy: str) -> int:
    running = server.pid()
    server.stop()
    print("TorchServe stopped." if running else "TorchServe was not running.")
    return 0


def status(server: TorchServe, strategy: str) -> int:
    pid = server.pid()
    print(f"running (pid {pid}), models: {', '.join(server.client.models()) or 'none'}" if pid else "not running")
    return 0


def start(server: TorchServe, strategy: str) -> int:
    """Start (unless running) and register the strategy's archive; an interrupted start stops what it began."""
    started = server.pid() is None
    try:
        if started:
            server.start()
        name = archives.name(strategy)
        if name not in server.client.models():
            cfg = archives.model_config(strategy)
            server.client.register(f"{name}.mar", name, cfg["batchSize"], cfg["maxBatchDelay"], cfg["minWorkers"])
    except BaseException:
        if started:
            server.stop()
        raise
    e = server.endpoints
    print(f"TorchServe is up: inference {e.inference}, management {e.management}, metrics {e.metrics}")
    print(f"model {name} READY; logs in {server.workdir / 'logs'}; inference token: `make -s token`")
    return 0


COMMANDS: dict[str, Callable[[TorchServe, str], int]] = {"start": start, "stop": stop, "token": token, "status": status}

if __name__ == "__main__":
    sys.exit(main())
