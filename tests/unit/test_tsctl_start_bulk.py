"""`python -m tsctl start --bulk`: the strategy's archive, then its 2-thread archive as NAME-bulk on one worker,
with a responseTimeout sized for bulk requests; a missing bulk archive, or one built with TorchServe's 120 s, is one
line naming the build command, before anything starts."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from model_store import archives, bulk
from tsctl import __main__ as cli
from tsctl.client import Endpoints, ServerError


class FakeClient:
    def __init__(self) -> None:
        self.registered: list[tuple[Any, ...]] = []

    def models(self) -> list[str]:
        return [r[1] for r in self.registered]

    def register(self, mar: str, name: str, batch_size: int, delay: int, workers: int, timeout: int = 120) -> None:
        self.registered.append((mar, name, batch_size, delay, workers, timeout))


class FakeServer:
    def __init__(self, store: Path) -> None:
        self.properties = {"model_store": str(store)}
        self.client = FakeClient()
        self.endpoints = Endpoints("http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3")
        self.workdir = store
        self.started = self.stopped = False

    def pid(self) -> int | None:
        return 1 if self.started else None

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True


def archive(path: Path, response_timeout: int | None) -> Path:
    """An archive as torch-model-archiver lays out its manifest and model-config (nothing else is read here)."""
    config = {"minWorkers": 1, **({"responseTimeout": response_timeout} if response_timeout else {})}
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"configFile": "model-config.yaml"}}))
        mar.writestr("model-config.yaml", yaml.safe_dump(config))
    return path


def test_bulk_registers_the_two_thread_archive_on_one_worker_beside_the_strategys(tmp_path, capsys):
    timeout = bulk.bulk_response_timeout_s()
    archive(tmp_path / "minilm-t2-bucketed.mar", timeout)
    server = FakeServer(tmp_path)
    assert cli.start(server, "bucketed", bulk=True) == 0  # type: ignore[arg-type]
    assert server.client.registered == [
        ("minilm-bucketed.mar", "minilm-bucketed", 16, 10, 2, 120),
        ("minilm-t2-bucketed.mar", "minilm-bucketed-bulk", 16, 10, 1, timeout),
    ]
    assert f"model minilm-bucketed-bulk READY (1 worker x 2 threads, responseTimeout {timeout} s)" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize("given", [None, 120])
def test_a_bulk_archive_with_torchserve_s_timeout_is_refused_in_one_line(tmp_path, given):
    """A 2,048-text request of 256-token texts got a 503 after 92 s under the template's 120 s: an archive built
    without --bulk is refused, naming the build that makes it."""
    archive(tmp_path / "minilm-t2-bucketed.mar", given)
    server = FakeServer(tmp_path)
    with pytest.raises(ServerError, match=r"has responseTimeout 120 s, under the 330 s .*model_store.build --bulk"):
        cli.start(server, "bucketed", bulk=True)  # type: ignore[arg-type]
    assert not server.started


def test_the_bulk_timeout_covers_the_request_max_request_size_is_sized_for():
    """2,048 texts at the template's max_length, at its cost model's per-token cost, within the share of
    responseTimeout a call starts passes in, twice over."""
    from bucketing.serving.deadline import DEADLINE_SHARE
    from bucketing.sizes import MAX_TEXTS

    config = archives.served()
    passes = MAX_TEXTS * config.max_length * config.cost.per_token_us / 1e6
    assert bulk.bulk_response_timeout_s() * DEADLINE_SHARE >= 2 * passes > 100


def test_a_missing_bulk_archive_is_one_line_with_its_build_command_before_anything_starts(tmp_path):
    server = FakeServer(tmp_path)
    with pytest.raises(ServerError, match=r"model_store.build --bulk --strategies bucketed"):
        cli.start(server, "bucketed", bulk=True)  # type: ignore[arg-type]
    assert not server.started and server.client.registered == []
