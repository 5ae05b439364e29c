"""Shared fixtures: model directories (the real MiniLM from its package, tiny random BERTs built offline)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from hypothesis import settings

from model_store.archives import minilm_dir as bundled_minilm
from tests.models import build_tiny_bert

# CI runs the same examples every time (a property test must not pass or fail by chance); elsewhere hypothesis
# explores. `HYPOTHESIS_PROFILE=ci` reproduces a CI run locally.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default"))


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI timeout, `kill`) ends the run like Ctrl-C: pytest then tears fixtures down, servers included."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return bundled_minilm()


@pytest.fixture(scope="session")
def tiny_classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-classifier"), classifier=True)


@pytest.fixture(scope="session")
def tiny_embedder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-embedder"), classifier=False)


@pytest.fixture
def bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU that says it multiplies bfloat16 natively (AMX), whatever this one does: where it does not, torch
    emulates the same products (float32 accumulation), only slower."""
    import bucketing.engines.precision

    monkeypatch.setattr(
        bucketing.engines.precision, "cpu_info", lambda: "flags\t\t: fpu avx2 avx512_bf16 amx_bf16 amx_tile\n"
    )


@pytest.fixture
def openvino_bf16() -> None:
    """A CPU on which OpenVINO runs bfloat16 (BF16 among its capabilities: it reads the hardware, not /proc/cpuinfo);
    skipped elsewhere, where the openvino engine refuses bfloat16 in one line (tests/unit/test_openvino.py)."""
    ov = pytest.importorskip("openvino")
    if "BF16" not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        pytest.skip("OpenVINO runs no bfloat16 on this CPU")
