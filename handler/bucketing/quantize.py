"""An embedding's precision as a request asks it (`precision`): float32 as served, or sentence-transformers'
`quantize_embeddings` packings of the served vector (after Normalize and `dimensions`): `binary` (sign bits packed,
as int8), `ubinary` (the same bits as uint8); `int8`/`uint8` scaled into 256 buckets by per-dimension ranges fixed
per model (a batch's own ranges would make an answer depend on its batch): the model folder's `RANGES_FILE`
(`python -m model_store.ranges`), read by `load_ranges`; without it they are refused. Pure but for reading that
file."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

PrecisionName = Literal["float", "binary", "ubinary", "int8", "uint8"]
# a model folder's fixed int8/uint8 ranges: {"minimums", "maximums", "texts", "embeddings" (the calibration vectors)}
RANGES_FILE = "embedding_ranges.json"


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


@dataclass(frozen=True, eq=False)
class Ranges:
    """A model's fixed int8/uint8 ranges: each dimension's [minimum, maximum] over the calibration texts' served
    vectors, and those vectors where the file keeps them, from which the ranges of a re-normalised cut (a request's
    `dimensions`) are derived exactly as sentence-transformers calibrated on the same cut would take them."""

    bounds: Any  # float32 [2, dimensions]
    calibration: Any = None  # float32 [texts, dimensions]: the served vectors the bounds came from; None: not kept

    def fit(self, size: int, renormalized: bool) -> Any:
        """The ranges of what is quantized: the served vector's first `size` components, L2-normalised after the cut
        when `renormalized` (their own ranges then), else the bounds' first components (a cut that keeps values)."""
        if not renormalized or size >= self.bounds.shape[1]:
            return self.bounds
        if self.calibration is None:
            raise ValueError(f"{RANGES_FILE} keeps no calibration vectors to fit a re-normalised cut")
        return self._cut(size)

    @functools.cache  # noqa: B019 - a model's few cut sizes, for the worker's life
    def _cut(self, size: int) -> Any:
        rows = self.calibration[:, :size]
        rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), np.float32(1e-12))
        return np.stack([rows.min(axis=0), rows.max(axis=0)]).astype(np.float32)


def parse_ranges(data: Any, dimensions: int | None) -> Ranges:
    """A `RANGES_FILE`'s content (`minimums`, `maximums`, optionally the calibration `embeddings`) as `Ranges`;
    ValueError (one line) for anything else: JSON numbers only (no strings, booleans, NaN or infinities), each
    minimum at most its maximum, a span float32 holds."""
    if not isinstance(data, dict) or not {"minimums", "maximums"} <= set(data):
        raise ValueError(f'{RANGES_FILE} must be an object with "minimums" and "maximums" lists')
    ranges = _numbers([data["minimums"], data["maximums"]], "minimums and maximums must be lists of numbers")
    if dimensions is None and ranges.ndim == 2:  # the build, where the model's embedding size is not known
        dimensions = ranges.shape[1]
    if ranges.ndim != 2 or ranges.shape != (2, dimensions):
        raise ValueError(
            f"{RANGES_FILE} holds {ranges.shape[-1] if ranges.ndim == 2 else 'no'} dimensions per list; this model's "
            f"embeddings have {dimensions}: compute them again for this model (python -m model_store.ranges)"
        )
    if not np.all(np.isfinite(ranges)) or np.any(ranges[1] < ranges[0]):
        raise ValueError(f"{RANGES_FILE}: every minimum must be finite and at most its maximum")
    with np.errstate(over="ignore"):
        spans = ranges[1] - ranges[0]
    if not np.all(np.isfinite(spans)):
        raise ValueError(f"{RANGES_FILE}: a maximum minus its minimum overflows float32; these are no model's ranges")
    texts = data.get("texts")
    if texts is not None and (not isinstance(texts, int) or isinstance(texts, bool) or texts < 2):
        raise ValueError(f'{RANGES_FILE}: "texts" must be the number of calibration texts (at least 2)')
    if data.get("embeddings") is None:
        return Ranges(ranges)
    rows = _numbers(data["embeddings"], '"embeddings" must be a list of the calibration vectors, lists of numbers')
    if rows.ndim != 2 or rows.shape[1] != dimensions or len(rows) < 2 or not np.all(np.isfinite(rows)):
        raise ValueError(f'{RANGES_FILE}: "embeddings" must hold at least 2 finite vectors of {dimensions} numbers')
    return Ranges(ranges, rows)


def _numbers(value: Any, says: str) -> Any:
    """Nested lists of JSON numbers as float32 (a string or boolean among them: ValueError(says))."""

    def numbers(item: Any) -> bool:
        if isinstance(item, list):
            return all(numbers(x) for x in item)
        return isinstance(item, int | float) and not isinstance(item, bool)

    if not numbers(value):
        raise ValueError(f"{RANGES_FILE}: {says}")
    try:
        with np.errstate(over="ignore"):
            return np.asarray(value, dtype=np.float32)
    except ValueError:  # ragged lists
        raise ValueError(f"{RANGES_FILE}: {says}") from None


def load_ranges(path: Path, dimensions: int | None) -> Ranges:
    """A `RANGES_FILE` read as the build and the worker read it: UTF-8 JSON (no NaN or Infinity), `parse_ranges`."""

    def constant(name: str) -> Any:
        raise ValueError(f"{RANGES_FILE}: {name} is not a number JSON allows")

    try:
        return parse_ranges(json.loads(path.read_bytes().decode("utf-8"), parse_constant=constant), dimensions)
    except UnicodeDecodeError as e:
        raise ValueError(f"{RANGES_FILE} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{RANGES_FILE} is not JSON ({e.msg}, line {e.lineno})") from None
