"""Shared fixtures: model directories (the real MiniLM from its package, tiny random BERTs built offline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from models import build_tiny_bert, minilm_path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return minilm_path()


@pytest.fixture(scope="session")
def tiny_classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-classifier"), classifier=True)


@pytest.fixture(scope="session")
def tiny_embedder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-embedder"), classifier=False)
