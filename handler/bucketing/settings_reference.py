"""The settings reference: the table of `handler:` keys (docs/configuration/settings.md, between its markers), built
from `config.py`'s declarations, one source; `python -m bucketing.settings_reference` prints it."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import fields
from typing import Any

from bucketing.config import HandlerConfig


def markdown_table() -> str:
    """The table of `handler:` keys in docs/configuration/settings.md, built from the declarations."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for name, f, default in _leaves(HandlerConfig):
        lines.append(f"| `{name}` | {_shown(default)} | {f.metadata['doc']} |")
    return "\n".join(lines) + "\n"


def _shown(default: Any) -> str:
    if isinstance(default, dict):
        return "{}"
    if isinstance(default, str) and not default:
        return '""'
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, str):
        return f"`{default}`"
    return f"{default:g}" if isinstance(default, float) else str(default)


def _leaves(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field[Any], Any]]:
    out = []
    for f in fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(default):
            out.extend(_leaves(type(default), f"{prefix}{f.name}."))
        else:
            out.append((f"{prefix}{f.name}", f, default))
    return out


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
