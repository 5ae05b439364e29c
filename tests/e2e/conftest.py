"""A real TorchServe on free loopback ports (token auth on), with freshly built archives; stopped at the end."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


# A store an outer session built, for a session run inside a test (test_signals.py): not built again.
OUTER_STORE = "BUCKETING_TEST_OUTER_MODEL_STORE"


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from model_store import build

    outer = os.environ.get(OUTER_STORE)
    if outer:
        return Path(outer)
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


@dataclass(frozen=True)
class Shared:
    """How a model several modules use unchanged is registered on the session's TorchServe."""

    archive: str
    batch_size: int
    max_batch_delay: int
    workers: int

    def register(self, server: TorchServe, name: str) -> None:
        server.client.register(self.archive, name, self.batch_size, self.max_batch_delay, self.workers)


# By model name. `batch` and `continuous` (one worker each: the archives of SCHEDULED) serve the OpenAI, TEI and
# KServe SDK modules; `bucketed` (two workers) test_serving.py (beside its `dynamic`, registered alike) and
# test_resilience.py's hostile input and key rotation. A registration is a worker start (seconds of CPU each): one
# per model for the session, not one per module. No test may kill their workers or change their settings.
SHARED = {
    "batch": Shared(SCHEDULED["batch"], batch_size=8, max_batch_delay=100, workers=1),
    "continuous": Shared(SCHEDULED["continuous"], batch_size=8, max_batch_delay=100, workers=1),
    "bucketed": Shared("minilm-bucketed.mar", batch_size=8, max_batch_delay=50, workers=2),
}


@pytest.fixture(scope="session")
def shared_models(torchserve: TorchServe) -> Iterator[Callable[[str], str]]:
    """`shared_models(name)`: the SHARED model `name`, registered on the session's TorchServe on first use and kept
    until the session ends; its name. Tests read its metrics as deltas (others use it too)."""
    registered: list[str] = []

    def get(name: str) -> str:
        if name not in registered:
            SHARED[name].register(torchserve, name)
            registered.append(name)
        return name

    try:
        yield get
    finally:
        for name in registered:
            torchserve.client.unregister(name)


@pytest.fixture(scope="module", params=sorted(SCHEDULED))
def scheduled(shared_models: Callable[[str], str], request: pytest.FixtureRequest) -> str:
    """The shared model of each schedule in turn (TorchServe's batching, then continuous batching): its name, which
    is the schedule's (SCHEDULED's key)."""
    return shared_models(request.param)


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
