"""The house's size: no source module of the wings (`test_layering.module_names`: the handler, `model_store`, `tsctl`,
`bench`) runs over 400 lines; one that grows past it is split by job (as `model/encoded.py` left
`model/tokenizer.py`, and `hosts/answers.py` the standalone host's app, both over 400)."""

from __future__ import annotations

from tests.unit.test_layering import ROOT, module_names

MOST_LINES = 400


def test_no_source_module_is_over_the_house_size():
    modules = module_names().values()
    assert len(modules) > 100  # the wings were found
    over = {str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > MOST_LINES}
    assert over == {}, f"over {MOST_LINES} lines: split each by job"
