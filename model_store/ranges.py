"""Fixed int8/uint8 ranges for a dense embedding model, from calibration texts: what `precision: int8/uint8`
answers with (sentence-transformers' `quantize_embeddings(..., ranges=...)`), the same for every batch.

`python -m model_store.ranges MODEL_DIR --texts FILE`: embeds FILE's texts (one per line, blank lines skipped)
with `SentenceTransformer(MODEL_DIR).encode()` and writes each dimension's minimum and maximum to
`MODEL_DIR/embedding_ranges.json` (`quantize.RANGES_FILE`, with the calibration vectors, from which a re-normalised
cut's ranges are derived), which the build then carries into the archive (a folder's own file wins over the build's
default texts) and the worker reads at start. Use texts like those you will serve: a component outside its range
is clipped to 0 or 255.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bucketing.quantize import RANGES_FILE, parse_ranges
from model_store import calibration_texts
from model_store.calibration_texts import DEFAULT_TEXTS as DEFAULT_TEXTS  # the build's default count

MIN_TEXTS = 100  # sentence-transformers warns below this many calibration embeddings


def default_texts() -> tuple[list[str], str]:
    """The build's calibration texts when none are given: the bench's long-tail texts
    (`model_store/calibration_texts.py`, seed 0; median 28 tokens, a tail to max_length), and how the build line
    names them."""
    return calibration_texts.default_texts(), calibration_texts.DESCRIPTION


def ranges_of(embeddings: Any) -> dict[str, Any]:
    """Per-dimension minimums and maximums of [n, dim] embeddings, and the embeddings themselves (the worker derives
    a re-normalised cut's ranges from them), as `RANGES_FILE` holds them: float32 values, 9 digits (exact)."""
    array = np.asarray(embeddings, dtype=np.float32)
    if array.ndim != 2 or len(array) < 2:
        raise ValueError("ranges need at least two embeddings")

    def exact(values: Any) -> Any:
        return [float(f"{x:.9g}") for x in values]

    data = {
        "minimums": exact(array.min(axis=0)),
        "maximums": exact(array.max(axis=0)),
        "texts": len(array),
        "embeddings": [exact(row) for row in array],
    }
    parse_ranges(data, array.shape[1])  # what the worker will accept
    return data


def write_ranges(model_dir: Path, texts: list[str], batch_size: int = 32, max_length: int | None = None) -> Path:
    """Embed `texts` with sentence-transformers and write the model folder's `RANGES_FILE`; `max_length`: cut each
    text there, as the archive serves it (a folder whose tokenizer allows more than its positions would fail)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    model.truncate_dim = None  # every dimension's range (a model's truncate_dim uses the first ones, uncut)
    if max_length is not None:
        model.max_seq_length = min(model.max_seq_length or max_length, max_length)
    embeddings = model.encode(texts, batch_size=batch_size, convert_to_numpy=True)
    from bucketing.model.chain import read_chain

    if read_chain(model_dir).normalize is None:  # a plain folder: the handler serves it normalised (normalize: auto)
        embeddings = embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
    path = model_dir / RANGES_FILE
    path.write_text(json.dumps(ranges_of(embeddings)) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("model_dir", type=Path, help="a sentence-transformers embedding model folder")
    parser.add_argument("--texts", type=Path, required=True, help="calibration texts, one per line")
    args = parser.parse_args(argv)
    try:
        texts = [line for line in args.texts.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        print(f"error: --texts {args.texts}: {e}", file=sys.stderr)
        return 2
    if len(texts) < 2:
        print(f"error: {args.texts} holds {len(texts)} texts; ranges need at least two", file=sys.stderr)
        return 2
    if len(texts) < MIN_TEXTS:
        print(f"warning: {len(texts)} texts; ranges are steadier from {MIN_TEXTS} or more", file=sys.stderr)
    path = write_ranges(args.model_dir, texts)
    print(f"wrote {path} ({len(texts)} texts); build the archive again to carry it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
