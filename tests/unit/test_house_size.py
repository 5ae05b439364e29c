"""The house's size: no source module of the four wings (the handler, `tsctl`, `model_store`, `bench`) runs over
400 lines; one that grows past it is split by job (as `model/encoded.py` left `model/tokenizer.py`, and
`hosts/answers.py` the standalone host's app, both over 400)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WINGS = ("handler", "tsctl", "model_store", "bench")
MOST_LINES = 400


def test_no_source_module_is_over_the_house_size():
    modules = [p for wing in WINGS for p in sorted((ROOT / wing).rglob("*.py"))]
    assert len(modules) > 100  # the wings were found
    over = {str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > MOST_LINES}
    assert over == {}, f"over {MOST_LINES} lines: split each by job"
