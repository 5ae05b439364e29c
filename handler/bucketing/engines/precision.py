"""Reduced precision on the CPU: whether the CPU multiplies bfloat16 natively (a pure test over /proc/cpuinfo's
text), and how far a reduced-precision engine's answers lie from float32's (pure figures over two outputs).

A bfloat16 worker states its fidelity, never silently: at start it runs `PROBE_TEXTS` (and, for a classifier whose
tokenizer joins pairs, each text paired with the next) on the float32 model and on its own engine, and refuses to
start when the cosine minimum falls below `handler.min_cosine`. `model_store.build --dtype bfloat16` prints the
same figures on the same texts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bucketing.config import ConfigError
from bucketing.model.tokenizer import collate

if TYPE_CHECKING:
    from bucketing.model.tokenizer import Tokenizer

CPU_DTYPES = ("float32", "bfloat16")  # what a CPU worker may run (bfloat16 where NATIVE_BF16)
# /proc/cpuinfo flags of a CPU that multiplies bfloat16 in hardware (Intel AMX tiles; AVX512-BF16 dot products).
NATIVE_BF16 = ("amx_bf16", "avx512_bf16")
CPUINFO = Path("/proc/cpuinfo")

# Sample prose the fidelity is measured on, at worker start and at build time: short and long, plain and technical.
PROBE_TEXTS = (
    "TorchServe hands the handler a list of requests.",
    "Short text.",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "How do I reset my password if I no longer have access to my email account?",
    "Bucketing sorts texts by length and pads each sub-batch only to its own longest text, so short texts do not "
    "pay for long ones.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "What is the capital of Australia?",
    "Canberra is the capital city of Australia, chosen as a compromise between Sydney and Melbourne.",
    "The stock market fell sharply on Tuesday after the central bank raised interest rates by half a point.",
    "A transformer encoder maps a sequence of tokens to a sequence of vectors, one per token; pooling then turns "
    "them into one vector per text, and a dense layer may project it to fewer dimensions before normalisation.",
    "I loved this film: the acting was superb and the ending made me cry.",
    "Terrible service, cold food, and we waited an hour for the bill.",
    "Water boils at 100 degrees Celsius at sea level.",
    "The patient presented with a persistent cough, mild fever and fatigue lasting two weeks.",
    "def add(a, b): return a + b",
    "Mount Everest is the highest mountain above sea level, on the border between Nepal and China; climbers "
    "usually attempt it in May, when the jet stream moves north and the winds at the summit drop.",
)


def cpu_info() -> str:
    """The text of /proc/cpuinfo ("" where there is none: not Linux)."""
    try:
        return CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The CPU's feature flags: the words of every `flags` line of /proc/cpuinfo's text."""
    found: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            found.update(value.split())
    return frozenset(found)


def native_bf16(cpuinfo: str) -> str | None:
    """The flag by which the CPU multiplies bfloat16 natively (`amx_bf16`, else `avx512_bf16`), or None."""
    flags = cpu_flags(cpuinfo)
    return next((flag for flag in NATIVE_BF16 if flag in flags), None)


def check_cpu_dtype(dtype: str, cpuinfo: str) -> None:
    """A ConfigError (one line) for a dtype the CPU would not run natively: float16 always, bfloat16 without
    `NATIVE_BF16`; float32 always passes."""
    if dtype == "float32":
        return
    if dtype == "bfloat16":
        if native_bf16(cpuinfo) is None:
            raise ConfigError(
                "handler.dtype: got 'bfloat16' on a CPU without native bfloat16 (neither amx_bf16 nor avx512_bf16 in "
                "/proc/cpuinfo): it would emulate it, slower than float32; allowed here: float32"
            )
        return
    raise ConfigError(
        f"handler.dtype: got {dtype!r} on the CPU; allowed: float32, or bfloat16 where the CPU multiplies it natively "
        "(amx_bf16 or avx512_bf16); float16 is for a worker with a CUDA GPU"
    )


@dataclass(frozen=True)
class Fidelity:
    """How far a reduced-precision engine's outputs lie from float32's on the same probe inputs.

    `cosine_min`/`cosine_mean`: per text, the cosine of the two output vectors (embeddings; a classifier's logits).
    `max_abs_diff`: the largest component difference of the answers (unit vectors; a classifier's scores).
    `changed` of `compared`: classifiers only: texts whose top label changes (several labels), or pairs of texts
    whose order by score flips (one label: a reranker); `ties`: of those compared, how many lie within
    `max_abs_diff` of each other in float32 (an order the measured error may flip)."""

    dtype: str
    texts: int
    cosine_min: float
    cosine_mean: float
    max_abs_diff: float
    changed: int | None = None
    compared: int = 0
    ties: int = 0

    def describe(self) -> str:
        """One line for the ready line and the build's output."""
        line = (
            f"{self.dtype} fidelity vs float32 on {self.texts} sample texts: cosine min {self.cosine_min:.6f} "
            f"mean {self.cosine_mean:.6f}, max abs diff {self.max_abs_diff:.1e}"
        )
        if self.changed is not None:
            line += f", {self.changed} of {self.compared} top labels/orders changed ({self.ties} within the error)"
        return line

    def refusal(self, floor: float) -> str | None:
        """Why a worker with this fidelity must not start under `handler.min_cosine` = floor, or None."""
        if self.cosine_min >= floor:
            return None
        return (
            f"handler.dtype {self.dtype}: cosine min {self.cosine_min:.6f} to float32 on {self.texts} sample texts is "
            f"below handler.min_cosine {floor:g}; use dtype float32, or lower min_cosine knowingly"
        )


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two [rows, dims] arrays (1.0 for two zero rows, 0.0 for one)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    dot = np.einsum("ij,ij->i", a, b)
    both = (na > 0) & (nb > 0)
    out = np.where(both, dot / np.where(both, na * nb, 1.0), 0.0)
    return np.where((na == 0) & (nb == 0), 1.0, out)


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    out: np.ndarray = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return out


def scores(logits: np.ndarray, activation: str) -> np.ndarray:
    """A classifier's scores from its logits, rows at once (as `answers.activate` per row)."""
    x = np.asarray(logits, dtype=np.float64)
    if activation == "identity":
        return x
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=1, keepdims=True)
    return out


def measure(
    dtype: str, reference: np.ndarray, candidate: np.ndarray, classifier: bool = False, activation: str = "softmax"
) -> Fidelity:
    """The fidelity of `candidate` (a reduced-precision engine's outputs) to `reference` (float32's), row for row."""
    cos = cosines(reference, candidate)
    if not classifier:
        diff = float(np.abs(unit(reference) - unit(candidate)).max())
        return Fidelity(dtype, len(cos), float(cos.min()), float(cos.mean()), diff)
    ref, got = scores(reference, activation), scores(candidate, activation)
    if ref.shape[1] == 1:  # one logit a row: its cosine is only its sign; compare the scores across the texts instead
        cos = cosines((ref - ref.mean()).T, (got - got.mean()).T)  # their centred cosine (correlation), one figure
    diff = float(np.abs(ref - got).max())
    changed, compared, ties = order_changes(ref, got, diff)
    return Fidelity(dtype, len(ref), float(cos.min()), float(cos.mean()), diff, changed, compared, ties)


def order_changes(ref: np.ndarray, got: np.ndarray, error: float) -> tuple[int, int, int]:
    """(changed, compared, ties): for several labels, texts whose top label differs; for one label, pairs of texts
    whose order by score differs. `ties`: compared items whose float32 margin is at most `error`."""
    if ref.shape[1] > 1:
        top = np.sort(ref, axis=1)
        margin = top[:, -1] - top[:, -2]
        changed = int((ref.argmax(axis=1) != got.argmax(axis=1)).sum())
        return changed, len(ref), int((margin <= error).sum())
    r, g = ref[:, 0], got[:, 0]
    i, j = np.triu_indices(len(r), k=1)
    changed = int((np.sign(r[i] - r[j]) != np.sign(g[i] - g[j])).sum())
    return changed, len(i), int((np.abs(r[i] - r[j]) <= error).sum())


def probe_inputs(
    tokenizer: Tokenizer, pairs: bool, texts: Sequence[str] = PROBE_TEXTS
) -> tuple[np.ndarray, np.ndarray, None, np.ndarray | None]:
    """The padded batch the fidelity is measured on (engine arguments: ids, mask, pool mask, token types): the
    texts, and with `pairs` (a classifier whose tokenizer joins pairs) each text paired with the next as well."""
    encoded = list(tokenizer.encode(texts))
    if pairs and tokenizer.pair is not None:
        encoded += tokenizer.encode_pairs(list(zip(texts, texts[1:])))
    longest = max(len(e.ids) for e in encoded)
    ids, mask = collate([e.ids for e in encoded], longest, tokenizer.pad_id)
    types = None
    if any(e.type_ids for e in encoded):
        types, _ = collate([e.type_ids or (0,) * len(e.ids) for e in encoded], longest, 0)
    return ids, mask, None, types
