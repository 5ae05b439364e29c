"""`python -m bucketing.hosts.standalone`: serve one model without TorchServe (docs/hosts/standalone.md).

    python -m bucketing.hosts.standalone --archive model_store/minilm-bucketed.mar --port 8590
    python -m bucketing.hosts.standalone --model-config config/minilm.yaml --model-dir DIR --name minilm
    python -m bucketing.hosts.standalone --model-dir DIR

Authorization is on unless `--no-auth`: the key is `$BUCKETING_INFERENCE_KEY`, else the `inference` key of
`--key-file` (TorchServe's `key_file.json` shape), which is written with a new random key when absent.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bucketing.hosts.standalone import models
from bucketing.hosts.standalone.app import App, Settings

KEY_ENV = "BUCKETING_INFERENCE_KEY"
logger = logging.getLogger("bucketing.hosts.standalone")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bucketing.hosts.standalone", description=__doc__.splitlines()[0])
    source = p.add_argument_group("model (one of --model, --archive, --model-config, --model-dir)")
    source.add_argument(
        "--model",
        type=Path,
        help="an archive, a folder holding one (itself or in model-store/), or a model folder (with its "
        "model-config.yaml, if any): what KServe mounts at /mnt/models",
    )
    source.add_argument("--archive", type=Path, help="an archive built by model_store.build (.mar)")
    source.add_argument("--model-config", type=Path, help="a model-config YAML (handler: section and batching keys)")
    source.add_argument("--model-dir", type=Path, help="the model folder (with --model-config: instead of model_path)")
    source.add_argument("--name", help="the model's name in the URLs (default: the archive's, else the folder's)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--workers", type=int, help="workers (the model-config's minWorkers)")
    p.add_argument("--threads", type=int, help="threads per worker (handler.torch_threads)")
    p.add_argument("--batch-size", type=int, help="requests per batch at most (batchSize)")
    p.add_argument("--max-batch-delay", type=float, help="ms a request waits for its batch at most (maxBatchDelay)")
    p.add_argument(
        "--max-batch-tokens", type=int, help="estimated tokens per batch at most (default: handler.max_batch_tokens)"
    )
    p.add_argument("--queue-size", type=int, default=Settings.queue_size, help="requests waiting at most (then 503)")
    p.add_argument("--max-request-bytes", type=int, default=Settings.max_request_bytes, help="body limit (then 413)")
    p.add_argument("--request-timeout", type=float, help="s per request (default: the model-config's responseTimeout)")
    p.add_argument(
        "--grace-period",
        type=float,
        default=Settings.grace_period_s,
        help="s from SIGTERM to exit at most (the pod's terminationGracePeriodSeconds)",
    )
    p.add_argument("--drain-timeout", type=float, help="s to answer on SIGTERM (default: the grace period less 3 s)")
    auth = p.add_argument_group("authorization")
    auth.add_argument("--key-file", type=Path, help=f"key file (else ${KEY_ENV}; one is written when absent)")
    auth.add_argument("--no-auth", action="store_true", help="serve without authorization (behind an edge that has it)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def read_key(key_file: Path | None) -> str:
    """The inference key: the environment's, else the key file's (written, user-only, with a new key if absent)."""
    env = os.environ.get(KEY_ENV)
    if env:
        return env
    if key_file is None:
        raise SystemExit(f"error: authorization is on: give --key-file, set ${KEY_ENV}, or pass --no-auth")
    try:
        key = json.loads(key_file.read_text())["inference"]["key"]
        if isinstance(key, str) and key:
            return key
    except FileNotFoundError:
        pass
    except (ValueError, KeyError, TypeError) as e:
        why = f"error: {key_file}: no inference key in it ({type(e).__name__}); remove it to make one"
        raise SystemExit(why) from None
    key = secrets.token_urlsafe(24)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"inference": {"key": key}}, f, indent=2)
    return key


def spec_of(args: argparse.Namespace, unpack_dir: Path) -> models.ModelSpec:
    if sum(x is not None for x in (args.model, args.archive, args.model_config)) > 1:
        raise models.ModelSourceError("give one of --model, --archive and --model-config")
    if args.model is not None:
        spec = models.from_path(args.model, unpack_dir, args.name)
    elif args.archive is not None:
        spec = models.from_archive(args.archive, unpack_dir, args.name)
    elif args.model_config is not None:
        spec = models.from_model_config(args.model_config, args.model_dir, args.name)
    elif args.model_dir is not None:
        spec = models.from_model_dir(args.model_dir, args.name)
    else:
        raise models.ModelSourceError("give the model: --archive X.mar, --model-config YAML or --model-dir DIR")
    return spec.with_overrides(
        threads=args.threads,
        workers=args.workers,
        batch_size=args.batch_size,
        max_batch_delay_ms=args.max_batch_delay,
    )


def open_worker(spec: models.ModelSpec, cost: Any = None) -> Any:
    """One worker of the spec (in the calling thread: the worker's own); `cost`: a sibling worker's cost model."""
    from bucketing import worker

    return worker.open(spec.config, spec.model_dir, None, spec.model_yaml, cost)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    key = None if args.no_auth else read_key(args.key_file)
    with tempfile.TemporaryDirectory(prefix="bucketing-standalone-") as unpack_dir:
        try:
            spec = spec_of(args, Path(unpack_dir))
        except (models.ModelSourceError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        import torch

        torch.set_num_threads(spec.config.torch_threads)  # as the handler does; the engines read the config's too
        settings = Settings(
            key=key,
            max_request_bytes=args.max_request_bytes,
            queue_size=args.queue_size,
            request_timeout_s=args.request_timeout,
            grace_period_s=args.grace_period,
            drain_timeout_s=args.drain_timeout,
            max_batch_tokens=args.max_batch_tokens,
        )
        app = App([spec], settings, open_worker)
        logger.info(
            "serving %s (%s) on http://%s:%d, authorization %s",
            spec.name,
            spec.source,
            args.host,
            args.port,
            "on" if key else "off",
        )
        from bucketing.hosts.standalone.server import run

        return run(app, args.host, args.port, args.log_level)


if __name__ == "__main__":
    sys.exit(main())
