"""The sparse encoders every module here serves, built once for the package (not once per module): the SPLADE
and Router folders, CSR folders and CSR Routers, their onnxruntime archives (staged when first asked) and handlers
(made when first asked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.handler.sparse.support import (
    CSR_ROUTERS,
    CSR_VARIANTS,
    MAX_LENGTH,
    VARIANTS,
    build_csr,
    build_csr_router,
    model_dir,
    stage_onnxruntime_archive,
)
from tests.handler.test_handler import make_handler
from tests.models import build_sparse_encoder


@pytest.fixture(scope="package")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sparse")
    return {name: build_sparse_encoder(root / name, **spec) for name, spec in VARIANTS.items()}


@pytest.fixture(scope="package")
def csr_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("csr")
    return {name: build_csr(root / name, **spec) for name, spec in CSR_VARIANTS.items()}


@pytest.fixture(scope="package")
def csr_routers(tmp_path_factory):
    root = tmp_path_factory.mktemp("csr-router")
    return {name: build_csr_router(root / name, **spec) for name, spec in CSR_ROUTERS.items()}


@pytest.fixture(scope="package")
def archives(folders, csr_folders, csr_routers, tmp_path_factory):
    """Each folder's onnxruntime archive, staged once for the package when first asked."""
    cache: dict[str, tuple[Path, dict[str, Any]]] = {}

    def get(variant):
        if variant not in cache:
            source = {**folders, **csr_folders, **csr_routers}[variant]
            cache[variant] = stage_onnxruntime_archive(source, tmp_path_factory.mktemp(f"onnx-{variant}"))
        return cache[variant]

    return get


@pytest.fixture(scope="package")
def handlers(folders, archives):
    cache = {}

    def get(variant, strategy="bucketed", engine="torch", **section):
        key = (variant, strategy, engine, tuple(sorted(section.items())))
        if key not in cache:
            cache[key] = make_handler(
                model_dir(folders, archives, variant, engine),
                task="sparse",
                strategy=strategy,
                engine=engine,
                max_length=MAX_LENGTH,
                **section,
            )
        return cache[key]

    return get
