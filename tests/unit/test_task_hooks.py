"""The task hooks a model kind may override, as the pipeline reads them: where an input type is cut (`reach`: how
far texts are tokenized) and how many tokens a row is planned as (`compute` collates a pass as wide as its longest
row, whatever the plan)."""

from __future__ import annotations

from functools import partial

import numpy as np

from bucketing.kinds.task import Rows, TaskHooks, reach
from bucketing.model.encoded import Encoded
from bucketing.planning.planner import plan_static
from bucketing.serving.passes import Item, compute


class Static(TaskHooks):
    """A task whose "query" rows run no model: cut 2 tokens past max_length, planned as one token."""

    name = "test"

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def cut(self, input_type: str | None, ceiling: int) -> int:
        return ceiling + 2 if input_type == "query" else ceiling

    def planned(self, encoded: Encoded) -> int:
        return 1 if encoded.input_type == "query" else len(encoded.ids)

    def forward(self, rows: Rows) -> np.ndarray:
        self.shapes.append(rows.ids.shape)
        return rows.mask.sum(axis=1, keepdims=True)


def test_texts_are_tokenized_as_far_as_any_input_type_is_cut():
    assert reach(TaskHooks(), 8) == 8  # type: ignore[arg-type]
    assert reach(Static(), 8) == 10  # type: ignore[arg-type]


def test_a_row_planned_shorter_than_it_is_is_collated_whole():
    """A static plan pads to max_length 4; a row of 6 tokens planned as one still fits, its pass 6 wide."""
    task = Static()
    items = [Item(0, Encoded((1, 2, 3), False)), Item(0, Encoded((1, 2, 3, 4, 5, 6), True, input_type="query"))]
    computed = compute(items, partial(plan_static, max_length=4), task, pad_id=0)  # type: ignore[arg-type]
    assert [int(o[0]) for o in computed.outputs if o is not None] == [3, 6]
    assert None not in computed.outputs
    assert task.shapes == [(2, 6)]
    assert computed.stats.real_tokens == 4  # the rows as planned: 3 and 1
