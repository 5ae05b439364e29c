"""Models the bench can run besides the bundled MiniLM: a user's folder, or a random BERT-base geometry.

`bert-base-random` is BERT-base's geometry (12 layers, hidden 768, 12 heads; 110 M parameters) with random
weights and MiniLM's tokenizer: the answers mean nothing, the compute is real, to show how the gains move when
the per-token cost dominates. `minilm-cross-encoder-random` is MiniLM's geometry (6 x 384) as a one-label
sequence classifier (a cross-encoder, random weights, MiniLM's tokenizer), the rerank workload's model.
`minilm-splade-random` is MiniLM's geometry as a masked LM (`BertForMaskedLM`: 6 x 384 and the MLM head over the
real 30522-id vocabulary, random weights, MiniLM's tokenizer) saved as `SparseEncoder.save` lays out a folder (a
`Transformer` with `transformer_task: fill-mask` at the folder's root, then `SpladePooling` max with activation
`relu`, i.e. log(1 + relu(logits)) as SPLADE computes it), the sparse workload's model. Random weights make almost
every vocabulary id active (about 25k non-zeros a text: answers that would measure JSON, not the model), so its
`config_sentence_transformers.json` sets `max_active_dims` 256, within a trained SPLADE's 100-300 non-zeros.
`bert-long-random` is a long-context geometry (`LONG_GEOMETRY`: 2 layers, hidden 256, 4 heads of 64, 8,192 position
embeddings; random weights, MiniLM's tokenizer) saved by sentence-transformers itself (a `Transformer` with
`max_seq_length` 8192 and the tokenizer's `model_max_length` 8192, mean `Pooling`, `Normalize`), served at its own
limit of 8,192 tokens: the long workload's model. Its depth is what 2 cores afford: attention at 8k tokens is
quadratic (`long_flops`: a layer costs about 1.2 s of one core at 8,192 tokens here), so an 8k document takes
about 2 s.
Each is built once into `.tmp/models/` (a few seconds).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.inputs.workloads import LONG, RERANK, SPARSE
from bucketing.config import SCHEDULE_RULES
from model_store.archives import PREFIX, ROOT, copy_minilm_tokenizer, default_engine, max_length, minilm_dir

if TYPE_CHECKING:  # imported where used (transformers loads torch; the tokenizer, numpy and tokenizers)
    from transformers import PreTrainedModel

    from bucketing.model.tokenizer import Tokenizer

BERT_BASE = "bert-base-random"
CROSS_ENCODER = "minilm-cross-encoder-random"  # the rerank workload's default model
SPLADE = "minilm-splade-random"  # the sparse workload's default model
SPLADE_MAX_ACTIVE_DIMS = 256  # non-zeros kept per answer (a trained SPLADE has about 100-300)
LONG_MODEL = "bert-long-random"  # the long workload's default model: 8,192 positions, served at 8,192 tokens
LONG_POSITIONS = 8192
# The long model's BertConfig fields (the rest: BertConfig's defaults, vocabulary 30522 as MiniLM's tokenizer).
LONG_GEOMETRY: dict[str, int] = {
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "intermediate_size": 1024,
    "max_position_embeddings": LONG_POSITIONS,
}
CACHE = ROOT / ".tmp" / "models"
MINILM = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Served:
    """How a workload's archives are built: the task, the model when none is given (None: MiniLM), and the engine
    when none is given (None: the shipped archives'); the engines and dtypes it may run on are its model kind's
    (`bucketing.kinds`)."""

    task: str = "embedding"
    model: str | None = None
    engine: str | None = None  # its engine when none is given (None: the shipped archives')


SERVED_AS = {  # workloads that are not plain embedding traffic to MiniLM
    RERANK: Served("classification", CROSS_ENCODER),
    SPARSE: Served("sparse", SPLADE, "torch"),  # torch unless --engines says (the kind: either engine, float32)
    # torch unless --engines says: its SDPA attention never holds the heads x n x n scores the ONNX graph (exported
    # from eager attention) does, 1 GiB a layer at 8k tokens, and ran 2x onnxruntime's speed at 8k here
    LONG: Served("embedding", LONG_MODEL, "torch"),
}


def served_as(workload: str) -> Served:
    """How `workload`'s archives are built."""
    return SERVED_AS.get(workload, Served())


def model_dir(model: str | None) -> Path:
    """The folder of a bench model: None is the bundled MiniLM, a generated name is built once, else a path."""
    if model is None:
        return minilm_dir()
    if model in GENERATED:
        return GENERATED[model](CACHE / model)
    folder = Path(model).expanduser()
    if not (folder / "config.json").is_file() and not (folder / "modules.json").is_file():
        raise SystemExit(f"--model-dir {model}: no config.json there (a Hugging Face model folder)")
    return folder


def encoder_dir(folder: Path) -> Path:
    """The folder holding the model's transformer (config.json, tokenizer): the folder itself, or a
    sentence-transformers folder's first module's when the folder has no config.json of its own."""
    if (folder / "config.json").is_file() or not (folder / "modules.json").is_file():
        return folder
    first = json.loads((folder / "modules.json").read_text())[0]
    return folder / str(first.get("path", ""))


def prefix(model: str | None, engine: str | None, schedule: str | None = None, dtype: str | None = None) -> str:
    """Archive name prefix: `minilm` (`minilm-<engine>` off the default engine, `-continuous` for that schedule,
    `-bfloat16` off float32), else the model's slug."""
    base = PREFIX if model is None else re.sub(r"[^a-z0-9]+", "-", Path(model).name.lower()).strip("-") or "model"
    base = base if engine in (None, default_engine()) else f"{base}-{engine}"
    base = base if dtype in (None, "float32") else f"{base}-{dtype}"
    return base if schedule is None or not SCHEDULE_RULES[schedule].pools else f"{base}-{schedule}"


def label(model: str | None) -> str:
    """The model's name in reports."""
    return Path(model).name if model else MINILM


def archive_max_length(model: str | None) -> int | None:
    """The max_length the bench builds a model's archives with: the shipped one for the generated random models
    (comparable with MiniLM; their answers mean nothing) but the long one (its own 8,192); None for MiniLM (the
    template's) and a user's folder (its own limit, where sentence-transformers cuts)."""
    return max_length() if model in GENERATED and model not in OWN_LIMIT else None


# `handler:` keys the bench's archives of a generated model set. The long model runs eager: its TorchScript trace
# hands every attention call a mask tensor, where the eager model hands none to a pass with no padding (a trace
# cannot take transformers' skip), and ran a 6,000-token row 1.3x slower than the eager model here; late chunking's
# pass (`Engine.states`) is eager, so all three long modes run the same model.
ARCHIVE_SETTINGS: dict[str, dict[str, Any]] = {LONG_MODEL: {"torchscript": False}}


def archive_settings(model: str | None) -> dict[str, Any] | None:
    """The `handler:` keys the bench sets in a model's archives beyond the template's (None: none)."""
    return ARCHIVE_SETTINGS.get(model) if model is not None else None


def tokenizer(model: str | None, task: str = "embedding") -> Tokenizer:
    """The model's tokenizer as the handler runs it (at its archives' max_length), for token counts."""
    from bucketing.model.tokenizer import Tokenizer
    from model_store.archives import check_model_dir

    folder = model_dir(model)
    length = max_length() if model is None else archive_max_length(model) or check_model_dir(folder, task)
    return Tokenizer(str(encoder_dir(folder)), length)


def bert_base_random(target: Path) -> Path:
    """BERT-base geometry with random weights and MiniLM's tokenizer (seeded), built once."""
    from transformers import BertConfig, BertModel

    return _generated(target, lambda: BertModel(BertConfig()))  # BertConfig() is BERT-base: 12 x 768, vocab 30522


def minilm_cross_encoder_random(target: Path) -> Path:
    """MiniLM's geometry as a one-label cross-encoder with random weights (seeded), built once."""
    from transformers import AutoConfig, BertForSequenceClassification

    def make() -> PreTrainedModel:
        config = AutoConfig.from_pretrained(minilm_dir())
        config.num_labels, config.id2label, config.label2id = 1, {0: "relevance"}, {"relevance": 0}
        return BertForSequenceClassification(config)

    return _generated(target, make)


def minilm_splade_random(target: Path) -> Path:
    """MiniLM's geometry as a masked LM with random weights (seeded), saved as a SparseEncoder folder (SPLADE max,
    relu; max_active_dims 256; cut at the shipped max_length), built once. Its sentence-transformers files are
    written here, so the bench needs no sentence-transformers to make it."""
    from transformers import AutoConfig, BertForMaskedLM

    def files(folder: Path) -> None:
        splade = "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"
        transformer_type = "sentence_transformers.base.modules.transformer.Transformer"
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": transformer_type},  # at the root, as SparseEncoder.save
            {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": splade},
        ]
        transformer = {
            "transformer_task": "fill-mask",
            "max_seq_length": max_length(),
            "do_lower_case": False,
            "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
            "module_output_name": "token_embeddings",
        }
        st = {"model_type": "SparseEncoder", "max_active_dims": SPLADE_MAX_ACTIVE_DIMS, "prompts": {}}
        pooling = {"pooling_strategy": "max", "activation_function": "relu", "embedding_dimension": None}
        (folder / "1_SpladePooling").mkdir()
        for name, content in (
            ("modules.json", modules),
            ("sentence_bert_config.json", transformer),
            ("config_sentence_transformers.json", st),
            ("1_SpladePooling/config.json", pooling),
        ):
            (folder / name).write_text(json.dumps(content, indent=2) + "\n")

    return _generated(target, lambda: BertForMaskedLM(AutoConfig.from_pretrained(minilm_dir())), files)


def long_flops(tokens: int, geometry: dict[str, int] | None = None) -> tuple[float, float]:
    """FLOPs of one pass over one text of `tokens` tokens through the long geometry's layers: (the linear layers',
    attention's). A layer's linear layers cost 2 x (4 h^2 + 2 h i) a token (Q, K, V, output; the feed-forward's
    two), its attention 2 x 2 n h a token (the scores and their weighted sum over n keys)."""
    g = geometry or LONG_GEOMETRY
    layers, hidden, inner = g["num_hidden_layers"], g["hidden_size"], g["intermediate_size"]
    linear = 2.0 * (4 * hidden * hidden + 2 * hidden * inner) * tokens * layers
    attention = 4.0 * tokens * tokens * hidden * layers
    return linear, attention


def long_config(positions: int = LONG_POSITIONS) -> Any:
    """The long geometry's BertConfig (no weights): `LONG_GEOMETRY` with `positions` position embeddings."""
    from transformers import BertConfig

    fields: dict[str, Any] = {**LONG_GEOMETRY, "max_position_embeddings": positions}
    return BertConfig(**fields)


def bert_long_random(target: Path, positions: int = LONG_POSITIONS) -> Path:
    """The long geometry with random weights (seeded) and MiniLM's tokenizer (its `model_max_length` set to
    `positions`), saved by sentence-transformers (`Transformer` at `max_seq_length` = `positions`, mean `Pooling`,
    `Normalize`), built once."""
    if (target / "config.json").exists():
        return target
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import BertModel

    torch.manual_seed(0)
    body, tmp = target.with_name(target.name + ".body"), target.with_name(target.name + ".partial")
    for folder in (body, tmp):
        shutil.rmtree(folder, ignore_errors=True)
    model: PreTrainedModel = BertModel(long_config(positions))  # its pooler too (unused; loaders expect one)
    model.eval().save_pretrained(body)
    copy_minilm_tokenizer(body)
    settings = json.loads((body / "tokenizer_config.json").read_text())
    (body / "tokenizer_config.json").write_text(json.dumps({**settings, "model_max_length": positions}))
    transformer = Transformer(str(body), max_seq_length=positions)
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[transformer, pooling, Normalize()], device="cpu").save(str(tmp))
    shutil.rmtree(body)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


GENERATED: dict[str, Callable[[Path], Path]] = {  # each built once into CACHE / name
    BERT_BASE: bert_base_random,
    CROSS_ENCODER: minilm_cross_encoder_random,
    SPLADE: minilm_splade_random,
    LONG_MODEL: bert_long_random,
}
OWN_LIMIT = (LONG_MODEL,)  # generated models archived at their own limit, not the shipped max_length


def _generated(target: Path, make: Callable[[], PreTrainedModel], files: Callable[[Path], None] | None = None) -> Path:
    """A model `make()` builds (seeded), saved with MiniLM's tokenizer into `target`, and `files` written into
    `target`, once (atomically; a folder there without a root config.json, an older layout, is built anew)."""
    if (target / "config.json").exists():
        return target
    import torch

    torch.manual_seed(0)
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    make().eval().save_pretrained(tmp)
    copy_minilm_tokenizer(tmp)
    if files is not None:
        files(tmp)
    shutil.rmtree(target, ignore_errors=True)  # an older layout's build (the SPLADE's masked LM in 0_Transformer/)
    tmp.rename(target)
    return target


def task(workload: str) -> str:
    """The archive's task: classification for the rerank workload (text pairs), sparse for the sparse workload,
    else embedding."""
    return served_as(workload).task
