"""A multi-vector model's folder (sentence-transformers 6.2's `MultiVectorEncoder`), read from its files
(`MultiVectorSpec`: lengths, query expansion, the token mask), and whether a folder is one; `multivector.py` runs it.

Served chain (`modules.json`): one `Transformer` (first; `sentence_bert_config.json` `query_length`,
`document_length`, `query_expansion` {fixed|min, attend, token, length}), any `Dense` over `token_embeddings`, one
`MultiVectorMask` (`skiplist_words`, `skiplist_tasks`, `keep_only_token_ids`) and a final `Normalize`;
`config_sentence_transformers.json` gives `model_type: MultiVectorEncoder` and the `query`/`document` prompts.
Token pooling (`HierarchicalTokenPooling`, `LambdaTokenPooling`), PyLate/Stanford-NLP legacy saves and any other
module are refused with one line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bucketing.model.chain import (
    Chain,
    ChainError,
    json_file,
    json_mapping,
    module_chain,
    module_path,
    positive_int,
    prompt_settings,
)

TASK = "multivector"
MODEL_TYPE = "MultiVectorEncoder"  # config_sentence_transformers.json's model_type
SERVED_MODULES = ("Transformer", "Dense", "MultiVectorMask", "Normalize")
TOKEN_POOLING = ("BaseTokenPooling", "HierarchicalTokenPooling", "LambdaTokenPooling")
LEGACY_KEYS = ("query_prefix", "document_prefix", "do_query_expansion", "attend_to_expansion_tokens")
EXPANSION_STRATEGIES = ("fixed", "min")
TOKEN_OUTPUT = "token_embeddings"


@dataclass(frozen=True)
class Expansion:
    """ColBERT query expansion: queries padded with `token` (None: the tokenizer's mask token, else its EOS) up to
    `length` tokens (`fixed`: also cut there; `min`: a floor only); `attend`: whether the encoder sees them."""

    strategy: str
    attend: bool
    token: str | None
    length: int


@dataclass(frozen=True)
class MultiVectorSpec:
    """What a MultiVectorEncoder folder computes and how it treats queries and documents."""

    chain: Chain  # prompts, Dense layers, Normalize, max_seq_length, do_lower_case (no pooling)
    query_length: int | None = None
    document_length: int | None = None
    expansion: Expansion | None = None
    skiplist_words: tuple[str, ...] = ()
    skiplist_tasks: tuple[str, ...] = ("document",)
    keep_only_token_ids: tuple[int, ...] | None = None

    def lengths(self) -> dict[str, int]:
        """The per-task token limits the folder sets (checked against the model's own limit at start)."""
        out = {"query_length": self.query_length, "document_length": self.document_length}
        if self.expansion is not None:
            out["query_expansion length"] = self.expansion.length
        return {k: v for k, v in out.items() if v is not None}

    def cut(self, input_type: str | None, ceiling: int) -> int:
        """Where a text of this input type is cut (as Transformer.preprocess sets max_length), within `ceiling`."""
        if input_type == "document":
            return min(self.document_length or ceiling, ceiling)
        if input_type == "query":
            if self.expansion is not None and self.expansion.strategy == "fixed":
                return min(self.expansion.length, ceiling)
            limit = self.query_length or ceiling
            if self.expansion is not None:
                limit = max(limit, self.expansion.length)
            return min(limit, ceiling)
        return ceiling

    def describe(self) -> dict[str, Any]:
        """What was read, as plain data (the archive's model-config and the worker's ready line)."""
        return {
            **self.chain.describe(),
            "query_length": self.query_length,
            "document_length": self.document_length,
            "query_expansion": None if self.expansion is None else self.expansion.__dict__,
            "skiplist_words": len(self.skiplist_words),
            "skiplist_tasks": list(self.skiplist_tasks),
            "keep_only_token_ids": None if self.keep_only_token_ids is None else list(self.keep_only_token_ids),
        }


def is_multivector(model_dir: Path | str) -> bool:
    """Whether sentence-transformers saved this folder as a MultiVectorEncoder (its model_type, or a MultiVectorMask
    module)."""
    folder = Path(model_dir)
    try:
        st = json.loads((folder / "config_sentence_transformers.json").read_text(encoding="utf-8"))
        if isinstance(st, Mapping) and st.get("model_type") == MODEL_TYPE:
            return True
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(modules, list) and any(
        isinstance(m, Mapping) and str(m.get("type", "")).endswith("MultiVectorMask") for m in modules
    )


def read_multivector(model_dir: Path | str) -> MultiVectorSpec:
    """The folder's multi-vector chain; ChainError in one line for what cannot be served exactly."""
    folder = Path(model_dir)
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        raise ChainError(
            f"{folder}: no modules.json; a multi-vector model is served from a folder MultiVectorEncoder saved "
            "(`MultiVectorEncoder(dir).save(new_dir)`)"
        )
    st_file = folder / "config_sentence_transformers.json"
    st = json_mapping(st_file) if st_file.is_file() else {}
    legacy = [k for k in LEGACY_KEYS if k in st]
    if legacy:
        raise ChainError(
            f"{st_file}: a PyLate/Stanford-NLP save ({', '.join(legacy)}) is not served; resave it with "
            "`MultiVectorEncoder(dir).save(new_dir)` (sentence-transformers 6.2) and serve that"
        )
    modules = json_file(modules_file)
    if not isinstance(modules, list) or not modules or not all(isinstance(m, Mapping) for m in modules):
        raise ChainError(f"{modules_file}: expected a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    for kind, module in zip(kinds, modules):
        where = module_path(folder, module)
        if kind in TOKEN_POOLING or kind.endswith("TokenPooling"):
            raise ChainError(
                f"module {kind} in {where}: token pooling is not served (it merges token vectors by clustering "
                "across each text, which this handler does not reproduce); serve the folder without it"
            )
        if kind not in SERVED_MODULES:
            raise ChainError(
                f"module {module.get('type')!r} in {where} is not served by a multi-vector model (served: "
                f"{', '.join(SERVED_MODULES)}); this model cannot be served exactly"
            )
    order = ", ".join(kinds)
    if kinds[0] != "Transformer" or kinds.count("Transformer") != 1:
        raise ChainError(f"{modules_file}: the chain must start with its one Transformer, got {order}")
    if kinds.count("MultiVectorMask") != 1:
        raise ChainError(f"{modules_file}: a multi-vector chain has one MultiVectorMask, got {order}")
    if "Normalize" in kinds and (kinds.count("Normalize") != 1 or kinds[-1] != "Normalize"):
        raise ChainError(f"{modules_file}: Normalize must be the last module, got {order}")
    for kind, module in zip(kinds, modules):
        if kind in ("Dense", "Normalize"):
            path = module_path(folder, module)
            cfg = json_mapping(path / "config.json") if (path / "config.json").is_file() else {}
            name = cfg.get("module_input_name", TOKEN_OUTPUT if kind == "Normalize" else "sentence_embedding")
            if name != TOKEN_OUTPUT:
                raise ChainError(f"module {kind} in {path}: it reads {name!r}, not {TOKEN_OUTPUT!r}; not served")
    settings = _transformer_settings(module_path(folder, modules[0]))
    mask = _mask(module_path(folder, modules[kinds.index("MultiVectorMask")]))
    chain = module_chain(folder, modules, ((), True), prompt_settings(folder), kinds)  # no pooling: token vectors
    return MultiVectorSpec(chain, *settings, *mask)


def _transformer_settings(path: Path) -> tuple[int | None, int | None, Expansion | None]:
    cfg: Mapping[str, Any] = {}
    for name in ("sentence_bert_config.json",):
        if (path / name).is_file():
            cfg = json_mapping(path / name)
    where = path / "sentence_bert_config.json"
    task = cfg.get("transformer_task", "feature-extraction")
    if task != "feature-extraction":
        raise ChainError(f"{where}: transformer_task {task!r} is not served (served: feature-extraction)")
    modalities = cfg.get("modality_config")
    if modalities is not None and (not isinstance(modalities, Mapping) or set(modalities) != {"text"}):
        raise ChainError(f"{where}: modality_config {modalities!r:.80} is not served (served: text alone)")
    output = cfg.get("module_output_name", TOKEN_OUTPUT)
    if output != TOKEN_OUTPUT:
        raise ChainError(f"{where}: module_output_name {output!r} is not served (served: {TOKEN_OUTPUT})")
    query_length = positive_int(cfg.get("query_length"), f"{where}: query_length")
    document_length = positive_int(cfg.get("document_length"), f"{where}: document_length")
    raw = cfg.get("query_expansion")
    if raw is None:
        return query_length, document_length, None
    if not isinstance(raw, Mapping) or raw.get("strategy") not in EXPANSION_STRATEGIES:
        raise ChainError(f"{where}: query_expansion {raw!r:.80} is not served (strategy: fixed or min)")
    length = positive_int(raw.get("length"), f"{where}: query_expansion length")
    token = raw.get("token")
    if length is None or not isinstance(raw.get("attend", False), bool) or not isinstance(token, (str, type(None))):
        raise ChainError(f"{where}: query_expansion {raw!r:.80} needs a length, a boolean attend, a token or null")
    if query_length is not None and query_length < length:
        raise ChainError(f"{where}: query_length {query_length} is below the query_expansion length {length}")
    return query_length, document_length, Expansion(str(raw["strategy"]), bool(raw.get("attend", False)), token, length)


def _mask(path: Path) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...] | None]:
    cfg = json_mapping(path / "config.json") if (path / "config.json").is_file() else {}
    words = cfg.get("skiplist_words") or []
    tasks = cfg.get("skiplist_tasks")
    tasks = ["document"] if tasks is None else [tasks] if isinstance(tasks, str) else tasks
    keep = cfg.get("keep_only_token_ids")
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise ChainError(f"module MultiVectorMask in {path}: skiplist_words must be a list of strings")
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        raise ChainError(f"module MultiVectorMask in {path}: skiplist_tasks must be task names")
    if keep is not None and (not isinstance(keep, list) or not all(isinstance(i, int) for i in keep)):
        raise ChainError(f"module MultiVectorMask in {path}: keep_only_token_ids must be a list of token ids")
    return tuple(words), tuple(tasks), None if keep is None else tuple(keep)
