"""Model side: tokenization without padding, collation of a sub-batch, and the two tasks."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .protocols.base import Answer


@dataclass(frozen=True)
class Encoded:
    """One tokenized text: its ids (special tokens included) and whether max_length cut it."""

    ids: tuple[int, ...]
    truncated: bool


class Tokenizer:
    """A fast tokenizer used once per delivered batch, truncating at max_length and never padding.

    A fast tokenizer reads a whole text before truncating, so its cost grows with the body, not with max_length
    (6 MB of prose took 11 s). Each long text is therefore tokenized from a prefix cut at a space, and the result
    is kept only when the prefix alone overflowed max_length with a whole space-separated word between the last
    kept token and the cut: the kept tokens then come from words the cut did not touch, and are the tokens the
    whole text gives. Otherwise the prefix grows (4x) until that holds or the prefix is the whole text.
    """

    def __init__(self, model_dir: str, max_length: int) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(model_dir)
        if not getattr(hf, "is_fast", False):
            raise ValueError(f"{model_dir}: a fast tokenizer (tokenizer.json) is required")
        self.pad_id = int(hf.pad_token_id if hf.pad_token_id is not None else 0)
        self.max_length = max_length
        self._backend = hf.backend_tokenizer
        self._backend.no_padding()
        self._backend.no_truncation()
        self.prefix, self.suffix = self._special_tokens()
        self._backend.enable_truncation(max_length)
        self.vocab_size = int(self._backend.get_vocab_size(with_added_tokens=True))
        self.cut_chars = CUT_CHARS_PER_TOKEN * max_length

    def _special_tokens(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ids the tokenizer puts before and after a text's own tokens (e.g. [CLS] and [SEP])."""
        bare = self._backend.encode(PROBE, add_special_tokens=False).ids
        full = self._backend.encode(PROBE).ids
        for start in range(len(full) - len(bare) + 1):
            if full[start : start + len(bare)] == bare:
                return tuple(full[:start]), tuple(full[start + len(bare) :])
        raise ValueError("cannot locate a text's tokens among the special tokens the tokenizer adds")

    @property
    def specials(self) -> int:
        """How many special tokens every input carries."""
        return len(self.prefix) + len(self.suffix)

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        """Each text's tokens, truncated at max_length, exactly as the tokenizer gives them for the whole text."""
        out: list[Encoded | None] = [None] * len(texts)
        pending, budget = list(range(len(texts))), self.cut_chars
        while pending:
            pieces = [_prefix(texts[i], budget) for i in pending]
            retry = []
            for i, piece, e in zip(pending, pieces, self._backend.encode_batch(pieces)):
                if len(piece) == len(texts[i]):
                    out[i] = Encoded(tuple(e.ids), bool(e.overflowing))
                elif e.overflowing and _word_after(piece, max(end for _, end in e.offsets)):
                    out[i] = Encoded(tuple(e.ids), True)
                else:
                    retry.append(i)
            pending, budget = retry, budget * 4
        return [e for e in out if e is not None]

    def wrap(self, ids: Sequence[int]) -> Encoded:
        """Token ids given without special tokens, truncated to fit max_length and wrapped in the special tokens."""
        room = self.max_length - self.specials
        return Encoded(self.prefix + tuple(ids[:room]) + self.suffix, len(ids) > room)

    def empty(self, encoded: Encoded) -> bool:
        """Whether a text gave no token of its own (only invisible or control characters, say)."""
        return len(encoded.ids) <= self.specials


PROBE = "hello"
CUT_CHARS_PER_TOKEN = 32  # the first prefix tried: enough for max_length tokens of any ordinary prose


def _prefix(text: str, budget: int) -> str:
    """The text cut at its last space within `budget` characters (spaces before it dropped), or all of it."""
    if len(text) <= budget:
        return text
    cut = text.rfind(" ", 0, budget)
    return text[:cut].rstrip(" ") if cut > 0 else ""  # no space to cut at yet: a longer prefix is tried next


def _word_after(piece: str, end: int) -> bool:
    """Whether a whole space-separated word lies between character `end` and the end of `piece`."""
    return " " in piece[end:].strip(" ")


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


class Encoder:
    """The model's first output (hidden states or logits) for ids and mask, traced with TorchScript when asked.

    Tracing removes most of the Python overhead of a forward pass (about 2 ms of 6 for MiniLM on one core), which
    lets the planner cut finer. The trace is checked against eager outputs on padded inputs at load; on any
    mismatch or failure it is dropped and the eager model is used.
    """

    def __init__(self, model: torch.nn.Module, torchscript: bool) -> None:
        self.model = model
        self.traced: torch.jit.ScriptModule | None = self._trace() if torchscript else None

    def _eager(self, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask, return_dict=False)[0]

    def _trace(self) -> torch.jit.ScriptModule | None:
        import logging
        import warnings

        example = torch.randint(1000, 2000, (3, 24))
        mask = torch.ones_like(example)
        mask[1, 9:] = 0
        mask[2, 17:] = 0
        try:
            with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.model.config.return_dict = False  # a traced module returns tuples
                traced = torch.jit.trace(
                    self.model, (example[:2, :16], torch.ones_like(example[:2, :16])), strict=False
                )
                check_ids = example.clone()
                diff = traced(check_ids, mask)[0] - self._eager(check_ids, mask)
                if diff.dim() == 3:  # hidden states: padded positions are free to differ
                    diff = diff * mask.unsqueeze(-1)
            if float(diff.abs().max()) > 1e-5:
                raise ValueError(f"traced output differs from eager by {float(diff.abs().max()):.2e}")
            return traced
        except Exception as e:  # noqa: BLE001 - tracing is an optimisation; eager is always correct
            reason = f"{type(e).__name__}: {str(e)[:200]}"
            logging.getLogger(__name__).warning("TorchScript trace unusable (%s); using the eager model", reason)
            return None

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.traced is None:
            return self._eager(ids, mask)
        return self.traced(ids, mask if mask is not None else torch.ones_like(ids))[0]


class Task(Protocol):
    """What the handler needs from a task: a forward pass per sub-batch, and one answer per text."""

    name: str
    max_positions: int
    dimensions: int  # embedding size, or number of labels
    labels: tuple[str, ...] | None  # class names (classification); None for embeddings

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None) -> np.ndarray: ...

    def answer(self, output: np.ndarray, encoded: Encoded) -> Answer: ...


class EmbeddingTask:
    """Mean pooling over real tokens, optionally L2-normalised."""

    name = "embedding"
    labels = None

    def __init__(self, model_dir: str, normalize: bool, torchscript: bool) -> None:
        from transformers import AutoModel

        model = AutoModel.from_pretrained(model_dir).eval()
        self.max_positions = int(model.config.max_position_embeddings)
        self.dimensions = int(model.config.hidden_size)
        self.encoder = Encoder(model, torchscript)
        self.normalize = normalize

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None) -> np.ndarray:
        hidden = self.encoder(ids, mask)
        if mask is None:
            pooled = hidden.mean(dim=1)
        else:
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
        return pooled.float().numpy()

    def answer(self, output: np.ndarray, encoded: Encoded) -> Answer:
        return Answer(output, len(encoded.ids), encoded.truncated)


class ClassificationTask:
    """Sequence classification: softmax scores and the top label from the model's id2label."""

    name = "classification"

    def __init__(self, model_dir: str, torchscript: bool) -> None:
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
        self.max_positions = int(model.config.max_position_embeddings)
        n = int(model.config.num_labels)
        id2label = model.config.id2label or {}
        self.labels = tuple(str(id2label.get(i, f"LABEL_{i}")) for i in range(n))
        self.dimensions = n
        self.encoder = Encoder(model, torchscript)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None) -> np.ndarray:
        logits = self.encoder(ids, mask)
        return torch.softmax(logits.float(), dim=-1).numpy()

    def answer(self, output: np.ndarray, encoded: Encoded) -> Answer:
        return Answer(output, len(encoded.ids), encoded.truncated, self.labels)


def load_task(task: str, model_dir: str, normalize: bool, torchscript: bool) -> Task:
    if task == "classification":
        return ClassificationTask(model_dir, torchscript)
    return EmbeddingTask(model_dir, normalize, torchscript)
