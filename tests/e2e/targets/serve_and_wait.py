"""Run by test_signals.py, never collected on its own: holds the session's TorchServe until a signal ends pytest."""

from __future__ import annotations

import os
import time
from pathlib import Path


def test_hold_the_server(torchserve):
    Path(os.environ["READY_FILE"]).write_text(str(torchserve.workdir))
    time.sleep(300)
