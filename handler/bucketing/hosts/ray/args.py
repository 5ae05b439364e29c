"""The Ray application's args (`build(args)`, config/ray/serve.yaml's `args:`), parsed and checked before any
replica starts: no Ray here."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bucketing.hosts.ray.front import Limits
from bucketing.hosts.standalone import models

INGRESS = "Ingress"  # the HTTP ingress's deployment (no model may take its name)


class ArgsError(ValueError):
    """Application args that cannot be served; the message says what to fix."""


@dataclass(frozen=True)
class ModelArgs:
    model: str
    name: str | None = None
    threads: int | None = None
    batch_size: int | None = None
    max_batch_delay_ms: float | None = None
    max_batch_tokens: int | None = None
    ray_actor_options: dict[str, Any] = field(default_factory=dict)
    autoscaling_config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AppArgs:
    models: tuple[ModelArgs, ...]
    key_file: str | None = None
    no_auth: bool = False
    max_request_bytes: int = Limits.max_request_bytes
    request_timeout_s: float | None = None

    @staticmethod
    def parse(args: Mapping[str, Any]) -> AppArgs:
        known = {"models", "key_file", "no_auth", "max_request_bytes", "request_timeout_s"}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ArgsError(f"bucketing.hosts.ray args: unknown {unknown}; known: {sorted(known)}")
        raw = args.get("models")
        if not isinstance(raw, list) or not raw:
            raise ArgsError("bucketing.hosts.ray args: `models` must list at least one {model: PATH}")
        model_keys = set(ModelArgs.__dataclass_fields__)
        parsed = []
        for entry in raw:
            if not isinstance(entry, dict) or "model" not in entry or set(entry) - model_keys:
                raise ArgsError(
                    f"bucketing.hosts.ray args: a model is {{model: PATH, ...}} with keys in "
                    f"{sorted(model_keys)}; got {entry!r:.120}"
                )
            if not os.path.isabs(str(entry["model"])):
                raise ArgsError(
                    f"bucketing.hosts.ray args: model {entry['model']!r}: give an absolute path (every "
                    "node, and the process building the app, reads it at that path)"
                )
            parsed.append(ModelArgs(**entry))
        return AppArgs(
            models=tuple(parsed),
            key_file=args.get("key_file"),
            no_auth=bool(args.get("no_auth", False)),
            max_request_bytes=int(args.get("max_request_bytes", Limits.max_request_bytes)),
            request_timeout_s=args.get("request_timeout_s"),
        )


def read_spec(margs: ModelArgs, unpack_dir: Path) -> models.ModelSpec:
    """The model's spec (an archive unpacked into `unpack_dir`), with the args' batching and threads over it."""
    spec = models.from_path(Path(margs.model), unpack_dir, margs.name)
    return spec.with_overrides(
        threads=margs.threads,
        batch_size=margs.batch_size,
        max_batch_delay_ms=margs.max_batch_delay_ms,
        max_batch_tokens=margs.max_batch_tokens,
    )


def fix_replicas(deployment: dict[str, Any], replicas: int) -> dict[str, Any]:
    """A config's `deployments:` entry for a model set to exactly `replicas` replicas, in place: `num_replicas`, and
    `autoscaling_config: null`. The app sets autoscaling in its code (`app.AUTOSCALING`), and Ray keeps a
    deployment's code autoscaling beside a config's `num_replicas` (it then starts `min_replicas` and scales): only
    an explicit null in the config turns it off."""
    deployment["num_replicas"] = replicas
    deployment["autoscaling_config"] = None
    return deployment
