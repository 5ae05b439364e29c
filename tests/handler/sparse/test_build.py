"""Building a sparse archive: the task detected in every folder sentence-transformers saves (SPLADE, Router,
CSR, CSR Router), every module carried, each at its own length limit; what is not served (reduced dtypes, routes of
different sizes, a transformer per route) refused at build and at worker start."""

from __future__ import annotations

import pytest

from tests.handler.sparse.support import ENGINES, MAX_LENGTH, VARIANTS, build_csr_router
from tests.handler.test_handler import make_handler

sentence_transformers = pytest.importorskip("sentence_transformers")


def test_build_detects_a_sparse_folder_and_refuses_what_is_not_served(folders, tmp_path):
    from bucketing.model.head import EngineError
    from model_store import archives
    from model_store.build import ArchiveSpec, BuildError

    (cfg,) = ArchiveSpec(strategies=("bucketed",), model_dir=folders["router"]).configs().values()
    assert cfg["handler"]["task"] == "sparse" and cfg["handler"]["engine"] == "torch"
    assert set(cfg["model_chain"]["routes"]) == {"query", "document"}
    carried = archives.model_files(folders["router"])
    assert {"query_0_SparseStaticEmbedding", "document_0_MLMTransformer", "document_1_SpladePooling"} <= set(carried)
    with pytest.raises(BuildError, match="--dtype float16: a sparse model is served in float32 only"):
        ArchiveSpec(strategies=("bucketed",), model_dir=folders["router"], dtype="float16").configs()
    sizes = build_csr_router(tmp_path / "sizes", hidden=64)  # a static route of 30522 ids, CSR latents of 64
    with pytest.raises(BuildError, match="routes answer vectors of different sizes") as raised:
        ArchiveSpec(strategies=("bucketed",), model_dir=sizes).configs()
    assert "\n" not in str(raised.value)
    with pytest.raises(EngineError, match="routes answer vectors of different sizes"):
        make_handler(sizes, task="sparse", max_length=MAX_LENGTH)


def test_build_detects_a_csr_folder(csr_folders):
    from model_store import archives
    from model_store.build import ArchiveSpec, BuildError

    folder = csr_folders["csr-dense-normalized"]
    assert archives.detect_task(folder) == "sparse"
    (cfg,) = ArchiveSpec(strategies=("bucketed",), model_dir=folder).configs().values()
    assert cfg["handler"]["task"] == "sparse" and cfg["handler"]["engine"] == "torch"
    assert "csr" in next(iter(cfg["model_chain"]["routes"].values()))
    assert cfg["model_chain"]["max_active_dims"] == 12
    (cfg,) = ArchiveSpec(strategies=("bucketed",), model_dir=folder, engine="onnxruntime").configs().values()
    assert cfg["handler"]["engine"] == "onnxruntime"
    with pytest.raises(BuildError, match="--dtype bfloat16: a sparse model is served in float32 only"):
        ArchiveSpec(strategies=("bucketed",), model_dir=folder, dtype="bfloat16").configs()


def test_build_carries_every_module_of_a_csr_router(csr_routers, tmp_path):
    from bucketing.model.head import EngineError
    from model_store import archives
    from model_store.build import ArchiveSpec, BuildError

    folder = csr_routers["csr-shared-router"]
    assert archives.detect_task(folder) == "sparse"
    (cfg,) = ArchiveSpec(strategies=("bucketed",), model_dir=folder).configs().values()
    assert set(cfg["model_chain"]["routes"]) == {"query", "document"} and cfg["model_chain"]["max_active_dims"] is None
    carried = set(archives.model_files(folder))
    saved = {p.name for p in folder.iterdir() if p.is_dir()}
    assert {"query_0_Transformer", "query_2_Dense", "document_1_Pooling", "document_2_SparseAutoEncoder"} <= saved
    assert saved <= carried
    two = build_csr_router(tmp_path / "two", query="csr", shared=False)  # a Transformer per route
    with pytest.raises(BuildError, match="2 transformers"):
        ArchiveSpec(strategies=("bucketed",), model_dir=two).configs()
    with pytest.raises(EngineError, match="2 transformers"):
        make_handler(two, task="sparse", max_length=MAX_LENGTH)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_folder_sparse_encoder_saved_builds_at_its_own_limit(folders, variant):
    """A SPLADE folder saved by SparseEncoder keeps its transformer at the folder's root (modules.json path ""):
    checked as a model without reading the root's sparse chain as a dense one."""
    from model_store import archives
    from model_store.build import ArchiveSpec

    folder = folders[variant]
    assert archives.detect_task(folder) == "sparse"
    (cfg,) = ArchiveSpec(strategies=("bucketed",), model_dir=folder).configs().values()
    assert cfg["handler"]["task"] == "sparse"
    reference = sentence_transformers.SparseEncoder(str(folder), device="cpu")
    assert archives.check_model_dir(folder, "sparse") == reference.max_seq_length


@pytest.mark.parametrize("engine", ENGINES)
def test_reduced_dtypes_are_refused_at_worker_start(folders, engine):
    from bucketing.model.head import EngineError

    with pytest.raises(EngineError, match="handler.dtype bfloat16: a sparse model is served in float32 only"):
        make_handler(folders["splade-max"], task="sparse", max_length=MAX_LENGTH, engine=engine, dtype="bfloat16")
