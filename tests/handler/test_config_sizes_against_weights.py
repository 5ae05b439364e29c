"""A model folder's config.json sizes (`vocab_size`, ...) are checked against its weights' headers before anything of
those sizes is allocated: at build and at worker start, for every kind, safetensors and pytorch_model.bin alike, in
one line naming the size and the tensor (was: the worker allocated gigabytes in from_pretrained, then failed with
transformers' multi-line size-mismatch report)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bucketing.kinds.sparse.task import SparseTask
from bucketing.model.head import EngineError
from model_store import archives
from tests.handler.test_build_model_folders import one_line_error, stage_only
from tests.handler.test_handler import make_handler
from tests.models import build_multi_vector_encoder, build_sentence_transformer, build_sparse_encoder

pytest.importorskip("sentence_transformers")

HUGE = 15_000_000


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sizes")
    return {
        "embedding": build_sentence_transformer(root / "st", normalize=True),
        "sparse": build_sparse_encoder(root / "splade"),
    }


def transformer_folder(folder: Path, kind: str) -> Path:
    """Where the kind's transformer (its config.json and weights) lives in the folder."""
    encoder = SparseTask.encoder_folder(folder) if kind == "sparse" else None
    return encoder[0] if encoder else folder


def as_pytorch_bin(folder: Path) -> None:
    """The transformer's weights saved by torch.save as `pytorch_model.bin` instead of model.safetensors."""
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def with_config(folder: Path, **sizes: int) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **sizes}))


@pytest.fixture
def no_from_pretrained(monkeypatch):
    """from_pretrained fails the test if reached: the check must come before anything is allocated."""
    from transformers import PreTrainedModel
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    def reached(cls, *args, **kwargs):
        raise AssertionError("from_pretrained reached: the sizes were not checked first")

    monkeypatch.setattr(_BaseAutoModelClass, "from_pretrained", classmethod(reached))
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(reached))


def huge_vocabulary(sources, kind: str, weights: str, tmp_path: Path) -> tuple[Path, str]:
    """A copy of the kind's folder whose transformer config.json says a vocabulary of 15 million ids, and the line
    expected for it."""
    folder = tmp_path / "model"
    shutil.copytree(sources[kind], folder)
    body = transformer_folder(folder, kind)
    if weights == "pytorch_model.bin":
        as_pytorch_bin(body)
    with_config(body, vocab_size=HUGE)
    prefix = "bert." if kind == "sparse" else ""  # a masked-LM checkpoint names its base model's tensors so
    owner = "model.safetensors'" if weights == "model.safetensors" else "pytorch_model.bin's"
    line = f"config.json says vocab_size {HUGE} but {owner} {prefix}embeddings.word_embeddings.weight is [30522, 32]"
    return folder, line


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
@pytest.mark.parametrize("kind", ["embedding", "sparse"])
def test_a_huge_vocab_size_is_refused_at_build_in_one_line(sources, tmp_path, capsys, kind, weights):
    folder, line = huge_vocabulary(sources, kind, weights, tmp_path)
    with pytest.raises(archives.ModelFolderError) as e:
        archives.check_model_dir(folder, kind)
    assert line in str(e.value) and str(e.value).endswith("; refused"), e.value
    assert stage_only(folder, tmp_path, "--task", kind) == 2 and line in one_line_error(capsys)


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
@pytest.mark.parametrize("kind", ["embedding", "sparse"])
def test_a_huge_vocab_size_stops_the_worker_before_from_pretrained(
    sources, tmp_path, no_from_pretrained, kind, weights
):
    folder, line = huge_vocabulary(sources, kind, weights, tmp_path)
    with pytest.raises(EngineError, match=re.escape(line)) as e:
        make_handler(folder, task=kind, max_length=128)
    assert "\n" not in str(e.value)


def test_a_huge_vocab_size_stops_the_onnxruntime_sparse_worker_too(sources, tmp_path, no_from_pretrained):
    """The sparse kind's own head (what its onnxruntime engine checks the graph against) loads through the check."""
    from bucketing.kinds.sparse.onnx import load_head

    folder, line = huge_vocabulary(sources, "sparse", "model.safetensors", tmp_path)
    with pytest.raises(EngineError, match=re.escape(line)):
        load_head(str(folder))


def test_a_splade_mlm_head_of_another_size_is_refused_at_build(sources, tmp_path, capsys):
    """SPLADE loads its transformer with the masked-LM head, so the head's tensors are checked too (the base model
    alone fits config.json here)."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "model"
    shutil.copytree(sources["sparse"], folder)
    body = transformer_folder(folder, "sparse")
    state = load_file(str(body / "model.safetensors"))
    state["cls.predictions.bias"] = torch.zeros(1000)
    save_file(state, str(body / "model.safetensors"), metadata={"format": "pt"})
    line = "config.json says vocab_size 30522 but model.safetensors' cls.predictions.bias is [1000]"
    with pytest.raises(archives.ModelFolderError, match=re.escape(line)):
        archives.check_model_dir(folder, "sparse")
    with pytest.raises(EngineError, match=re.escape(line)):
        make_handler(folder, task="sparse", max_length=128)


def test_every_kind_checks_its_sizes_at_build(tmp_path, tiny_classifier_dir):
    """Classification and multi-vector folders too: another hidden_size than the weights' is one line."""
    folders = {
        "classification": shutil.copytree(tiny_classifier_dir, tmp_path / "classifier"),
        "multivector": build_multi_vector_encoder(tmp_path / "mv"),
    }
    for kind, folder in folders.items():
        with_config(folder, intermediate_size=4096)
        with pytest.raises(archives.ModelFolderError, match=r"config\.json says intermediate_size 4096 but model"):
            archives.check_model_dir(folder, kind)


def test_a_folder_of_its_own_sizes_is_not_touched(sources):
    assert archives.check_model_dir(sources["embedding"], "embedding") > 0
    assert archives.check_model_dir(sources["sparse"], "sparse") > 0


def test_a_sharded_checkpoint_is_read_through_its_index(tmp_path, tiny_embedder_dir):
    """A checkpoint in shards (`model.safetensors.index.json`) is checked shard by shard, the line naming the shard."""
    from transformers import AutoModel

    folder = shutil.copytree(tiny_embedder_dir, tmp_path / "model")
    model = AutoModel.from_pretrained(folder)
    (folder / "model.safetensors").unlink()
    model.save_pretrained(folder, max_shard_size="500KB")
    assert (folder / "model.safetensors.index.json").is_file() and not (folder / "model.safetensors").exists()
    assert archives.check_model_dir(folder, "embedding") > 0
    with_config(folder, vocab_size=HUGE)
    line = rf"config\.json says vocab_size {HUGE} but model-\d+-of-\d+\.safetensors' embeddings\.word_embeddings"
    with pytest.raises(archives.ModelFolderError, match=line):
        archives.check_model_dir(folder, "embedding")
