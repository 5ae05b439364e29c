"""Multi-vector (ColBERT-style late-interaction) models as sentence-transformers 6.2's `MultiVectorEncoder` saves
them: one vector per kept token, its own query/document handling (the folder is read in `folder`).

A request's `input_type` is the `task` of `encode_query` ("query"), `encode_document` ("document") or `encode()`
(absent): the prompt, where the text is cut, query expansion (`[MASK]` ids up to the expansion length, attended or
not) and which tokens are kept (the skiplist, by task).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bucketing.answers import Answer, Options
from bucketing.kinds.multivector.folder import TASK, MultiVectorSpec, is_multivector, read_multivector
from bucketing.kinds.task import Rows, TaskHooks
from bucketing.model.chain import (
    Chain,
    ChainError,
)
from bucketing.model.encoded import Encoded, recut


@dataclass(frozen=True)
class Keep:
    """Which of a row's tokens are answered (MultiVectorMask): not the skiplist's ids where its tasks include the
    input's (no input type counts as a document), and only `keep_only` ids for anything but a query."""

    skip: frozenset[int] = frozenset()
    skip_tasks: tuple[str, ...] = ("document",)
    keep_only: frozenset[int] | None = None

    def positions(self, ids: Sequence[int], input_type: str | None) -> list[int]:
        skipping = bool(self.skip) and (input_type or "document") in self.skip_tasks
        only = self.keep_only if input_type != "query" and self.keep_only else None
        return [i for i, t in enumerate(ids) if not (skipping and t in self.skip) and (only is None or t in only)]


@dataclass(frozen=True)
class MultiVectorAnswer(Answer):
    """One text's token vectors (every token the model ran, expansion included) and its ids; which are answered
    depends on the request's input type (`Keep`)."""

    ids: tuple[int, ...] = ()
    keep: Keep = field(default_factory=Keep)

    def vectors(self, options: Options | None = None) -> Any:
        """The kept token vectors [n, dimensions], each cut and L2-normalised as a dense embedding is."""
        o = options or Options()
        rows = np.asarray(self.values, dtype=np.float32)[self.keep.positions(self.ids, o.input_type)]
        rows = rows[:, : o.dimensions]
        if self.normalize if o.normalize is None else o.normalize:
            norms = np.linalg.norm(rows, axis=-1, keepdims=True)
            rows = rows / np.maximum(norms, np.float32(1e-12))
        return rows

    def vector(self, dimensions: int | None = None, normalize: bool | None = None) -> Any:
        raise TypeError("a multi-vector answer has one vector per token, not one per text")

    def numbers(self, options: Options | None = None) -> int:
        """The kept tokens' components, counted before any is rendered."""
        o = options or Options()
        width = int(np.shape(self.values)[-1])
        return len(self.keep.positions(self.ids, o.input_type)) * min(width, o.dimensions or width)

    def fields(self, options: Options | None = None) -> dict[str, Any]:
        """Our native answer object: `embeddings` (one vector per kept token, an array [tokens, dim] to the wire
        format: its lists where it writes JSON, whole into KServe v2's binary tensor), `tokens`, `truncated`."""
        return {"embeddings": self.vectors(options), "tokens": self.tokens, "truncated": self.truncated}


class MultiVectorTask(TaskHooks):
    """Token embeddings through the chain's Dense layers, the kept tokens answered per input type."""

    name = TASK
    labels = None

    @staticmethod
    def detects(folder: Path | str) -> bool:
        return is_multivector(folder)

    @staticmethod
    def load(config: Any, model_dir: str, gpu_id: Any = None) -> MultiVectorTask:
        """Its token head on the configured engine (float32: its kind refuses others)."""
        from bucketing.engines import load_engine
        from bucketing.kinds.embedding import normalizes

        engine, info = load_engine(config, model_dir, gpu_id)
        return MultiVectorTask(
            engine, info, read_multivector(model_dir), normalizes(config.normalize, info.chain), model_dir
        )

    @staticmethod
    def read_settings(folder: Path) -> Chain:
        return read_multivector(folder).chain

    @staticmethod
    def describe(folder: Path) -> dict[str, Any] | None:
        """Its query/document settings with its chain's (prompts, lengths, expansion, Dense, mask), as plain data."""
        return read_multivector(folder).describe()

    @staticmethod
    def load_head(model_dir: str, attention: str | None = None) -> tuple[Any, Any]:
        return load_token_head(model_dir, attention)

    def __init__(self, engine: Any, info: Any, spec: MultiVectorSpec, normalize: bool, model_dir: str) -> None:
        self.engine = engine
        self.max_positions = info.max_positions
        self.dimensions = int(info.hidden_size)
        self.spec = spec
        self.chain = spec.chain
        self.normalize = normalize
        self.keep, self.expansion_id = _resolve(model_dir, spec)

    @property
    def settings(self) -> Chain:
        """The folder's prompts (query/document and the default) live on its chain."""
        return self.chain

    def forward(self, rows: Rows) -> np.ndarray:
        """Token vectors [rows, padded length, dimensions] of a padded sub-batch."""
        vectors: np.ndarray = self.engine(rows.ids, rows.mask)
        return vectors

    def answer(self, output: np.ndarray, encoded: Encoded) -> Answer:
        n = len(encoded.ids)
        values = np.array(output[:n], dtype=np.float32)
        return MultiVectorAnswer(
            values, n, encoded.truncated, normalize=self.normalize, ids=encoded.ids, keep=self.keep
        )

    def input_lengths(self) -> dict[str, int]:
        return self.spec.lengths()

    def numbers(self, encoded: Encoded, options: Options) -> int:
        """Its kept tokens' components, as its answer will count them (`MultiVectorAnswer.numbers`)."""
        kept = len(self.keep.positions(encoded.ids, options.input_type))
        return kept * min(self.dimensions, options.dimensions or self.dimensions)

    def cut(self, input_type: str | None, ceiling: int) -> int:
        return self.spec.cut(input_type, ceiling)

    def shape(self, encoded: Encoded, options: Options, ceiling: int, specials: tuple[int, int]) -> Encoded:
        """A text's tokens as the input type gives them (Transformer.preprocess): cut at its length (`ceiling`: the
        handler's max_length, where it was tokenized), then a query expanded with the expansion token up to the
        expansion length (attended or not)."""
        if encoded.unbounded or encoded.type_ids is not None:
            return encoded
        cut = self.spec.cut(options.input_type, ceiling)
        encoded = recut(encoded, cut, specials, options.truncation_direction == "left")
        expansion = self.spec.expansion if options.input_type == "query" else None
        target = min(expansion.length, ceiling) if expansion is not None else 0
        if expansion is None or self.expansion_id is None or len(encoded.ids) >= target:
            return encoded
        extra = target - len(encoded.ids)
        attention = (1,) * len(encoded.ids) + (int(expansion.attend),) * extra
        return replace(encoded, ids=encoded.ids + (self.expansion_id,) * extra, attention=attention)


def _resolve(model_dir: str, spec: MultiVectorSpec) -> tuple[Keep, int | None]:
    """The skiplist's ids (words that are not one vocabulary token dropped, as MultiVectorMask drops them) and the
    query expansion token's id (the named token; else the mask token; else EOS)."""
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    unk, unk_token = tokenizer.unk_token_id, tokenizer.unk_token
    skip: set[int] = set()
    for word in spec.skiplist_words:
        token_id = tokenizer.convert_tokens_to_ids(word)
        if not (unk is not None and token_id == unk and word != unk_token):
            skip.add(int(token_id))
    keep_only = frozenset(spec.keep_only_token_ids) if spec.keep_only_token_ids is not None else None
    keep = Keep(frozenset(skip), spec.skiplist_tasks, keep_only)
    expansion_id = None
    if spec.expansion is not None:
        if spec.expansion.token is not None:
            expansion_id = tokenizer.convert_tokens_to_ids(spec.expansion.token)
        else:
            expansion_id = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.eos_token_id
    return keep, None if expansion_id is None else int(expansion_id)


def load_token_head(model_dir: str, attention: str | None = None) -> tuple[Any, Any]:
    """The encoder and the chain's Dense layers over every token, in eval mode, and the model's facts."""
    from transformers import AutoModel

    from bucketing.model.head import EngineError, ModelInfo, dense_layers, load_pretrained, usable_positions

    try:
        spec = read_multivector(model_dir)
    except ChainError as e:
        raise EngineError(f"{model_dir}: {e}") from None
    extra = {"attn_implementation": attention} if attention else {}
    model = load_pretrained(AutoModel, model_dir, **extra)
    cfg = model.config
    dims = spec.chain.dense[-1].out_features if spec.chain.dense else int(cfg.hidden_size)
    info = ModelInfo(usable_positions(cfg), dims, (), int(cfg.vocab_size), chain=spec.chain)
    head = TokenHead(model, dense_layers(model_dir, spec.chain))
    return head.eval(), info


class TokenHead(torch.nn.Module):
    """The encoder's last hidden states, through the chain's Dense layers token by token (kept float32)."""

    pooled = False
    types = False
    inputs = ("input_ids", "attention_mask")
    output_axes = {0: "batch", 1: "sequence"}  # the exported graph's output: one vector per token

    def __init__(self, model: torch.nn.Module, dense: Sequence[torch.nn.Module] = ()) -> None:
        super().__init__()
        self.model = model
        self.masks: Any = None  # for export: attention masks from plain tensor ops
        self.dense = torch.nn.ModuleList(dense)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        attention = attention_mask if self.masks is None else self.masks(attention_mask)
        out = self.model(input_ids=input_ids, attention_mask=attention, return_dict=False)[0]
        if out.dtype != torch.float32:
            out = out.float()
        for layer in self.dense:
            out = layer(out)
        vectors: torch.Tensor = out
        return vectors
