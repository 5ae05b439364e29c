"""What the archive builder takes from a model folder: nothing from outside it (modules.json paths, links; a
Hugging Face cache snapshot still builds), Dense sizes checked against the weights before anything is allocated,
malformed settings refused in one line, and max_length where sentence-transformers cuts the model's texts."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from bucketing.config import ConfigError
from bucketing.model.head import EngineError
from model_store import archives, build
from tests.handler.test_handler import make_handler, serve
from tests.models import build_sentence_transformer

sentence_transformers = pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory):
    """A sentence-transformers folder with a Dense layer and a Normalize module folder."""
    root = tmp_path_factory.mktemp("folders")
    return build_sentence_transformer(root / "st", dense=((8, True, "Tanh"),), normalize=True)


def copy_of(folder: Path, tmp_path: Path, name: str = "model") -> Path:
    target = tmp_path / name
    shutil.copytree(folder, target)
    return target


def stage_only(model_dir: Path, tmp_path: Path, *extra: str) -> int:
    """`build --print-commands` (stages the archive's files, runs no archiver) for the folder, torch engine."""
    argv = ["--model-dir", str(model_dir), "--strategies", "bucketed", "--engine", "torch", "--print-commands"]
    return build.main([*argv, "--stage-dir", str(tmp_path / "stage"), *extra])


def staged(tmp_path: Path) -> dict[str, bytes]:
    root = tmp_path / "stage" / "extra" / "model"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("path", ["../Documents", "../../outside", "2_Normalize/../../Documents"])
def test_a_modules_json_path_out_of_the_folder_is_refused(st_folder, tmp_path, capsys, path):
    folder = copy_of(st_folder, tmp_path / "home")
    for secret in (tmp_path / "home" / "Documents", tmp_path / "outside"):
        secret.mkdir(parents=True, exist_ok=True)
        (secret / "id_rsa").write_text("SECRET")
    modules = json.loads((folder / "modules.json").read_text())
    modules[-1]["path"] = path  # the Normalize module: read by nothing, carried by the archive
    (folder / "modules.json").write_text(json.dumps(modules))
    assert stage_only(folder, tmp_path) == 2
    assert f"module path {path!r} leaves the model folder; refused" in one_line_error(capsys)
    assert not (tmp_path / "stage" / "outside").exists()
    assert not any(b"SECRET" in data for data in staged(tmp_path).values()) if (tmp_path / "stage").exists() else True


def test_a_link_out_of_the_folder_is_refused(st_folder, tmp_path, capsys):
    """A file the archive carries that links out of the folder is refused; one it does not carry is left out."""
    folder = copy_of(st_folder, tmp_path)
    (tmp_path / "id_rsa").write_text("SECRET")
    (folder / "vocab.txt").symlink_to(Path("..") / "id_rsa")  # a name BertTokenizer reads
    assert stage_only(folder, tmp_path) == 2
    assert f"{folder / 'vocab.txt'}: links to {tmp_path / 'id_rsa'}, outside the model folder" in one_line_error(capsys)
    (folder / "vocab.txt").unlink()
    (folder / "2_Dense" / "pytorch_model.bin").symlink_to(tmp_path / "id_rsa")  # inside a module folder too
    assert stage_only(folder, tmp_path) == 2
    assert "2_Dense/pytorch_model.bin: links to" in one_line_error(capsys)
    (folder / "2_Dense" / "pytorch_model.bin").unlink()
    (folder / "README.md").unlink()
    (folder / "README.md").symlink_to(Path("..") / "id_rsa")  # read by no loader: not carried
    (folder / "1_Pooling" / "notes").symlink_to(tmp_path / "id_rsa")
    assert stage_only(folder, tmp_path) == 0
    assert not any(b"SECRET" in data for data in staged(tmp_path).values())


def test_a_hard_link_from_outside_the_folder_is_refused(st_folder, tmp_path, capsys):
    """A carried file with another name outside the folder (a hard link) is refused in one line saying how to copy
    it; a hard link whose names all lie inside the folder builds, as does the copy the line asks for."""
    folder = copy_of(st_folder, tmp_path)
    (tmp_path / "id_rsa").write_text("SECRET")
    os.link(tmp_path / "id_rsa", folder / "vocab.txt")  # a name BertTokenizer reads
    assert stage_only(folder, tmp_path) == 2
    err = one_line_error(capsys)
    assert f"{folder / 'vocab.txt'}: a hard link to a file with 1 more name(s) outside the model folder" in err
    assert f"cp '{folder / 'vocab.txt'}' '{folder / 'vocab.txt'}.copy' && mv" in err
    os.link(folder / "1_Pooling" / "config.json", folder / "pooling-backup.json")  # both names inside
    shutil.copy(folder / "vocab.txt", folder / "vocab.txt.copy")  # what the error asks for
    os.replace(folder / "vocab.txt.copy", folder / "vocab.txt")
    assert stage_only(folder, tmp_path) == 0
    assert staged(tmp_path)["1_Pooling/config.json"] == (st_folder / "1_Pooling" / "config.json").read_bytes()


def test_the_archive_carries_only_what_a_loader_reads(st_folder, tmp_path, capsys):
    """A folder's notes, `.env` and training leftovers stay out of the archive (the build says so), at the top and in
    module folders; what sentence-transformers and transformers read goes in."""
    folder = copy_of(st_folder, tmp_path)
    for junk in (".env", "notes.txt", "training_args.bin", "1_Pooling/notes.md", "2_Dense/optimizer.pt"):
        (folder / junk).write_text("SECRET")
    assert stage_only(folder, tmp_path) == 0
    out = capsys.readouterr().out
    assert "left out, read by no loader: .env, README.md, notes.txt, training_args.bin)" in out
    saved = {str(p.relative_to(st_folder)) for p in st_folder.rglob("*") if p.is_file()}
    assert set(staged(tmp_path)) == saved - {"README.md"} | {"embedding_ranges.json"}  # the default calibration
    assert {"tokenizer.json", "modules.json", "2_Dense/model.safetensors", "1_Pooling/config.json"} <= saved


def hub_cache(folder: Path, root: Path) -> Path:
    """The folder laid out as the Hugging Face hub cache does: every file a link into `../../blobs`."""
    repo = root / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    for i, path in enumerate(sorted(p for p in folder.rglob("*") if p.is_file())):
        relative = path.relative_to(folder)
        blob = repo / "blobs" / f"blob{i}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, blob)
        link = snapshot / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def test_a_hugging_face_cache_snapshot_builds_from_its_blobs(st_folder, tmp_path, capsys):
    snapshot = hub_cache(st_folder, tmp_path / "hub")
    assert (snapshot / "config.json").is_symlink()
    assert stage_only(snapshot, tmp_path) == 0
    files = staged(tmp_path)
    assert files["config.json"] == (st_folder / "config.json").read_bytes()
    assert files["2_Dense/model.safetensors"] == (st_folder / "2_Dense" / "model.safetensors").read_bytes()
    assert not any(p.is_symlink() for p in (tmp_path / "stage" / "extra" / "model").rglob("*"))
    capsys.readouterr()
    (tmp_path / "hub" / "other").write_text("SECRET")  # beside the model's own cache folder: refused
    (snapshot / "vocab.txt").symlink_to(Path("..") / ".." / ".." / "other")
    assert stage_only(snapshot, tmp_path) == 2
    assert "vocab.txt: links to" in one_line_error(capsys)


def test_dense_sizes_are_checked_against_the_weights_before_allocating(st_folder, tmp_path, capsys):
    folder = copy_of(st_folder, tmp_path)
    dense = folder / "2_Dense" / "config.json"
    cfg = json.loads(dense.read_text())
    dense.write_text(json.dumps({**cfg, "out_features": 10_000_000}))
    with pytest.raises(archives.ModelFolderError) as e:
        archives.check_model_dir(folder, "embedding")
    assert "config.json declares {'weight': [10000000, 32], 'bias': [10000000]}, its model.safetensors holds" in str(
        e.value
    )
    assert stage_only(folder, tmp_path) == 2 and "its model.safetensors holds" in one_line_error(capsys)
    with pytest.raises(EngineError, match="its model.safetensors holds"):
        make_handler(folder, max_length=128)


def rewrite_safetensors(path: Path, change) -> None:
    """The file with its header changed by `change` (a function of the header dict), its data as it was."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    change(header)
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + length :])


def shape_past_its_bytes(dense: Path) -> None:
    """The weight declared [8, 64] in config.json and in the header alike, with the bytes of [8, 32]."""

    def grow(header):
        (weight,) = [k for k in header if k.endswith("weight")]
        header[weight]["shape"] = [8, 64]

    rewrite_safetensors(dense / "model.safetensors", grow)
    cfg = json.loads((dense / "config.json").read_text())
    (dense / "config.json").write_text(json.dumps({**cfg, "in_features": 64}))


def data_cut_short(dense: Path) -> None:
    weights = dense / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])


@pytest.mark.parametrize("damage", [data_cut_short, shape_past_its_bytes])
def test_dense_weights_whose_header_does_not_cover_their_bytes_are_one_line(st_folder, tmp_path, capsys, damage):
    """A header with the declared shapes but bytes that do not match them is refused by the builder in one line
    (was: the torch build succeeded and its worker failed; the onnxruntime build a 34-line traceback)."""
    folder = copy_of(st_folder, tmp_path)
    damage(folder / "2_Dense")
    with pytest.raises(archives.ModelFolderError, match="model.safetensors"):
        archives.check_model_dir(folder, "embedding")
    assert stage_only(folder, tmp_path) == 2 and "model.safetensors" in one_line_error(capsys)


def as_pytorch_bin(dense: Path, legacy: bool = False) -> None:
    """The Dense module's weights saved by torch.save as `pytorch_model.bin` (zip format, or the legacy one)."""
    import torch
    from safetensors.torch import load_file

    state = load_file(str(dense / "model.safetensors"))
    torch.save(state, dense / "pytorch_model.bin", _use_new_zipfile_serialization=not legacy)
    (dense / "model.safetensors").unlink()


@pytest.mark.parametrize("legacy", [False, True])
def test_dense_sizes_of_a_pytorch_bin_are_checked_at_build_before_allocating(st_folder, tmp_path, capsys, legacy):
    """A Dense saved as pytorch_model.bin is checked at build as a model.safetensors is, in the same one line (was:
    at worker start only)."""
    folder = copy_of(st_folder, tmp_path)
    dense = folder / "2_Dense"
    as_pytorch_bin(dense, legacy)
    assert archives.check_model_dir(folder, "embedding") > 0  # its own sizes: built
    cfg = json.loads((dense / "config.json").read_text())
    (dense / "config.json").write_text(json.dumps({**cfg, "in_features": 5_000_000}))
    line = (
        "declares {'weight': [8, 5000000], 'bias': [8]}, its pytorch_model.bin holds {'bias': [8], 'weight': [8, 32]}"
    )
    with pytest.raises(archives.ModelFolderError) as e:
        archives.check_model_dir(folder, "embedding")
    assert line in str(e.value) and str(e.value).endswith("; refused")
    assert stage_only(folder, tmp_path) == 2 and line in one_line_error(capsys)
    with pytest.raises(EngineError, match=re.escape(line)):
        make_handler(folder, max_length=128)


def test_a_pytorch_bin_holding_an_object_is_refused_unread(st_folder, tmp_path, capsys):
    """A Dense's pytorch_model.bin is read with weights_only: a pickled object is refused in one line, never built."""
    import torch

    folder = copy_of(st_folder, tmp_path)
    dense = folder / "2_Dense"
    as_pytorch_bin(dense)
    state = torch.load(dense / "pytorch_model.bin", weights_only=True)
    torch.save({**state, "extra": Path("x")}, dense / "pytorch_model.bin")
    assert stage_only(folder, tmp_path) == 2
    assert "pytorch_model.bin: not a weights-only torch file" in one_line_error(capsys)


@pytest.mark.parametrize(
    ("file", "change", "message"),
    [
        ("2_Dense/config.json", {"in_features": None}, "config.json must give in_features and out_features"),
        ("2_Dense/config.json", {"out_features": "8"}, "config.json out_features must be a positive integer, got '8'"),
        ("sentence_bert_config.json", {"max_seq_length": "512"}, "max_seq_length must be a positive integer"),
        ("1_Pooling/config.json", {"pooling_mode": 3}, "pooling_mode 3 is not a mode name or a list of them"),
    ],
)
def test_malformed_settings_are_one_line(st_folder, tmp_path, capsys, file, change, message):
    folder = copy_of(st_folder, tmp_path)
    cfg = json.loads((folder / file).read_text())
    cfg.update(change)
    (folder / file).write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    assert stage_only(folder, tmp_path) == 2
    assert message in one_line_error(capsys)


@pytest.fixture(scope="module")
def long_folder(tmp_path_factory):
    """A folder whose sentence_bert_config.json says 300 tokens while its tokenizer says 128 (positions: 512)."""
    folder = build_sentence_transformer(tmp_path_factory.mktemp("long") / "st", seed=3)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 300, "do_lower_case": False}))
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tokenizer, "model_max_length": 128}))
    return folder


def test_the_archive_cuts_where_sentence_transformers_cuts(long_folder, tmp_path, capsys, caplog):
    model = sentence_transformers.SentenceTransformer(str(long_folder), device="cpu")
    assert model.max_seq_length == 300  # max_seq_length wins over the tokenizer's model_max_length
    assert stage_only(long_folder, tmp_path, "--name", "long") == 0
    assert "note:" not in capsys.readouterr().out
    cfg = yaml.safe_load((tmp_path / "stage" / "long-bucketed.yaml").read_text())
    assert cfg["handler"]["max_length"] == 300
    text = " ".join(["serving transformer encoders with padding"] * 32)  # 290 tokens
    assert 256 < len(model.tokenizer(text)["input_ids"]) < 300
    section = {k: v for k, v in cfg["handler"].items() if k != "model_path"} | {"cost": {"calibrate": False}}
    with caplog.at_level(logging.INFO):
        handler, context = make_handler(tmp_path / "stage" / "extra" / "model", **section)
    assert "below the model's own limit" not in caplog.text
    ((status, body),) = serve(handler, context, [{"body": {"text": text}}])
    assert status == 200 and body["truncated"] is False
    assert float(np.max(np.abs(np.array(body["embedding"]) - model.encode([text])[0]))) <= 1e-5


def test_an_explicit_max_length_below_the_model_s_says_so_at_build_and_start(long_folder, tmp_path, capsys, caplog):
    assert stage_only(long_folder, tmp_path, "--name", "long", "--max-length", "200") == 0
    assert (
        "note: max_length 200 (--max-length) is below the model's own limit of 300 tokens: texts over 200 tokens "
        "will differ from sentence-transformers' answers"
    ) in capsys.readouterr().out
    cfg = yaml.safe_load((tmp_path / "stage" / "long-bucketed.yaml").read_text())
    assert cfg["handler"]["max_length"] == 200
    with caplog.at_level(logging.INFO):
        make_handler(long_folder, max_length=200)
    assert "max_length 200 is below the model's own limit of 300 tokens: texts over 200 tokens differ" in caplog.text
    capsys.readouterr()
    assert stage_only(long_folder, tmp_path, "--max-length", "301") == 2
    assert "--max-length 301: allowed 1 to 300 (the model's own limit is 300 tokens" in one_line_error(capsys)


def test_a_model_past_the_memory_cap_needs_an_explicit_max_length(tiny_embedder_dir, tmp_path, capsys):
    import torch
    from safetensors.torch import load_file, save_file

    folder = copy_of(tiny_embedder_dir, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16384}))
    weights = load_file(str(folder / "model.safetensors"))  # positions as many as config.json says
    weights["embeddings.position_embeddings.weight"] = torch.zeros(16384, config["hidden_size"])
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer.pop("model_max_length", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    assert stage_only(folder, tmp_path) == 2
    assert "the model takes 16384 tokens a text, above the handler's cap of 8192" in one_line_error(capsys)
    assert stage_only(folder, tmp_path, "--max-length", "512") == 0
    assert "texts over 512 tokens will differ" in capsys.readouterr().out


def test_a_worker_refuses_a_max_length_past_the_tokenizer_s_limit(tiny_embedder_dir, tmp_path):
    folder = copy_of(tiny_embedder_dir, tmp_path)
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tokenizer, "model_max_length": 128}))
    with pytest.raises(ConfigError, match=r"at most the model's own limit \(128, its tokenizer's model_max_length\)"):
        make_handler(folder, max_length=256)


def test_the_shipped_minilm_archives_cut_where_sentence_transformers_cuts(minilm_dir):
    model = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    assert archives.check_model_dir(minilm_dir, "embedding") == model.max_seq_length == archives.max_length() == 256


@pytest.mark.parametrize("saved", ["float16", "bfloat16"])
def test_weights_saved_in_a_reduced_dtype_are_refused_in_float32(st_folder, tmp_path, capsys, saved):
    """sentence-transformers runs such a folder in its saved dtype: a float32 answer would differ from encode()
    (by about 1e-3) with a 200, so the build and the worker refuse it in one line, naming the fix."""
    import torch
    from transformers import AutoModel

    folder = copy_of(st_folder, tmp_path)
    AutoModel.from_pretrained(folder).to(getattr(torch, saved)).save_pretrained(folder)
    capsys.readouterr()  # transformers' progress bars
    assert stage_only(folder, tmp_path) == 2
    err = one_line_error(capsys)
    assert f"its weights are saved in {saved}, and sentence-transformers runs them in {saved}" in err
    assert "SentenceTransformer(dir).float().save(new_dir)" in err
    with pytest.raises(EngineError, match=f"its weights are saved in {saved}"):
        make_handler(folder, max_length=128)
    as_float32 = sentence_transformers.SentenceTransformer(str(folder), device="cpu").float()
    as_float32.save(str(tmp_path / "float32"))
    assert stage_only(tmp_path / "float32", tmp_path / "again") == 0  # the fix the message names builds


def test_calibration_texts_give_the_archive_its_int8_ranges(st_folder, tmp_path, capsys):
    texts = [f"calibration text number {i} about {'serving ' * (i % 5)}embeddings" for i in range(12)]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n\n")
    assert stage_only(st_folder, tmp_path, "--calibration-texts", str(tmp_path / "texts.txt")) == 0
    assert "# int8/uint8 ranges from 12 calibration texts (ranges are steadier from 100" in capsys.readouterr().out
    stored = json.loads(staged(tmp_path)["embedding_ranges.json"])
    floats = sentence_transformers.SentenceTransformer(str(st_folder), device="cpu").encode(texts)
    assert stored["texts"] == 12 and np.allclose(stored["minimums"], floats.min(axis=0), atol=1e-6)
    assert np.allclose(stored["maximums"], floats.max(axis=0), atol=1e-6)
    assert not (st_folder / "embedding_ranges.json").exists()  # the user's folder is left as it was
    (tmp_path / "one.txt").write_text("only one\n")
    capsys.readouterr()  # what loading the reference printed
    assert stage_only(st_folder, tmp_path, "--calibration-texts", str(tmp_path / "one.txt")) == 2
    assert "ranges need at least two" in one_line_error(capsys)


def test_truncate_dim_is_written_to_the_model_config_and_checked(st_folder, tmp_path, capsys):
    import yaml

    assert stage_only(st_folder, tmp_path, "--truncate-dim", "4") == 0
    (config,) = (tmp_path / "stage").glob("*.yaml")
    assert yaml.safe_load(config.read_text())["handler"]["truncate_dim"] == 4
    capsys.readouterr()
    assert stage_only(st_folder, tmp_path, "--truncate-dim", "9") == 2  # its Dense answers 8 components
    assert one_line_error(capsys) == "error: --truncate-dim 9: allowed 1 to 8, the model's embedding size"


def test_a_dense_model_gets_ranges_from_the_bench_texts_by_default(st_folder, tiny_classifier_dir, tmp_path, capsys):
    from model_store.ranges import DEFAULT_TEXTS, default_texts

    assert stage_only(st_folder, tmp_path) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("# int8/uint8 ranges"))
    assert line.startswith(f"# int8/uint8 ranges from {DEFAULT_TEXTS} calibration texts: the bench's long-tail texts")
    stored = json.loads(staged(tmp_path)["embedding_ranges.json"])
    floats = sentence_transformers.SentenceTransformer(str(st_folder), device="cpu").encode(default_texts()[0])
    assert stored["texts"] == DEFAULT_TEXTS and np.allclose(stored["minimums"], floats.min(axis=0), atol=1e-6)
    assert stage_only(st_folder, tmp_path / "none", "--no-calibration-texts") == 0
    assert "int8/uint8 ranges" not in capsys.readouterr().out and "embedding_ranges.json" not in staged(
        tmp_path / "none"
    )
    assert stage_only(tiny_classifier_dir, tmp_path / "classifier", "--task", "classification") == 0
    assert "embedding_ranges.json" not in staged(tmp_path / "classifier")  # a classifier has no embedding ranges


def test_a_plain_folders_ranges_are_of_its_normalised_answers(tiny_embedder_dir, tmp_path):
    """A plain Hugging Face folder is served normalised (handler.normalize auto): its ranges are of those vectors."""
    from model_store.ranges import default_texts

    assert not (tiny_embedder_dir / "modules.json").exists()
    assert stage_only(tiny_embedder_dir, tmp_path) == 0
    stored = json.loads(staged(tmp_path)["embedding_ranges.json"])
    floats = sentence_transformers.SentenceTransformer(str(tiny_embedder_dir), device="cpu").encode(default_texts()[0])
    unit = floats / np.linalg.norm(floats, axis=1, keepdims=True)
    assert np.allclose(stored["maximums"], unit.max(axis=0), atol=1e-6)


def test_calibration_texts_are_cut_where_the_archive_cuts_them(tmp_path):
    """A RoBERTa folder whose tokenizer allows more tokens than its positions: the default texts (up to 256 tokens)
    are embedded cut at the archive's max_length, as served, not where the tokenizer would let them run."""
    folder = build_sentence_transformer(tmp_path / "roberta", arch="roberta", normalize=True)
    assert stage_only(folder, tmp_path) == 0
    assert json.loads(staged(tmp_path)["embedding_ranges.json"])["texts"] == 128


def test_a_folders_own_ranges_win_over_the_default_texts_and_are_checked(st_folder, tmp_path, capsys):
    """`python -m model_store.ranges DIR --texts FILE` says "build the archive again to carry it": the build then
    carries that file (it used to replace it with ranges of the bench's texts), says so, and refuses in one line a
    file the worker would refuse (a NaN: every worker refused to start)."""
    from model_store import ranges

    folder = Path(shutil.copytree(st_folder, tmp_path / "own"))
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(f"my own calibration text {i} {'words ' * (i % 7)}" for i in range(6)) + "\n")
    assert ranges.main([str(folder), "--texts", str(texts)]) == 0
    own = (folder / "embedding_ranges.json").read_bytes()
    capsys.readouterr()
    assert stage_only(folder, tmp_path / "a") == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("# int8/uint8 ranges")]
    assert lines == ["# int8/uint8 ranges: the folder's own model/embedding_ranges.json, from 6 calibration texts"]
    assert staged(tmp_path / "a")["embedding_ranges.json"] == own
    assert stage_only(folder, tmp_path / "b", "--calibration-texts", str(texts)) == 0  # asked for: computed again
    assert "from 6 calibration texts (ranges are steadier" in capsys.readouterr().out
    stored = json.loads(own)
    (folder / "embedding_ranges.json").write_text(json.dumps({**stored, "minimums": ["nan"] * 8}))
    assert stage_only(folder, tmp_path / "c") == 2
    assert "the model folder's embedding_ranges.json: embedding_ranges.json: minimums and maximums must be lists" in (
        one_line_error(capsys)
    )
    del stored["embeddings"]
    (folder / "embedding_ranges.json").write_text(json.dumps(stored))
    assert stage_only(folder, tmp_path / "d") == 0
    assert "it keeps no calibration vectors, so int8/uint8 with a re-normalised dimensions is refused" in (
        capsys.readouterr().out
    )


def test_the_ranges_cli_says_in_one_line_that_its_texts_are_not_utf8(st_folder, tmp_path, capsys):
    from model_store import ranges

    (tmp_path / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1") * 3)
    assert ranges.main([str(st_folder), "--texts", str(tmp_path / "latin1.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --texts ") and "codec can't decode" in err and "\n" not in err


def test_bulk_archives_carry_a_response_timeout_sized_for_bulk_requests(st_folder, tmp_path, capsys):
    import yaml

    from model_store import bulk

    assert stage_only(st_folder, tmp_path, "--bulk", "--no-calibration-texts") == 0
    ((path, config),) = [(p, yaml.safe_load(p.read_text())) for p in (tmp_path / "stage").glob("*.yaml")]
    assert path.name == "minilm-t2-bucketed.yaml" and config["handler"]["torch_threads"] == 2
    assert config["responseTimeout"] == bulk.bulk_response_timeout_s() == 330
    assert stage_only(st_folder, tmp_path / "own", "--response-timeout", "600", "--no-calibration-texts") == 0
    ((config,),) = [[yaml.safe_load(p.read_text()) for p in (tmp_path / "own" / "stage").glob("*.yaml")]]
    assert config["responseTimeout"] == 600 and "torch_threads" not in config["handler"]
    capsys.readouterr()
    assert stage_only(st_folder, tmp_path / "bad", "--response-timeout", "0") == 2
    assert one_line_error(capsys) == "error: --response-timeout 0: allowed 1 to 86400 seconds"
    assert stage_only(st_folder, tmp_path / "bad", "--bulk", "--threads", "4") == 2
    assert one_line_error(capsys) == "error: --bulk builds 2-thread archives; drop --threads 4"


def test_an_archive_carrying_another_model_config_is_stale(tmp_path):
    """`--if-stale` rebuilds an archive whose model-config is not the one it would be built with now (a 2-thread
    archive built before `--bulk` kept TorchServe's 120 s)."""
    import json
    import time
    import zipfile

    import yaml

    from model_store import archives, contents

    mar = tmp_path / "minilm-t2-bucketed.mar"
    config = archives.model_config("bucketed", 2)
    with zipfile.ZipFile(mar, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"configFile": "cfg.yaml"}}))
        archive.writestr("cfg.yaml", yaml.safe_dump(config))
    later = time.time() + 3600  # newer than every source
    os.utime(mar, (later, later))
    assert contents.archived_config(mar) == config and not archives.stale(mar, config=config)
    assert archives.stale(mar, config={**config, "responseTimeout": 330})
    assert not archives.stale(mar)  # without a config to hold it against: the sources' times alone


def test_an_engine_whose_package_is_missing_is_one_line_at_build(st_folder, tmp_path, capsys, monkeypatch):
    """Without openvino the build used to say the exported graph "differs from the torch model by nan"."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else find_spec(name))
    argv = ["--model-dir", str(st_folder), "--strategies", "bucketed", "--engine", "openvino", "--print-commands"]
    assert build.main([*argv, "--stage-dir", str(tmp_path / "stage"), "--no-calibration-texts"]) == 2
    assert one_line_error(capsys) == (
        "error: handler.engine openvino: the build needs the Python package openvino, which is not installed here "
        "(pip install -r requirements.txt, which pins it; or another handler.engine: torch or onnxruntime)"
    )
