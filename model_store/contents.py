"""What a built archive carries, read back from the .mar (a zip, as torch-model-archiver writes it)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import yaml


def archived_config(mar: Path) -> dict[str, Any] | None:
    """The model-config an archive carries (its manifest's `configFile`), or None (no archive, none carried)."""
    try:
        with zipfile.ZipFile(mar) as archive:
            manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
            name = (manifest.get("model") or {}).get("configFile")
            loaded = yaml.safe_load(archive.read(name)) if name else None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, yaml.YAMLError):
        return None
    return loaded if isinstance(loaded, dict) else None
