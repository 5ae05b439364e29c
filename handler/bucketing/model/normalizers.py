"""A tokenizer's normalizer, as the handler bounds and extends it: how much it may lengthen a text (refused in one
line over MAX_EXPANSION), and lowercasing first (sentence-transformers' `do_lower_case`)."""

from __future__ import annotations

import os
from typing import Any

MAX_EXPANSION = 100  # the most a normalizer may lengthen a text (NFKC's worst is 18x; a lowercasing one 36x)
# How many characters each normalizer may make of one (Unicode's bounds for its normal forms; a case mapping 2),
# and the ones that add around it: BERT's (CJK spaced, accents split, lowercased).
EXPANSION = {"NFC": 3, "NFD": 4, "NFKC": 18, "NFKD": 18, "Lowercase": 2, "ByteLevel": 4, "BertNormalizer": 3 * 4 * 2}
EXPANSION |= dict.fromkeys(("Strip", "StripAccents", "Nmt"), 1)


def check_normalizer(model_dir: str, before: int = 1) -> None:
    """Refuse, in one line, a tokenizer.json whose normalizer (after one that may make `before` characters of one:
    `lowercase_first`'s) may lengthen a text more than MAX_EXPANSION times (a chain of N x Replace("l", "ll") makes
    2**N characters of each "l"): every text then costs at most that many times its bounded prefix."""
    import json

    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return  # built by transformers from vocab files, with the model family's own normalizer
    with open(path, encoding="utf-8") as f:
        spec = json.load(f).get("normalizer")
    factor, added = expansion(spec)
    factor *= before
    if factor > MAX_EXPANSION or added > MAX_EXPANSION:
        raise ValueError(
            f"{model_dir}: tokenizer.json's normalizer may make {factor:.3g} characters of one (and add {added}); "
            f"allowed: at most {MAX_EXPANSION}, so that no text costs more than {MAX_EXPANSION}x its characters"
        )


def expansion(spec: Any) -> tuple[float, int]:
    """How much a normalizer (tokenizer.json's object) may lengthen a text: n characters become at most
    `factor` x n + `added`. Its Replace, Prepend and Sequence from their fields; a named one from EXPANSION; any
    other (a Precompiled char map) measured alone on every character of the Basic Multilingual Plane."""
    if not isinstance(spec, dict):
        return 1.0, 0
    kind = spec.get("type")
    if kind == "Sequence":
        factor, added = 1.0, 0
        for step in spec.get("normalizers") or []:
            f, a = expansion(step)
            factor, added = factor * f, int(added * f) + a
        return factor, added
    if kind == "Replace":
        content, pattern = str(spec.get("content", "")), spec.get("pattern") or {}
        literal = pattern.get("String") if isinstance(pattern, dict) else None
        if isinstance(literal, str) and literal:
            return max(1.0, len(content) / len(literal)), 0
        return float(len(content) + 1), 0  # a regex may match the empty string: content between every character
    if kind == "Prepend":
        return 1.0, len(str(spec.get("prepend", "")))
    if kind in EXPANSION:
        return float(EXPANSION[kind]), 0
    return _measured(spec), 0


def _measured(spec: dict[str, Any]) -> float:
    """The most characters one normalizer (no Sequence: one pass) makes of one character of the BMP."""
    import json

    from tokenizers import Tokenizer as Backend

    model = {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}
    bare = {"version": "1.0", "normalizer": spec, "model": model, "added_tokens": []}
    try:
        normalizer = Backend.from_str(json.dumps(bare)).normalizer
    except Exception:  # noqa: BLE001 - transformers reports a normalizer it cannot read when it loads the file
        return 1.0
    chars = (chr(c) for c in range(0x10000) if not 0xD800 <= c < 0xE000)
    return float(max(len(normalizer.normalize_str(c)) for c in chars))


def lowercase_first(backend: Any) -> None:
    """Lowercase every text before the tokenizer's own normalizer, unless that already lowercases (what
    sentence-transformers does for `do_lower_case: true`)."""
    from tokenizers.normalizers import Lowercase, Sequence

    current = backend.normalizer
    if current is not None and current.normalize_str("A") == "a":
        return
    backend.normalizer = Sequence([Lowercase(), *([current] if current is not None else [])])
