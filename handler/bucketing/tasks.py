"""Model side: tokenization without padding, collation of a sub-batch, and the two tasks."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch


@dataclass(frozen=True)
class Encoded:
    """One tokenized text: its ids (special tokens included) and whether max_length cut it."""

    ids: tuple[int, ...]
    truncated: bool


class Tokenizer:
    """A fast tokenizer used once per delivered batch, truncating at max_length and never padding."""

    def __init__(self, model_dir: str, max_length: int) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(model_dir)
        if not getattr(hf, "is_fast", False):
            raise ValueError(f"{model_dir}: a fast tokenizer (tokenizer.json) is required")
        self.pad_id = int(hf.pad_token_id if hf.pad_token_id is not None else 0)
        self._backend = hf.backend_tokenizer
        self._backend.no_padding()
        self._backend.enable_truncation(max_length)

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        return [Encoded(tuple(e.ids), bool(e.overflowing)) for e in self._backend.encode_batch(list(texts))]


def collate(rows: Sequence[Sequence[int]], padded_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pad rows to `padded_len`; the mask is None when no row needs padding."""
    ids = np.full((len(rows), padded_len), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), padded_len), dtype=np.int64)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = row
        mask[r, : len(row)] = 1
    if all(len(row) == padded_len for row in rows):
        return torch.from_numpy(ids), None
    return torch.from_numpy(ids), torch.from_numpy(mask)


class Task(Protocol):
    """What the handler needs from a task: a forward pass per sub-batch, and one answer per text."""

    max_positions: int

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None) -> np.ndarray: ...

    def answer(self, output: np.ndarray, encoded: Encoded) -> dict[str, Any]: ...


class EmbeddingTask:
    """Mean pooling over real tokens, optionally L2-normalised."""

    def __init__(self, model_dir: str, normalize: bool) -> None:
        from transformers import AutoModel

        self.model = AutoModel.from_pretrained(model_dir).eval()
        self.max_positions = int(self.model.config.max_position_embeddings)
        self.normalize = normalize

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None) -> np.ndarray:
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        if mask is None:
            pooled = hidden.mean(dim=1)
        else:
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
        return pooled.float().numpy()

    def answer(self, output: np.ndarray, encoded: Encoded) -> dict[str, Any]:
        return {"embedding": output.tolist(), "tokens": len(encoded.ids), "truncated": encoded.truncated}


class ClassificationTask:
    """Sequence classification: softmax scores and the top label from the model's id2label."""

    def __init__(self, model_dir: str) -> None:
        from transformers import AutoModelForSequenceClassification

        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
        self.max_positions = int(self.model.config.max_position_embeddings)
        n = int(self.model.config.num_labels)
        id2label = self.model.config.id2label or {}
        self.labels = [str(id2label.get(i, f"LABEL_{i}")) for i in range(n)]

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None) -> np.ndarray:
        logits = self.model(input_ids=ids, attention_mask=mask).logits
        return torch.softmax(logits.float(), dim=-1).numpy()

    def answer(self, output: np.ndarray, encoded: Encoded) -> dict[str, Any]:
        scores = {label: float(p) for label, p in zip(self.labels, output)}
        return {
            "label": self.labels[int(np.argmax(output))],
            "scores": scores,
            "tokens": len(encoded.ids),
            "truncated": encoded.truncated,
        }


def load_task(task: str, model_dir: str, normalize: bool = True) -> Task:
    if task == "classification":
        return ClassificationTask(model_dir)
    return EmbeddingTask(model_dir, normalize)
