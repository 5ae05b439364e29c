"""A BGE-M3 folder as FlagEmbedding 1.4 reads it (`EncoderOnlyEmbedderM3Runner.get_model`): a transformers encoder
(XLM-RoBERTa for BAAI/bge-m3) with `sparse_linear.pt` (a `Linear(hidden, 1)` state dict: each token's lexical weight)
and `colbert_linear.pt` (a `Linear(hidden, colbert_dim)` state dict: each token's ColBERT vector) beside it.

Only the shapes are read here (memory-mapped, weights-only: `chain.pytorch_bin_shapes`); the layers are built in
`heads`. FlagEmbedding reads no sentence-transformers file of the folder (no prompts, no max_seq_length, no
lower-casing): neither does this kind.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bucketing.model.chain import Chain, ChainError, pytorch_bin_shapes
from bucketing.model_kinds import MODEL_KINDS

FILES = MODEL_KINDS["bgem3"].files  # its heads beside the encoder (the registry says which; an archive keeps them)
SPARSE_FILE, COLBERT_FILE = FILES
# What the build records of the chain, and the worker's ready line: FlagEmbedding's M3 (CLS pooling, normalised).
CHAIN = Chain(source="flagembedding", pooling=("cls",), normalize=True)


@dataclass(frozen=True)
class M3Spec:
    """What a BGE-M3 folder computes after its encoder: the encoder's hidden size and the ColBERT vectors' size."""

    hidden_size: int
    colbert_dim: int

    @property
    def chain(self) -> Chain:
        return CHAIN

    def describe(self) -> dict[str, Any]:
        """What was read, as plain data (the archive's model-config and the worker's ready line)."""
        return {
            **CHAIN.describe(),
            "outputs": {
                "dense": f"CLS hidden state ({self.hidden_size}), L2-normalised",
                "sparse": f"relu({SPARSE_FILE} {self.hidden_size}->1) per token, max per id, special tokens dropped",
                "colbert": f"{COLBERT_FILE} {self.hidden_size}->{self.colbert_dim} per token after the first, "
                "L2-normalised",
            },
        }


def is_bgem3(model_dir: Path | str) -> bool:
    """Whether the folder is laid out as BAAI/bge-m3: a transformers config.json with both heads' files beside it."""
    folder = Path(model_dir)
    return (folder / "config.json").is_file() and all((folder / name).is_file() for name in FILES)


def read_bgem3(model_dir: Path | str) -> M3Spec:
    """The folder's heads, checked against its encoder's hidden size; ChainError in one line otherwise."""
    folder = Path(model_dir)
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise ChainError(
            f"{folder}: no {' or '.join(missing)}; a BGE-M3 model is served from a folder laid out as BAAI/bge-m3 "
            f"(the encoder with {SPARSE_FILE} and {COLBERT_FILE} beside it)"
        )
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ChainError(f"{folder / 'config.json'}: unreadable ({type(e).__name__})") from None
    hidden = config.get("hidden_size") if isinstance(config, Mapping) else None
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
        raise ChainError(f"{folder / 'config.json'}: no hidden_size; not a transformers encoder's config")
    sparse = _linear(folder / SPARSE_FILE, hidden)
    if sparse != 1:
        raise ChainError(
            f"{folder / SPARSE_FILE}: a Linear({hidden}, 1) is expected (one weight per token), got {sparse}"
        )
    return M3Spec(hidden, _linear(folder / COLBERT_FILE, hidden))


def _linear(path: Path, hidden: int) -> int:
    """The output size of a Linear layer's state dict (`weight` [out, hidden], `bias` [out]); ChainError otherwise."""
    shapes = pytorch_bin_shapes(path)
    weight, bias = shapes.get("weight"), shapes.get("bias")
    if set(shapes) != {"weight", "bias"} or weight is None or len(weight) != 2 or weight[1] != hidden:
        raise ChainError(
            f"{path}: a Linear layer's state dict from {hidden} features (config.json hidden_size) is expected "
            f"(weight [out, {hidden}], bias [out]), got {shapes}; refused"
        )
    if bias != [weight[0]] or weight[0] < 1:
        raise ChainError(f"{path}: bias {bias} does not match weight {weight}; refused")
    return int(weight[0])
