"""The "TorchServe's own commands" block of docs/operations/torchserve.md, run verbatim: stage, torch-model-archiver,
torchserve --start, curl, torchserve --stop; the answer equals batch-of-one and nothing is left running."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from model_store.archives import ROOT
from tests.e2e.conftest import processes_under
from tsctl import free_ports, read_properties

pytestmark = pytest.mark.e2e

BLOCK = re.compile(r"<!-- torchserve-commands.*?-->\n```bash\n(.*?)```\n<!-- /torchserve-commands -->", re.S)


PAGE = ROOT / "docs" / "operations" / "torchserve.md"


def docs_block() -> str:
    match = BLOCK.search(PAGE.read_text())
    assert match, "docs/operations/torchserve.md lost its torchserve-commands block"
    return match.group(1)


def scratch_checkout(root, inference: int) -> None:
    """A folder laid out like the repository root (its handler, venv; a config of free ports; an empty store)."""
    for name in ("handler", ".venv"):
        (root / name).symlink_to(ROOT / name)
    (root / "config").mkdir()
    (root / "model_store").mkdir()
    props = read_properties(ROOT / "config" / "config.properties")
    ports = [inference, *free_ports(4)]
    keys = ("inference_address", "management_address", "metrics_address")
    props.update({k: f"http://127.0.0.1:{p}" for k, p in zip(keys, ports)})
    props.update(grpc_inference_port=str(ports[3]), grpc_management_port=str(ports[4]))
    (root / "config" / "config.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))


def test_the_documented_torchserve_commands_serve_the_batch_of_one_answer(tmp_path, reference):
    root = tmp_path / "checkout"
    root.mkdir()
    (tmp_path / "tmp").mkdir()
    inference = free_ports(1)[0]
    scratch_checkout(root, inference)
    script = docs_block().replace("127.0.0.1:8580", f"127.0.0.1:{inference}")
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONSAFEPATH": "1"}  # python -m finds the package
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
            start_new_session=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        lines = done.stdout.splitlines()
        assert any(line.startswith("torch-model-archiver --model-name minilm-bucketed") for line in lines)
        answer = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
        assert np.max(np.abs(np.array(answer["embedding"]) - reference("short query"))) <= 1e-5
        assert (root / "model_store" / "minilm-bucketed.mar").is_file()
        assert processes_under(tmp_path) == [], "torchserve --stop left processes behind"
    finally:
        if processes_under(tmp_path):  # the block failed half-way: stop what it started, then end what is left
            subprocess.run(
                [shutil.which("torchserve", path=str(ROOT / ".venv" / "bin")) or "torchserve", "--stop"],
                cwd=root / ".tmp" / "ts",
                env=env,
                capture_output=True,
                timeout=60,
            )
            for pid in processes_under(tmp_path):  # this test's own server: its folder is in their arguments
                os.kill(pid, signal.SIGKILL)


def test_the_documented_archiver_line_is_the_one_the_builder_prints():
    """From the repository root, `--print-commands` prints exactly the documented torch-model-archiver line."""
    block = docs_block().replace("\\\n", " ")
    documented = " ".join(next(line for line in block.splitlines() if line.startswith("torch-model-archiver")).split())
    command = [sys.executable, "-m", "model_store.build", "--print-commands", "--strategies", "bucketed"]
    printed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    assert documented in [" ".join(line.split()) for line in printed.splitlines()], printed
