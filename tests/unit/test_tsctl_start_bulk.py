"""`python -m tsctl start --bulk`: the strategy's archive, then its 2-thread archive as NAME-bulk on one worker;
a missing bulk archive is one line naming the build command, before anything starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tsctl import __main__ as cli
from tsctl.client import Endpoints, ServerError


class FakeClient:
    def __init__(self) -> None:
        self.registered: list[tuple[Any, ...]] = []

    def models(self) -> list[str]:
        return [r[1] for r in self.registered]

    def register(self, mar: str, name: str, batch_size: int, delay: int, workers: int) -> None:
        self.registered.append((mar, name, batch_size, delay, workers))


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


def test_bulk_registers_the_two_thread_archive_on_one_worker_beside_the_strategys(tmp_path, capsys):
    (tmp_path / "minilm-t2-bucketed.mar").write_bytes(b"")
    server = FakeServer(tmp_path)
    assert cli.start(server, "bucketed", bulk=True) == 0  # type: ignore[arg-type]
    assert server.client.registered == [
        ("minilm-bucketed.mar", "minilm-bucketed", 16, 10, 2),
        ("minilm-t2-bucketed.mar", "minilm-bucketed-bulk", 16, 10, 1),
    ]
    assert "model minilm-bucketed-bulk READY (1 worker x 2 threads)" in capsys.readouterr().out


def test_a_missing_bulk_archive_is_one_line_with_its_build_command_before_anything_starts(tmp_path):
    server = FakeServer(tmp_path)
    with pytest.raises(ServerError, match=r"--threads 2 --strategies bucketed"):
        cli.start(server, "bucketed", bulk=True)  # type: ignore[arg-type]
    assert not server.started and server.client.registered == []
