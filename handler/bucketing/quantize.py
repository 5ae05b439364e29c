"""An embedding's precision as a request asks it (`precision`): float32 as served, or sentence-transformers'
`quantize_embeddings` packings of the served vector (after Normalize and `dimensions`): `binary` (sign bits packed,
as int8), `ubinary` (the same bits as uint8). `int8`/`uint8` need per-dimension ranges fixed per model (a batch's
own ranges would make an answer depend on its batch): refused until a model stores them. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

PrecisionName = Literal["float", "binary", "ubinary", "int8", "uint8"]


@dataclass(frozen=True)
class Precision:
    """One precision: its name in a request, the numpy type of its values and KServe v2's datatype for them."""

    name: PrecisionName
    dtype: str  # numpy's
    v2_datatype: str  # KServe v2's tensor datatype
    packed: bool = False  # one bit per dimension, 8 to a value (the answer has ceil(dim / 8) values)
    ranged: bool = False  # needs per-dimension ranges (int8, uint8)

    def apply(self, vector: Any) -> Any:
        """The served float32 vector in this precision, exactly as `quantize_embeddings(vector, name)`."""
        row = np.asarray(vector, dtype=np.float32)
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
