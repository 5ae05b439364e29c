"""The embedding kind: the model's module chain (pooling, Dense) in the engine, answered as one embedding per
text, L2-normalised as the chain says (or as `handler.normalize` forces)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bucketing.answers import Answer
from bucketing.engines import Engine, load_engine
from bucketing.kinds.task import Rows, TaskHooks
from bucketing.model.chain import Chain, ChainError, read_chain
from bucketing.model.encoded import Encoded
from bucketing.model.head import ModelInfo
from bucketing.model_kinds import MODEL_KINDS, refused_folder
from bucketing.quantize import RANGES_FILE, Ranges, load_ranges


class EmbeddingTask(TaskHooks):
    """The model's module chain (pooling, Dense) in the engine; normalised when answered (`normalize`: the
    chain's Normalize, or the handler's setting; a request may ask otherwise)."""

    name = "embedding"
    labels = None
    chunk_refusal: str | None = None
    late_refusal: str | None = None

    def __init__(
        self, engine: Engine, info: ModelInfo, normalize: bool, ranges: Any = None, truncate_dim: int | None = None
    ) -> None:
        self.engine = engine
        self.ranges = ranges
        self.truncate_dim = truncate_dim
        self.max_positions = info.max_positions
        self.dimensions = info.hidden_size
        self.chain = info.chain
        self.tokenizer_dir = info.folder or None  # its Transformer's folder (`0_Transformer/` in an older layout)
        self.normalize = normalize
        self.late_refusal = late_refusal(engine, info.chain)
        if info.chain.dense:  # windows pool before the chain's Dense layers, which the engine runs after pooling
            self.chunk_refusal = (
                "is not served for a model whose chain has Dense layers after its pooling (windows are pooled "
                "before them, and the engine runs them inside each pass)"
            )

    def forward(self, rows: Rows) -> Sequence[np.ndarray]:
        """Pooled outputs of a padded sub-batch, each row's leading (prompt) tokens `skips` left out of pooling; a
        late-chunked row's: one mean of token embeddings per span (`Rows.pools`), from the same pass."""
        if not any(rows.pools):
            return list(self.engine(rows.ids, rows.mask, rows.pool_mask()))
        pooled, tokens = self.engine.states(rows.ids, rows.mask, rows.pool_mask())
        outputs = list(pooled)
        for row, pools in enumerate(rows.pools):
            if pools:
                outputs[row] = np.stack([tokens[row, list(p)].mean(axis=0, dtype=np.float32) for p in pools])
        return outputs

    @property
    def settings(self) -> Chain:
        return self.chain

    def answer(self, output: np.ndarray, encoded: Encoded) -> Answer:
        spans = encoded.spans if encoded.pools else None
        return Answer(
            output,
            len(encoded.ids),
            encoded.truncated,
            normalize=self.normalize,
            truncate_dim=self.truncate_dim,
            spans=spans,
        )

    @staticmethod
    def load(config: Any, model_dir: str, gpu_id: Any = None) -> EmbeddingTask:
        engine, info = load_engine(config, model_dir, gpu_id)
        ranges = read_ranges(Path(model_dir), info.hidden_size)
        cut, source = truncate_dim(config.truncate_dim, Path(model_dir), info.hidden_size)
        task = EmbeddingTask(engine, info, normalizes(config.normalize, info.chain), ranges, cut)
        if cut is not None:
            task.ready_note = (
                f"; answers cut to truncate_dim {cut} ({source}) as sentence-transformers' encode() cuts them: "
                f"after normalisation, not re-normalised; a request's dimensions at most {cut}"
            )
        if ranges is not None:
            task.ready_note += f"; int8/uint8 answered with the ranges of its {RANGES_FILE}"
        return task

    @staticmethod
    def read_settings(folder: Path) -> Chain:
        """The folder's module chain; ChainError for a folder of a kind with a head of its own."""
        other = refused_folder(MODEL_KINDS["embedding"], folder)
        if other is not None:
            raise ChainError(f"{folder}: a {other.saved_as} folder; build it with --task {other.name}")
        return read_chain(folder)

    @staticmethod
    def describe(folder: Path) -> dict[str, Any] | None:
        return read_chain(folder).describe()


def late_refusal(engine: Engine, chain: Chain) -> str | None:
    """Why late chunking is not served for this model on this engine (the rest of a line); None when it is: mean
    pooling with no Dense layer after it (a span's vector is the mean of its token embeddings), on an engine that
    gives token embeddings."""
    if tuple(chain.pooling) != ("mean",) or chain.dense:
        return (
            "is served for models that mean-pool with no Dense layer after it (a span's vector is the mean of its "
            f"token embeddings); this one pools {'+'.join(chain.pooling)}{' then Dense' if chain.dense else ''}"
        )
    if not getattr(engine, "has_states", False):
        return (
            f"needs the encoder's token embeddings, which this {engine.name} graph does not give; rebuild the archive "
            "(python -m model_store.build), which exports them"
        )
    return None


def normalizes(setting: str, chain: Chain) -> bool:
    """Whether embeddings are L2-normalised by default: forced by `handler.normalize: true|false`; with `auto`,
    as the sentence-transformers chain says (it ends in Normalize), and always for a plain Hugging Face folder."""
    if setting != "auto":
        return setting == "true"
    return chain.normalize if chain.normalize is not None else True


def truncate_dim(setting: int, folder: Path, dimensions: int) -> tuple[int | None, str]:
    """The model's cut and where it comes from: `handler.truncate_dim`, else (0) the folder's own
    `config_sentence_transformers.json` `truncate_dim` (which sentence-transformers saves and loads), else none;
    ChainError (one line) for one that is no integer from 1 to the embedding size."""
    value: Any = setting or None
    source = "handler.truncate_dim"
    path = folder / "config_sentence_transformers.json"
    if value is None and path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ChainError(f"{path}: {e}") from None
        value, source = (saved.get("truncate_dim") if isinstance(saved, dict) else None), path.name
    if value is None:
        return None, ""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= dimensions:
        raise ChainError(
            f"{source}: truncate_dim {value!r} must be an integer from 1 to {dimensions}, this model's embedding size"
        )
    return value, source


def read_ranges(folder: Path, dimensions: int) -> Ranges | None:
    """The folder's fixed int8/uint8 ranges (`quantize.RANGES_FILE`), or None where it has none; ChainError (one
    line) for a file that is not such ranges (`quantize.load_ranges`, as the build reads it)."""
    path = folder / RANGES_FILE
    if not path.is_file():
        return None
    try:
        return load_ranges(path, dimensions)
    except ValueError as e:
        raise ChainError(f"{path}: {e}") from None
