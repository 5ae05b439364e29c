"""Folders of two layouts that sentence-transformers loads besides its usual one, built offline and checked against
`SentenceTransformer(dir).encode()` through the build CLI (`build --print-commands` stages the archive's files) and
the worker on what it staged:

- a T5 encoder (sentence-t5 / GTR): sentence-transformers loads its encoder alone (`T5EncoderModel`; MT5, UMT5 and
  LongT5 alike), whatever the folder's weights hold of a decoder; relative positions, so the archive cuts texts where
  sentence-transformers does (its max_seq_length, else the tokenizer's model_max_length);
- the Transformer in its own module folder (`0_Transformer/`, an older layout), which the archive carries;

and a dense `Router` (queries and documents through modules of their own), refused in one line at build and start.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from bucketing.model.head import EngineError
from tests.handler.test_build_model_folders import one_line_error, stage_only, staged
from tests.handler.test_handler import make_handler, mixed_texts, serve
from tests.models import TOKENIZER_WORDS, build_sentence_transformer, build_tiny

sentence_transformers = pytest.importorskip("sentence_transformers")

TOLERANCE = 1e-5
ENGINES = ("torch", "onnxruntime", "openvino")
# Texts of 1 to 90 words (a few tokens each): batched together, several past the archives' max_length (cut there).
TEXTS = mixed_texts(10, seed=11) + ["short", "serving transformer encoders"]


def build_t5_tokenizer(target: Path, model_max_length: int | None = 512) -> Path:
    """A small SentencePiece-style Unigram (Metaspace) trained offline, as transformers' T5 tokenizer wraps it: ids
    0, 1, 2 for <pad>, </s>, <unk>, `</s>` after each text, a few sentinel `<extra_id_N>` tokens."""
    from tokenizers import Tokenizer as Raw
    from tokenizers import models, normalizers, pre_tokenizers, trainers
    from transformers import T5Tokenizer

    words = TOKENIZER_WORDS
    corpus = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
    raw = Raw(models.Unigram())
    raw.normalizer = normalizers.NFKC()
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    specials = ["<pad>", "</s>", "<unk>"]
    raw.train_from_iterator(corpus, trainers.UnigramTrainer(vocab_size=200, special_tokens=specials, unk_token="<unk>"))
    vocab = [(str(piece), float(score)) for piece, score in json.loads(raw.to_str())["model"]["vocab"]]
    limit: dict[str, Any] = {"model_max_length": model_max_length} if model_max_length else {}
    T5Tokenizer(vocab=vocab, extra_ids=4, **limit).save_pretrained(target)
    return target


# The T5 family's configs and whole (encoder-decoder) models, by architecture.
T5_CLASSES = {
    "t5": ("T5Config", "T5Model"),
    "mt5": ("MT5Config", "MT5Model"),
    "umt5": ("UMT5Config", "UMT5Model"),
    "longt5": ("LongT5Config", "LongT5Model"),
    "switch_transformers": ("SwitchTransformersConfig", "SwitchTransformersModel"),
}


def t5_config(arch: str, vocab_size: int, **extra: Any) -> Any:
    """A tiny T5-family config (2 layers, d_model 32, 8 relative-position buckets up to 20 tokens apart), with
    `extra` fields (LongT5's local_radius, encoder_attention_type)."""
    import transformers

    return getattr(transformers, T5_CLASSES[arch][0])(
        vocab_size=vocab_size,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        **extra,
    )


def build_sentence_t5(
    target: Path,
    arch: str = "t5",
    whole: bool = False,
    max_seq_length: int | None = 48,
    tokenizer_limit: int | None = 512,
    seed: int = 0,
    config: dict[str, Any] | None = None,
) -> Path:
    """A tiny random sentence-t5-style folder saved by sentence-transformers itself: `SentenceTransformer(modules=
    [Transformer(T5 body), Pooling(mean), Dense(no bias, Identity), Normalize]).save()` (it saves the encoder alone);
    `whole`: the root's weights then replaced by the whole encoder-decoder's (a random decoder beside the same
    encoder, `is_encoder_decoder: true`, as hub folders of T5 encoders often are); `max_seq_length`: written into
    sentence_bert_config.json as sentence-t5 saves it (None: none; the tokenizer's `tokenizer_limit` then rules);
    `config`: extra config fields."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    body = build_t5_tokenizer(target.parent / f"{target.name}-body", tokenizer_limit)
    vocab_size = len(transformers.AutoTokenizer.from_pretrained(body))
    torch.manual_seed(seed)
    getattr(transformers, T5_CLASSES[arch][1])(t5_config(arch, vocab_size, **(config or {}))).eval().save_pretrained(
        body
    )
    transformer = Transformer(str(body))
    assert "EncoderModel" in type(transformer.auto_model).__name__  # sentence-transformers loads the encoder alone
    width = transformer.get_embedding_dimension()
    torch.manual_seed(seed + 1)
    dense = Dense(width, 16, bias=False, activation_function=torch.nn.Identity())
    SentenceTransformer(modules=[transformer, Pooling(width, pooling_mode="mean"), dense, Normalize()]).save(
        str(target)
    )
    if whole:
        for name in ("config.json", "model.safetensors"):
            shutil.copy(body / name, target / name)
    settings = target / "sentence_bert_config.json"
    saved = json.loads(settings.read_text())
    saved.pop("max_seq_length", None)
    if max_seq_length is not None:
        saved["max_seq_length"] = max_seq_length
    settings.write_text(json.dumps(saved))
    tokenizer = json.loads((target / "tokenizer_config.json").read_text())
    if tokenizer_limit is None:
        tokenizer.pop("model_max_length", None)
    else:
        tokenizer["model_max_length"] = tokenizer_limit
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return target


def as_module_folder_layout(folder: Path, target: Path) -> Path:
    """The folder laid out as older sentence-transformers saved it: the Transformer's files (model, tokenizer,
    sentence_bert_config.json) in `0_Transformer/`, which modules.json names as its path."""
    shutil.copytree(folder, target)
    (target / "0_Transformer").mkdir()
    for path in sorted(target.iterdir()):
        if path.is_file() and path.name not in ("modules.json", "config_sentence_transformers.json", "README.md"):
            shutil.move(path, target / "0_Transformer" / path.name)
    modules = json.loads((target / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (target / "modules.json").write_text(json.dumps(modules, indent=2))
    return target


def build_dense_router(target: Path) -> Path:
    """A dense SentenceTransformer whose Router sends queries through one BERT (mean pooling) and documents through
    another (CLS pooling), then Normalize: `Router.for_query_document(...)`, saved by sentence-transformers."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Router, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    query = build_tiny(target.parent / f"{target.name}-query", "bert", seed=1)
    document = build_tiny(target.parent / f"{target.name}-document", "bert", seed=2)
    router = Router.for_query_document(
        [Transformer(str(query)), Pooling(32, "mean")], [Transformer(str(document)), Pooling(32, "cls")]
    )
    SentenceTransformer(modules=[router, Normalize()]).save(str(target))
    return target


def reference(folder: Path, texts: list[str]) -> np.ndarray:
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    return model.encode(texts, batch_size=len(texts), convert_to_numpy=True)


def built(folder: Path, tmp_path: Path, engine: str = "torch") -> tuple[Path, dict[str, Any]]:
    """The build CLI's staged model folder for `engine` and its archive's handler section."""
    assert stage_only(folder, tmp_path, "--engine", engine, "--no-calibration-texts") == 0
    (config,) = (tmp_path / "stage").glob("*.yaml")
    handler = yaml.safe_load(config.read_text())["handler"]
    return tmp_path / "stage" / "extra" / "model", handler


def answers(model_dir: Path, handler: dict[str, Any], texts: list[str], **section: Any) -> np.ndarray:
    """The worker's answers from the staged folder, the texts in two requests of one delivered batch."""
    settings = {k: v for k, v in handler.items() if k != "model_path"} | section
    worker, context = make_handler(model_dir, **settings)
    half = len(texts) // 2
    replies = serve(worker, context, [{"body": {"texts": texts[:half]}}, {"body": {"texts": texts[half:]}}])
    assert [status for status, _ in replies] == [200, 200], replies
    return np.array([a["embedding"] for _, body in replies for a in body])


def max_diff(got: np.ndarray, expected: np.ndarray) -> float:
    assert got.shape == expected.shape
    return float(np.max(np.abs(got - expected)))


T5_VARIANTS: dict[str, dict[str, Any]] = {
    "t5": {},
    "t5-whole": {"whole": True},  # the root's weights: the whole T5 (a decoder sentence-transformers ignores)
    "t5-tokenizer-limit": {"max_seq_length": None, "tokenizer_limit": 40},
    "mt5": {"arch": "mt5"},
    "umt5": {"arch": "umt5", "whole": True},
    # LongT5's local attention (blocks of 2 x 4 + 1 tokens) and its transient-global attention (blocks of 4 tokens)
    "longt5-local": {"arch": "longt5", "config": {"local_radius": 4, "global_block_size": 4}},
    "longt5-global": {
        "arch": "longt5",
        "whole": True,
        "config": {"local_radius": 4, "global_block_size": 4, "encoder_attention_type": "transient-global"},
    },
}


@pytest.fixture(scope="module")
def t5_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("t5")
    return {name: build_sentence_t5(root / name, **spec) for name, spec in T5_VARIANTS.items()}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("variant", list(T5_VARIANTS))
def test_a_t5_encoder_answers_as_sentence_transformers_encodes(t5_folders, variant, engine, tmp_path):
    """Built by the CLI (the ONNX graph exported for onnxruntime and openvino) and served by the worker: the
    encoder's answers equal encode()'s within 1e-5, texts of many lengths batched together, the long ones cut where
    sentence-transformers cuts them (was: the full T5 with a random decoder, and its workers died at start)."""
    folder = t5_folders[variant]
    model_dir, handler = built(folder, tmp_path, engine)
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    assert handler["max_length"] == model.max_seq_length == (40 if variant == "t5-tokenizer-limit" else 48)
    assert max(len(model.tokenizer(t)["input_ids"]) for t in TEXTS) > handler["max_length"]  # some texts are cut
    assert max_diff(answers(model_dir, handler, TEXTS), reference(folder, TEXTS)) <= TOLERANCE


@pytest.mark.parametrize("strategy", ["dynamic", "static"])
def test_a_t5_encoder_answers_the_same_in_every_strategy(t5_folders, strategy, tmp_path):
    folder = t5_folders["t5-whole"]
    model_dir, handler = built(folder, tmp_path)
    got = answers(model_dir, handler, TEXTS, strategy=strategy)
    assert max_diff(got, reference(folder, TEXTS)) <= TOLERANCE


def test_a_t5_encoder_without_a_limit_needs_an_explicit_max_length(tmp_path, capsys):
    """Relative positions set no limit: with neither max_seq_length nor a tokenizer's model_max_length,
    sentence-transformers cuts no text, so the build asks for --max-length (texts over it then differ)."""
    folder = build_sentence_t5(tmp_path / "unbounded", max_seq_length=None, tokenizer_limit=None)
    capsys.readouterr()  # transformers' progress bars
    assert stage_only(folder, tmp_path / "a", "--no-calibration-texts") == 2
    err = one_line_error(capsys)
    assert "sentence-transformers cuts none of its texts" in err and "pass --max-length N" in err
    assert stage_only(folder, tmp_path / "b", "--no-calibration-texts", "--max-length", "64") == 0
    assert "texts over 64 tokens will differ" in capsys.readouterr().out


def test_an_encoder_decoder_not_served_is_refused_in_one_line(tmp_path, capsys):
    """Switch Transformers (T5 with experts, each of a capacity) is among the encoder-decoders sentence-transformers
    loads the encoder of alone, not verified here: refused at build and at start in one line (was: loaded whole)."""
    folder = build_sentence_t5(tmp_path / "switch", arch="switch_transformers", config={"num_experts": 2})
    capsys.readouterr()  # transformers' progress bars
    assert stage_only(folder, tmp_path, "--no-calibration-texts") == 2
    line = "architecture 'switch_transformers' is an encoder-decoder whose encoder sentence-transformers loads alone"
    assert line in one_line_error(capsys)
    with pytest.raises(EngineError, match=line) as e:
        make_handler(folder, max_length=48)
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def module_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout")
    flat = build_sentence_transformer(root / "flat", dense=((8, True, "Tanh"),), normalize=True, max_seq_length=64)
    return as_module_folder_layout(flat, root / "module-folder")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_transformer_in_its_own_module_folder_is_served(module_folder, engine, tmp_path):
    """The Transformer in `0_Transformer/`: sentence-transformers loads it, the archive carries that folder's
    files (what a loader reads), and the worker loads the model and tokenizer from it (was: "no config.json")."""
    assert (module_folder / "0_Transformer" / "config.json").is_file()
    assert not (module_folder / "config.json").exists()
    model_dir, handler = built(module_folder, tmp_path, engine)
    files = set(staged(tmp_path))
    transformer = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert {f"0_Transformer/{name}" for name in transformer | {"sentence_bert_config.json"}} <= files
    assert not transformer & files  # nothing of it at the root
    assert handler["max_length"] == 64  # its 0_Transformer/sentence_bert_config.json
    texts = [*TEXTS, " ".join(["serving transformer encoders"] * 40)]  # one over 64 tokens
    assert max_diff(answers(model_dir, handler, texts), reference(module_folder, texts)) <= TOLERANCE


def test_a_t5_encoder_in_its_own_module_folder_is_served(t5_folders, tmp_path):
    folder = as_module_folder_layout(t5_folders["t5-whole"], tmp_path / "t5-module-folder")
    model_dir, handler = built(folder, tmp_path / "build")
    assert max_diff(answers(model_dir, handler, TEXTS), reference(folder, TEXTS)) <= TOLERANCE


def test_a_dense_router_is_refused_in_one_line_at_build_and_start(tmp_path, capsys):
    """A dense Router (queries and documents through transformers of their own) is refused in the line the docs
    promise, naming the module and its folder (was: "no config.json" at build, "Unrecognized model" at start)."""
    folder = build_dense_router(tmp_path / "router")
    sentence_transformers.SentenceTransformer(str(folder), device="cpu")  # a folder sentence-transformers loads
    capsys.readouterr()
    line = (
        f"module 'sentence_transformers.base.modules.router.Router' in {folder} (routes query: query_0_Transformer, "
        "query_1_Pooling; document: document_0_Transformer, document_1_Pooling) is not served in a dense model"
    )
    assert stage_only(folder, tmp_path) == 2
    err = one_line_error(capsys)
    assert line in err and "serve each route as a model of its own" in err
    with pytest.raises(EngineError, match="is not served in a dense model") as e:
        make_handler(folder, max_length=128)
    assert line in str(e.value) and "\n" not in str(e.value)
