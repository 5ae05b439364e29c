"""The user's own traffic as a workload: `--texts FILE` (.txt one text per line, .jsonl or .csv with a text field).

Parsing is pure (`parse_texts` takes the file's bytes); `load_texts` adds the file and the sampling. Every problem
is a `TextsError` whose message is one line naming the file and, where there is one, the line.
"""

from __future__ import annotations

import csv
import io
import json
import random
from pathlib import Path

from bench.inputs.workloads import Workload

FORMATS = (".txt", ".jsonl", ".csv")
PREFIX = "file:"  # a configuration's workload naming the --texts file


def workload_name(path: Path) -> str:
    """`file:<name>`: the workload label of a texts file (configurations, reports, the histogram)."""
    return f"{PREFIX}{path.name}"


class TextsError(ValueError):
    """A texts file the bench cannot use; the message is one line."""


def _decode(data: bytes, name: str) -> list[str]:
    lines = data.split(b"\n")
    out = []
    for number, raw in enumerate(lines, 1):
        try:
            out.append(raw.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as e:
            raise TextsError(f"{name}: line {number} is not UTF-8 ({e.reason} at byte {e.start})") from None
    if out and out[0].startswith("\ufeff"):
        out[0] = out[0][1:]  # a byte-order mark, as spreadsheet programs write
    return out


def _from_jsonl(lines: list[str], name: str, field: str) -> list[str]:
    texts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise TextsError(f"{name}: line {number} is not JSON ({e.msg})") from None
        if not isinstance(record, dict) or field not in record:
            keys = ", ".join(list(record)[:8]) if isinstance(record, dict) else type(record).__name__
            raise TextsError(f"{name}: line {number} has no field {field!r} (it has: {keys}); use --text-field")
        if not isinstance(record[field], str):
            raise TextsError(f"{name}: line {number}: {field!r} is {type(record[field]).__name__}, not a string")
        texts.append(record[field])
    return texts


def _from_csv(lines: list[str], name: str, field: str) -> list[str]:
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    if not reader.fieldnames or field not in reader.fieldnames:
        columns = ", ".join(reader.fieldnames or []) or "none"
        raise TextsError(f"{name}: no column {field!r} (columns: {columns}); use --text-field")
    texts = []
    try:
        for row in reader:
            value = row.get(field)
            if value is None:
                raise TextsError(f"{name}: line {reader.line_num} has no value in column {field!r}")
            texts.append(value)
    except csv.Error as e:
        raise TextsError(f"{name}: line {reader.line_num}: {e}") from None
    return texts


def parse_texts(data: bytes, name: str, field: str = "text") -> list[str]:
    """The texts of a file's bytes, by the file's suffix; blank texts are dropped."""
    suffix = Path(name).suffix.lower()
    if suffix not in FORMATS:
        raise TextsError(f"{name}: unknown format {suffix or '(no suffix)'!r}; allowed: {', '.join(FORMATS)}")
    lines = _decode(data, name)
    if suffix == ".txt":
        texts = lines
    elif suffix == ".jsonl":
        texts = _from_jsonl(lines, name, field)
    else:
        texts = _from_csv(lines, name, field)
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise TextsError(f"{name}: no texts (the file is empty or every text is blank)")
    return texts


def sample_texts(texts: list[str], n: int | None, seed: int) -> list[str]:
    """`n` texts drawn without replacement (all of them, shuffled, when n is None or larger); the same for a seed."""
    if n is not None and n < 1:
        raise TextsError(f"--sample: got {n}; allowed: 1 or more")
    rng = random.Random(f"texts:{seed}")
    k = len(texts) if n is None else min(n, len(texts))
    return rng.sample(texts, k)


def load_texts(path: Path, field: str = "text", sample: int | None = None, seed: int = 0) -> Workload:
    """A workload of the file's texts (a seeded shuffle or sample of them), labelled `file:<name>`."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TextsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TextsError(f"{path}: is a folder, not a file") from None
    except OSError as e:
        raise TextsError(f"{path}: cannot be read ({e.strerror})") from None
    texts = sample_texts(parse_texts(data, str(path), field), sample, seed)
    return Workload(workload_name(path), tuple(texts), tuple(0 for _ in texts), seed)
