"""An embedding's precision as a request asks it (`precision`): float32 as served, or sentence-transformers'
`quantize_embeddings` packings of the served vector (after Normalize and `dimensions`): `binary` (sign bits packed,
as int8), `ubinary` (the same bits as uint8); `int8`/`uint8` scaled into 256 buckets by per-dimension ranges fixed
per model (a batch's own ranges would make an answer depend on its batch): the model folder's `RANGES_FILE`
(`python -m model_store.ranges`), read by `parse_ranges`; without it they are refused. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

PrecisionName = Literal["float", "binary", "ubinary", "int8", "uint8"]
RANGES_FILE = "embedding_ranges.json"  # a model folder's fixed int8/uint8 ranges: {"minimums", "maximums", "texts"}


@dataclass(frozen=True)
class Precision:
    """One precision: its name in a request, the numpy type of its values and KServe v2's datatype for them."""

    name: PrecisionName
    dtype: str  # numpy's
    v2_datatype: str  # KServe v2's tensor datatype
    packed: bool = False  # one bit per dimension, 8 to a value (the answer has ceil(dim / 8) values)
    ranged: bool = False  # needs per-dimension ranges (int8, uint8)

    def apply(self, vector: Any, ranges: Any = None) -> Any:
        """The served float32 vector in this precision, exactly as `quantize_embeddings(vector, name, ranges=...)`
        (`ranges`: the model's [minimums, maximums], for int8/uint8; their first components where cut)."""
        row = np.asarray(vector, dtype=np.float32)
        if self.ranged:
            if ranges is None:
                raise ValueError(f"{self.name} needs the model's ranges")
            starts, ends = np.asarray(ranges, dtype=np.float32)[:, : row.shape[-1]]
            steps = (ends - starts) / 255
            steps = np.where(steps == 0, 1, steps)
            buckets = np.clip(np.floor((row - starts) / steps), 0, 255)
            return (buckets - 128).astype(np.int8) if self.dtype == "int8" else buckets.astype(np.uint8)
        if not self.packed:
            return row
        bits = np.packbits(row > 0, axis=-1)
        return (bits - 128).astype(np.int8) if self.dtype == "int8" else bits

    def size(self, dimensions: int) -> int:
        """How many values an answer of `dimensions` components holds."""
        return (dimensions + 7) // 8 if self.packed else dimensions


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("float", "float32", "FP32"),
        Precision("binary", "int8", "INT8", packed=True),
        Precision("ubinary", "uint8", "UINT8", packed=True),
        Precision("int8", "int8", "INT8", ranged=True),
        Precision("uint8", "uint8", "UINT8", ranged=True),
    )
}
FLOAT = PRECISIONS["float"]


def parse_ranges(data: Any, dimensions: int) -> Any:
    """A `RANGES_FILE`'s content as a float32 [2, dimensions] array; ValueError (one line) for anything else."""
    if not isinstance(data, dict) or not {"minimums", "maximums"} <= set(data):
        raise ValueError(f'{RANGES_FILE} must be an object with "minimums" and "maximums" lists')
    try:
        ranges = np.asarray([data["minimums"], data["maximums"]], dtype=np.float32)
    except (TypeError, ValueError):
        raise ValueError(f"{RANGES_FILE}: minimums and maximums must be lists of numbers") from None
    if ranges.shape != (2, dimensions):
        raise ValueError(
            f"{RANGES_FILE} holds {ranges.shape[-1] if ranges.ndim == 2 else 'no'} dimensions per list; this model's "
            f"embeddings have {dimensions}: compute them again for this model (python -m model_store.ranges)"
        )
    if not np.all(np.isfinite(ranges)) or np.any(ranges[1] < ranges[0]):
        raise ValueError(f"{RANGES_FILE}: every minimum must be finite and at most its maximum")
    return ranges
