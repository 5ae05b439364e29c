"""A real TorchServe on free loopback ports (token auth on), with freshly built archives; stopped at the end."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_store.archives import minilm_dir
from tsctl import Client, Endpoints, Reply, TorchServe, free_ports
from tsctl.inprocess import LocalContext


def processes_under(folder: Path) -> list[int]:
    """PIDs whose command line names `folder` (TorchServe's JVM and workers carry their TMPDIR in it)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if str(folder) in cmdline and state != "Z":
                pids.append(int(proc.name))
    return pids


def call_all(client: Client, calls: Sequence[tuple[str, Any]]) -> list[Reply]:
    """POST each (inference API path, JSON body) at once, one thread each (so they can share batches); the replies
    in the calls' order."""
    headers = {"Content-Type": "application/json"}
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(
            pool.map(lambda c: client.call("inference", "POST", c[0], json.dumps(c[1]), headers=headers), calls)
        )


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from model_store import build

    store = tmp_path_factory.mktemp("model_store")
    assert build.main(["--out", str(store)]) == 0
    continuous = ["--out", str(store), "--strategies", "bucketed", "--schedule", "continuous"]
    assert build.main([*continuous, "--name", "minilm-continuous"]) == 0  # minilm-continuous-bucketed.mar
    return store


# The archives every door is tested through: TorchServe's batching, and continuous batching.
SCHEDULED = {"batch": "minilm-bucketed.mar", "continuous": "minilm-continuous-bucketed.mar"}


@pytest.fixture(scope="session")
def torchserve(tmp_path_factory: pytest.TempPathFactory, model_store: Path):
    workdir = tmp_path_factory.mktemp("torchserve")
    server = TorchServe(workdir, Endpoints.on_ports(*free_ports(3)), model_store=model_store)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        assert processes_under(server.workdir) == [], "TorchServe left processes behind"


@pytest.fixture(scope="session")
def reference():
    """Batch-of-one embeddings from the handler in process, on the same model files."""
    from bucketing_handler import BucketingHandler

    context = LocalContext({"model_path": str(minilm_dir()), "strategy": "dynamic", "cost": {"calibrate": False}})
    handler = BucketingHandler()
    handler.initialize(context)
    cache: dict[str, np.ndarray] = {}

    def embed(text: str) -> np.ndarray:
        if text not in cache:
            context.with_requests(["application/json"])
            (body,) = handler.handle([{"body": {"text": text}}], context)
            cache[text] = np.array(json.loads(body)["embedding"])
        return cache[text]

    return embed
