"""Benchmark harness and TorchServe tooling; the handler's pure `bucketing` package is importable from here."""

import sys
from pathlib import Path

_HANDLER = str(Path(__file__).resolve().parent.parent / "handler")
if _HANDLER not in sys.path:
    sys.path.insert(0, _HANDLER)
