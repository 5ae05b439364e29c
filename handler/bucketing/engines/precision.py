"""Reduced precision on the CPU: whether the CPU multiplies bfloat16 natively (a pure test over /proc/cpuinfo's
text), and how far a reduced-precision engine's answers lie from float32's (pure figures over two outputs).

A bfloat16 worker states its fidelity, never silently: at start it runs the probe set (`probe_set`: prose and each
kind of token prose lacks; for a classifier whose tokenizer joins pairs, each text paired with the next as well) on
the float32 model and on its own engine, and refuses to start when the cosine minimum falls below
`handler.min_cosine`. `model_store.build --dtype bfloat16` prints the same figures on the same probe set. That is a
guarantee on the probe set only: what served texts get is observed by shadow checking (`shadow`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bucketing.config import ConfigError

# what a CPU worker may run (bfloat16 where NATIVE_BF16), as the dtypes declare it
from bucketing.engine_registry import CPU_DTYPES as CPU_DTYPES
from bucketing.engine_registry import DTYPE_KINDS
from bucketing.engine_registry import NATIVE_BF16 as NATIVE_BF16
from bucketing.model.encoded import Encoded, collate

if TYPE_CHECKING:
    from bucketing.model.tokenizer import Tokenizer

CPUINFO = Path("/proc/cpuinfo")

# The probe set a reduced-precision worker is measured on at start (and the build, on the same set): prose, and each
# kind of token a vocabulary holds that prose lacks (`probe_set`). Deterministic: the same inputs on every start.
PROSE = (
    "TorchServe hands the handler a list of requests.",
    "Short text.",
    "How do I reset my password if I no longer have access to my email account?",
    "Canberra is the capital city of Australia, chosen as a compromise between Sydney and Melbourne.",
    "A transformer encoder maps a sequence of tokens to a sequence of vectors, one per token; pooling then turns "
    "them into one vector per text, and a dense layer may project it to fewer dimensions before normalisation.",
    "Terrible service, cold food, and we waited an hour for the bill.",
    "The patient presented with a persistent cough, mild fever and fatigue lasting two weeks.",
    "def add(a, b): return a + b",
)
DIGITS = (
    "3.14159265358979 2.71828 1,234,567.89 -0.000123 6.022e23 0x1F4A 0b1011 2026-11-30 23:59:59 +44 20 7946 0958",
    "Order 4471-0093-5528 shipped 12/03/2025; 17 of 240 units (7.08%) were returned at $19.99 each, 3x faster.",
)
PUNCTUATION = (
    "!!! ??? ... --- (( )) [[ ]] {{ }} <> @ # $ % ^ & * _ + = | \\ / ~ ` ; : ' \" , . ?! -> => :: ;; ...",
    "\u00abQuoted\u00bb \u2014 \u201ccurly\u201d \u2018single\u2019 \u2013 dash \u2022 bullet \u00a7 section "
    "\u00b6 \u2020 \u2021 \u00a9 \u00ae \u2122 \u00b0 \u00b1 \u00d7 \u00f7 \u00bf\u00a1",
)
SCRIPTS = (  # CJK, then other scripts
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3001\u4eca\u65e5\u306f\u826f\u3044\u5929"
    "\u6c17\u3067\u3059\u3002\u5317\u4eac\u662f\u4e2d\u56fd\u7684\u9996\u90fd\u3002\u6211\u559c\u6b22"
    "\u559d\u8336\u3002\uc11c\uc6b8\uc740 \ud55c\uad6d\uc758 \uc218\ub3c4\uc785\ub2c8\ub2e4.",
    "\u041c\u043e\u0441\u043a\u0432\u0430 \u2014 \u0441\u0442\u043e\u043b\u0438\u0446\u0430. "
    "\u0391\u03b8\u03ae\u03bd\u03b1 \u03b5\u03af\u03bd\u03b1\u03b9. \u0627\u0644\u0642\u0627\u0647\u0631"
    "\u0629 \u0639\u0627\u0635\u0645\u0629. \u0928\u0908 \u0926\u093f\u0932\u094d\u0932\u0940 "
    "\u05d9\u05e8\u05d5\u05e9\u05dc\u05d9\u05dd \u0e01\u0e23\u0e38\u0e07\u0e40\u0e17\u0e1e caf\u00e9 "
    "Z\u00fcrich \u00c5lesund",
)
# Characters a vocabulary may lack (its unknown token, where it has one): emoji, symbols, rare scripts.
RARE_CHARACTERS = (
    "\U0001f642\U0001f680\U0001f9ea\U0001f99c\U0001fa90\u26f7\u2603\u265e\u2697\u232c\u23da\u2624\ua66e"
    "\u16a0\u16a2\u16a6\u16a8\u16b1\u16b2\U0001d518\U0001d52b\u2d63\u2d30\U00013000\U00013080\u13a0\u13a1"
)
WORD_PIECE_ROWS, WORD_PIECES = 8, 48  # rows of vocabulary ids spread over the whole vocabulary, this many a row
GROUP = 8  # probe rows run per pass, in order of length (each pass padded to its own longest row)


@dataclass(frozen=True)
class Probe:
    """One probe input: what kind of tokens it holds (`probe_set`'s names), its text (None: vocabulary ids given
    as they are), and its tokens."""

    kind: str
    text: str | None
    encoded: Encoded


def cpu_info() -> str:
    """The text of /proc/cpuinfo ("" where there is none: not Linux)."""
    try:
        return CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu_name(cpuinfo: str) -> str:
    """The CPU's model name and what it multiplies bfloat16 with (e.g. `Intel(R) Xeon(R) Processor, amx_bf16
    avx512_bf16`, `AMD EPYC 7B13, no native bfloat16`): what a figure is named beside."""
    names = [
        v.strip()
        for k, sep, v in (ln.partition(":") for ln in cpuinfo.splitlines())
        if sep and k.strip() == "model name"
    ]
    flags = cpu_flags(cpuinfo)
    native = [f for f in NATIVE_BF16 if f in flags]
    return f"{names[0] if names else 'unknown CPU'}, {' '.join(native) if native else 'no native bfloat16'}"


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
    kind = DTYPE_KINDS.get(dtype)
    flags = None if kind is None else kind.cpu_flags
    if flags == ():  # any CPU runs it
        return
    if flags:
        if cpu_flags(cpuinfo).isdisjoint(flags):
            raise ConfigError(
                f"handler.dtype: got {dtype!r} on a CPU without native {dtype} (neither "
                f"{' nor '.join(flags)} in /proc/cpuinfo): it would emulate it, slower than float32; allowed "
                "here: float32"
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
    `max_abs_diff` of each other in float32 (an order the measured error may flip); `worst`: the kind of probe input
    of the cosine min."""

    dtype: str
    texts: int
    cosine_min: float
    cosine_mean: float
    max_abs_diff: float
    changed: int | None = None
    compared: int = 0
    ties: int = 0
    worst: str = ""  # the kind of probe input (`probe_set`) the cosine min was measured on, where known

    def describe(self) -> str:
        """One line for the ready line and the build's output."""
        line = (
            f"{self.dtype} fidelity vs float32 on {self.texts} probe texts: cosine min {self.cosine_min:.6f}"
            f"{self.on_worst} mean {self.cosine_mean:.6f}, max abs diff {self.max_abs_diff:.1e}"
        )
        if self.changed is not None:
            line += f", {self.changed} of {self.compared} top labels/orders changed ({self.ties} within the error)"
        return line

    @property
    def on_worst(self) -> str:
        """Where the cosine min was measured, for a line: " (on digits)"; empty where unknown."""
        return f" (on {self.worst})" if self.worst else ""

    def refusal(self, floor: float) -> str | None:
        """Why a worker with this fidelity must not start under `handler.min_cosine` = floor, or None."""
        if self.cosine_min >= floor:
            return None
        return (
            f"handler.dtype {self.dtype}: cosine min {self.cosine_min:.6f}{self.on_worst} to float32 on {self.texts} "
            "probe texts is "
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
    dtype: str,
    reference: np.ndarray,
    candidate: np.ndarray,
    classifier: bool = False,
    activation: str = "softmax",
    kinds: Sequence[str] = (),
) -> Fidelity:
    """The fidelity of `candidate` (a reduced-precision engine's outputs) to `reference` (float32's), row for row;
    `kinds`: each row's kind of probe input (`Probe.kind`), to name the worst."""
    cos = cosines(reference, candidate)
    if not classifier:
        diff = float(np.abs(unit(reference) - unit(candidate)).max())
        worst = kinds[int(cos.argmin())] if len(kinds) == len(cos) else ""
        return Fidelity(dtype, len(cos), float(cos.min()), float(cos.mean()), diff, worst=worst)
    ref, got = scores(reference, activation), scores(candidate, activation)
    if ref.shape[1] == 1:  # one logit a row: its cosine is only its sign; compare the scores across the texts instead
        cos = cosines((ref - ref.mean()).T, (got - got.mean()).T)  # their centred cosine (correlation), one figure
    diff = float(np.abs(ref - got).max())
    changed, compared, ties = order_changes(ref, got, diff)
    worst = kinds[int(cos.argmin())] if len(kinds) == len(cos) else ""  # none for one label: one figure
    return Fidelity(dtype, len(ref), float(cos.min()), float(cos.mean()), diff, changed, compared, ties, worst)


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


def probe_set(tokenizer: Tokenizer, pairs: bool = False) -> tuple[Probe, ...]:
    """The probe inputs for this tokenizer: prose, digits, punctuation, CJK and other scripts, text heavy with the
    unknown token (characters this vocabulary lacks; none where it has no unknown token), rows of vocabulary ids
    spread over the whole vocabulary (rare word pieces among them), and two texts cut at max_length (prose; every
    kind mixed); with `pairs` (a classifier whose tokenizer joins pairs), each text paired with the next."""
    texts = [("prose", t) for t in PROSE] + [("digits", t) for t in DIGITS] + [("punctuation", t) for t in PUNCTUATION]
    texts += [("scripts", t) for t in SCRIPTS]
    unknown = unknown_characters(tokenizer)
    if unknown:
        texts.append(("unknown", " ".join(unknown)))
        texts.append(("unknown", " ".join(f"{c} {w}" for c, w in zip(unknown, " ".join(PROSE[2:4]).split()))))
    short, mixed = list(texts), " ".join(t for _, t in texts)
    room = tokenizer.max_length  # texts repeated past max_length, cut there
    texts.append(("long", " ".join(PROSE * (1 + room // max(1, len(tokenizer.encode([" ".join(PROSE)])[0].ids))))))
    texts.append(("long", " ".join([mixed] * (1 + room // max(1, len(tokenizer.encode([mixed])[0].ids))))))
    probes = [Probe(kind, text, e) for (kind, text), e in zip(texts, tokenizer.encode([t for _, t in texts]))]
    probes += [Probe("word pieces", None, tokenizer.wrap(row)) for row in word_piece_rows(tokenizer)]
    if pairs and tokenizer.pair is not None:
        joined = [(a, b) for (_, a), (_, b) in zip(short, short[1:])]
        probes += [Probe("pair", None, e) for e in tokenizer.encode_pairs(joined)]
    return tuple(probes)


def unknown_characters(tokenizer: Tokenizer) -> list[str]:
    """Those of `RARE_CHARACTERS` this vocabulary reads as its unknown token alone (none without one)."""
    if tokenizer.unk_id is None:
        return []
    encoded = tokenizer.encode(list(RARE_CHARACTERS))
    own = slice(len(tokenizer.prefix), len(tokenizer.prefix) + 1)
    alone = [len(e.ids) == tokenizer.specials + 1 and e.ids[own] == (tokenizer.unk_id,) for e in encoded]
    return [c for c, unknown in zip(RARE_CHARACTERS, alone) if unknown]


def word_piece_rows(tokenizer: Tokenizer) -> list[tuple[int, ...]]:
    """`WORD_PIECE_ROWS` rows of vocabulary ids (special tokens left out), evenly spaced over the whole vocabulary
    and dealt out in turn, so that each row mixes frequent and rare pieces."""
    ids = [i for i in range(tokenizer.vocab_size) if i not in tokenizer.special_ids]
    count = min(len(ids), WORD_PIECE_ROWS * WORD_PIECES)
    spread = [ids[k * len(ids) // count] for k in range(count)]
    return [tuple(spread[r::WORD_PIECE_ROWS]) for r in range(WORD_PIECE_ROWS) if spread[r::WORD_PIECE_ROWS]]


def run_probes(engine: Callable[..., np.ndarray], probes: Sequence[Probe], pad_id: int) -> np.ndarray:
    """The engine's output for each probe, in probe order: run in passes of up to `GROUP` rows of similar length
    (engine arguments: ids, mask, pool mask (None), token types where a row has them)."""
    order = sorted(range(len(probes)), key=lambda i: len(probes[i].encoded.ids))
    outputs = []
    for start in range(0, len(order), GROUP):
        encoded = [probes[i].encoded for i in order[start : start + GROUP]]
        longest = max(len(e.ids) for e in encoded)
        ids, mask = collate([e.ids for e in encoded], longest, pad_id)
        types = None
        if any(e.type_ids for e in encoded):
            types, _ = collate([e.type_ids or (0,) * len(e.ids) for e in encoded], longest, 0)
        outputs.append(engine(ids, mask, None, types))
    ran = np.concatenate(outputs)
    out = np.empty_like(ran)
    out[order] = ran
    return out
