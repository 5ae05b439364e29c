"""BGE-M3's heads over its encoder, as FlagEmbedding 1.4's `EncoderOnlyEmbedderM3Model` computes them, in one graph
(`M3Head`): what every engine runs (torch; onnxruntime and openvino the graph exported from it).

One pass answers all three outputs; per row and token it gives `1 + width` floats (`width`: the larger of the hidden
size and the ColBERT size):
- column 0: the token's lexical weight, `relu(sparse_linear(h))` (`_sparse_embedding`'s token weights);
- row 0, the next `hidden` columns: the CLS token's last hidden state (`_dense_embedding`, "cls"; normalised in the
  answer, as `normalize_embeddings` does);
- rows 1.., the next `colbert_dim` columns: `colbert_linear(h[:, 1:])` (`_colbert_embedding`, every token but the
  first; the answer keeps the real ones and normalises them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bucketing.kinds.bgem3.folder import COLBERT_FILE, SPARSE_FILE, M3Spec, read_bgem3
from bucketing.model.chain import ChainError


class M3Head(torch.nn.Module):
    """The encoder's last hidden states through BGE-M3's sparse and ColBERT layers (float32), packed per token."""

    pooled = False
    types = False
    inputs = ("input_ids", "attention_mask")
    output_axes = {0: "batch", 1: "sequence"}  # the exported graph's output: one row per token

    def __init__(self, model: torch.nn.Module, sparse: torch.nn.Linear, colbert: torch.nn.Linear) -> None:
        super().__init__()
        self.model = model
        self.masks: Any = None  # for export: attention masks from plain tensor ops
        self.sparse = sparse
        self.colbert = colbert
        self.hidden = int(sparse.in_features)
        self.width = max(self.hidden, int(colbert.out_features))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        attention = attention_mask if self.masks is None else self.masks(attention_mask)
        hidden = self.model(input_ids=input_ids, attention_mask=attention, return_dict=False)[0]
        if hidden.dtype != torch.float32:
            hidden = hidden.float()
        weights = torch.relu(self.sparse(hidden))  # [rows, tokens, 1]
        first = _widen(hidden[:, :1], self.width)  # the CLS token's hidden state: the dense output
        rest = _widen(self.colbert(hidden[:, 1:]), self.width)  # as FlagEmbedding: every token but the first
        return torch.cat([weights, torch.cat([first, rest], dim=1)], dim=-1)


def _widen(x: torch.Tensor, width: int) -> torch.Tensor:
    """`x` padded with zero columns to `width` (unchanged when it is that wide)."""
    extra = width - int(x.shape[-1])
    return x if extra == 0 else torch.nn.functional.pad(x, (0, extra))


def linear(path: Path, features: int, out: int) -> torch.nn.Linear:
    """A Linear layer from a `torch.save`d state dict (weights only), as FlagEmbedding loads it."""
    layer = torch.nn.Linear(features, out)
    layer.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return layer.eval()


def load_m3_head(model_dir: str, attention: str | None = None) -> tuple[M3Head, Any]:
    """The encoder (as `AutoModel` loads it, in eval mode) with its two layers, and the model's facts."""
    from transformers import AutoModel

    from bucketing.model.head import EngineError, ModelInfo, load_pretrained, usable_positions

    try:
        spec: M3Spec = read_bgem3(model_dir)
    except ChainError as e:
        raise EngineError(f"{model_dir}: {e}") from None
    extra = {"attn_implementation": attention} if attention else {}
    model = load_pretrained(AutoModel, model_dir, **extra)
    cfg = model.config
    folder = Path(model_dir)
    sparse = linear(folder / SPARSE_FILE, spec.hidden_size, 1)
    colbert = linear(folder / COLBERT_FILE, spec.hidden_size, spec.colbert_dim)
    info = ModelInfo(usable_positions(cfg), spec.hidden_size, (), int(cfg.vocab_size), chain=spec.chain)
    return M3Head(model, sparse, colbert).eval(), info
