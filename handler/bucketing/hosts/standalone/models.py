"""What the standalone server serves: one model from a model folder, an archive we build, or a model-config.

- `--archive X.mar`: unpacked into a temporary folder (members checked to stay inside it); its model-config (the
  manifest's `configFile`) and its model folder (`handler.model_path` inside it) are read as TorchServe reads them;
  its name and version are the manifest's. The archive's own copy of the `bucketing` package is not used: the
  installed one serves (as in the KServe image).
- `--model-config YAML`: the same file an archive is built with (top-level `batchSize`, `maxBatchDelay`,
  `minWorkers`, `responseTimeout`; the `handler:` section as the handler reads it), and the model folder: `--model-dir`,
  else `handler.model_path` (relative to the YAML's folder).
- `--model-dir DIR`: the handler's defaults over that folder.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bucketing.config import HandlerConfig

DEFAULT_VERSION = "1.0"  # our archives' (`model_store.archiver`), and the version a folder is served under
# TorchServe's model-config keys the host reads, with the values it takes when the file has none.
DEFAULT_BATCH_SIZE = 16
DEFAULT_BATCH_DELAY_MS = 10.0
DEFAULT_WORKERS = 1
RESPONSE_TIMEOUT_S = 120.0  # TorchServe's default responseTimeout


class ModelSourceError(ValueError):
    """A model source that cannot be served; the message says what to fix."""


@dataclass(frozen=True)
class ModelSpec:
    """One model to serve: its name and version, folder, handler settings, whole model-config, and batching."""

    name: str
    version: str
    model_dir: str
    config: HandlerConfig
    model_yaml: dict[str, Any] = field(default_factory=dict)
    batch_size: int = DEFAULT_BATCH_SIZE
    max_batch_delay_ms: float = DEFAULT_BATCH_DELAY_MS
    workers: int = DEFAULT_WORKERS
    source: str = ""

    @property
    def response_timeout_s(self) -> float:
        """The model-config's responseTimeout (TorchServe's default where it has none)."""
        value = self.model_yaml.get("responseTimeout", RESPONSE_TIMEOUT_S)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        return float(value) if ok else RESPONSE_TIMEOUT_S

    def with_overrides(
        self,
        threads: int | None = None,
        workers: int | None = None,
        batch_size: int | None = None,
        max_batch_delay_ms: float | None = None,
        max_batch_tokens: int | None = None,
    ) -> ModelSpec:
        """This spec with a host's own batching and threads (its flags, its args) over the model-config's; None
        keeps the model-config's."""
        config = self.config
        if threads is not None:
            config = replace(config, torch_threads=threads)
        if max_batch_tokens is not None:
            config = replace(config, max_batch_tokens=max_batch_tokens)
        return replace(
            self,
            config=config,
            workers=self.workers if workers is None else workers,
            batch_size=self.batch_size if batch_size is None else batch_size,
            max_batch_delay_ms=self.max_batch_delay_ms if max_batch_delay_ms is None else max_batch_delay_ms,
        )


def _positive(cfg: dict[str, Any], key: str, default: float) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ModelSourceError(f"model-config {key}: expected a number >= 0, got {value!r:.40}")
    return float(value)


def from_yaml(cfg: Any, model_dir: Path, name: str, version: str = DEFAULT_VERSION, source: str = "") -> ModelSpec:
    """A spec from a whole model-config mapping (None: every default) over a model folder."""
    cfg = dict(cfg or {})
    if not isinstance(cfg, dict):
        raise ModelSourceError(f"model-config: expected a mapping, got {type(cfg).__name__}")
    config = HandlerConfig.from_yaml(cfg)
    if not model_dir.is_dir():
        raise ModelSourceError(f"{model_dir}: no such model folder")
    return ModelSpec(
        name=name,
        version=version,
        model_dir=str(model_dir.resolve()),
        config=config,
        model_yaml=cfg,
        batch_size=max(1, int(_positive(cfg, "batchSize", DEFAULT_BATCH_SIZE))),
        max_batch_delay_ms=_positive(cfg, "maxBatchDelay", DEFAULT_BATCH_DELAY_MS),
        workers=max(1, int(_positive(cfg, "minWorkers", DEFAULT_WORKERS))),
        source=source,
    )


def from_model_dir(model_dir: Path, name: str | None = None) -> ModelSpec:
    """The handler's defaults over a model folder; named after the folder unless told."""
    return from_yaml(None, model_dir, name or model_dir.resolve().name, source=f"model folder {model_dir}")


def from_model_config(path: Path, model_dir: Path | None = None, name: str | None = None) -> ModelSpec:
    """A model-config file over `model_dir`, else over its `handler.model_path` (relative to the file's folder)."""
    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ModelSourceError(f"{path}: cannot read the model-config ({e})") from None
    if model_dir is None:
        relative = HandlerConfig.from_yaml(cfg).model_path
        model_dir = path.parent / relative
    return from_yaml(cfg, model_dir, name or model_dir.resolve().name, source=f"model-config {path}")


def unpack(archive: Path, into: Path) -> None:
    """Extract an archive into `into`, refusing any member that would land outside it (or is a link)."""
    root = into.resolve()
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                target = (root / info.filename).resolve()
                if not target.is_relative_to(root) or (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise ModelSourceError(f"{archive}: member {info.filename!r:.80} would land outside the folder")
            zf.extractall(root)
    except (OSError, zipfile.BadZipFile) as e:
        raise ModelSourceError(f"{archive}: not an archive we can read ({e})") from None


def from_archive(archive: Path, into: Path, name: str | None = None) -> ModelSpec:
    """An archive unpacked into `into` (a fresh folder the caller removes), served as TorchServe would."""
    unpack(archive, into)
    manifest_path = into / "MAR-INF" / "MANIFEST.json"
    try:
        manifest = json.loads(manifest_path.read_text()).get("model", {})
    except (OSError, ValueError) as e:
        raise ModelSourceError(f"{archive}: no readable MAR-INF/MANIFEST.json ({e})") from None
    config_file = manifest.get("configFile")
    cfg = yaml.safe_load((into / config_file).read_text()) if config_file else None
    model_path = HandlerConfig.from_yaml(cfg).model_path
    model_dir = Path(model_path) if os.path.isabs(model_path) else into / model_path
    return from_yaml(
        cfg,
        model_dir,
        name or str(manifest.get("modelName") or archive.stem),
        str(manifest.get("modelVersion") or DEFAULT_VERSION),
        source=f"archive {archive}",
    )


def from_path(path: Path, into: Path, name: str | None = None) -> ModelSpec:
    """What KServe mounts at /mnt/models, whichever it is: an archive; a folder holding exactly one archive (itself,
    or in `model-store/`, the layout of our TorchServe runtime); a model folder (`config.json`), over its own
    `model-config.yaml` when it has one."""
    if path.is_file():
        return from_archive(path, into, name)
    if not path.is_dir():
        raise ModelSourceError(f"{path}: no such archive or folder")
    if (path / "config.json").is_file():
        config = path / "model-config.yaml"
        return from_model_config(config, path, name) if config.is_file() else from_model_dir(path, name)
    found = sorted(path.glob("*.mar")) or sorted(path.glob("model-store/*.mar"))
    if len(found) != 1:
        held = ", ".join(p.name for p in found) or "none"
        raise ModelSourceError(f"{path}: expected one archive (.mar) or a model folder (config.json); archives: {held}")
    return from_archive(found[0], into, name)


__all__ = [
    "ModelSourceError",
    "ModelSpec",
    "from_archive",
    "from_model_config",
    "from_model_dir",
    "from_path",
    "from_yaml",
]
