"""Models the bench can run besides the bundled MiniLM: a user's folder, or a random BERT-base geometry.

`bert-base-random` is BERT-base's geometry (12 layers, hidden 768, 12 heads; 110 M parameters) with random
weights and MiniLM's tokenizer: the answers mean nothing, the compute is real, to show how the gains move when
the per-token cost dominates. `minilm-cross-encoder-random` is MiniLM's geometry (6 x 384) as a one-label
sequence classifier (a cross-encoder, random weights, MiniLM's tokenizer), the rerank workload's model. Each is
built once into `.tmp/models/` (a few seconds).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from model_store.archives import PREFIX, ROOT, default_engine, max_length, minilm_dir

GENERATED = {"bert-base-random", "minilm-cross-encoder-random"}
CROSS_ENCODER = "minilm-cross-encoder-random"  # the rerank workload's default model
CACHE = ROOT / ".tmp" / "models"
MINILM = "all-MiniLM-L6-v2"


def model_dir(model: str | None) -> Path:
    """The folder of a bench model: None is the bundled MiniLM, a generated name is built once, else a path."""
    if model is None:
        return minilm_dir()
    if model == CROSS_ENCODER:
        return minilm_cross_encoder_random(CACHE / model)
    if model in GENERATED:
        return bert_base_random(CACHE / model)
    folder = Path(model).expanduser()
    if not (folder / "config.json").is_file():
        raise SystemExit(f"--model-dir {model}: no config.json there (a Hugging Face model folder)")
    return folder


def prefix(model: str | None, engine: str | None, schedule: str | None = None, dtype: str | None = None) -> str:
    """Archive name prefix: `minilm` (`minilm-<engine>` off the default engine, `-continuous` for that schedule,
    `-bfloat16` off float32), else the model's slug."""
    base = PREFIX if model is None else re.sub(r"[^a-z0-9]+", "-", Path(model).name.lower()).strip("-") or "model"
    base = base if engine in (None, default_engine()) else f"{base}-{engine}"
    base = base if dtype in (None, "float32") else f"{base}-{dtype}"
    return base if schedule in (None, "batch") else f"{base}-{schedule}"


def label(model: str | None) -> str:
    """The model's name in reports."""
    return Path(model).name if model else MINILM


def archive_max_length(model: str | None) -> int | None:
    """The max_length the bench builds a model's archives with: the shipped one for the generated random models
    (comparable with MiniLM; their answers mean nothing); None for MiniLM (the template's) and a user's folder
    (its own limit, where sentence-transformers cuts)."""
    return max_length() if model in GENERATED else None


def tokenizer(model: str | None, task: str = "embedding") -> Any:
    """The model's tokenizer as the handler runs it (at its archives' max_length), for token counts."""
    from bucketing.tokenizer import Tokenizer
    from model_store.archives import check_model_dir

    folder = model_dir(model)
    length = max_length() if model is None else archive_max_length(model) or check_model_dir(folder, task)
    return Tokenizer(str(folder), length)


def bert_base_random(target: Path) -> Path:
    """BERT-base geometry with random weights and MiniLM's tokenizer (seeded), built once."""
    from transformers import BertConfig, BertModel

    return _generated(target, lambda: BertModel(BertConfig()))  # BertConfig() is BERT-base: 12 x 768, vocab 30522


def minilm_cross_encoder_random(target: Path) -> Path:
    """MiniLM's geometry as a one-label cross-encoder with random weights (seeded), built once."""
    from transformers import AutoConfig, BertForSequenceClassification

    def make() -> Any:
        config = AutoConfig.from_pretrained(minilm_dir())
        config.num_labels, config.id2label, config.label2id = 1, {0: "relevance"}, {"relevance": 0}
        return BertForSequenceClassification(config)

    return _generated(target, make)


def _generated(target: Path, make: Callable[[], Any]) -> Path:
    """A model `make()` builds (seeded), saved with MiniLM's tokenizer into `target` once (atomically)."""
    if (target / "config.json").exists():
        return target
    import torch

    torch.manual_seed(0)
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    make().eval().save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_dir() / name, tmp / name)
    tmp.rename(target)
    return target


def task(workload: str) -> str:
    """The archive's task: classification for the rerank workload (text pairs), else embedding."""
    return "classification" if workload == "rerank" else "embedding"
