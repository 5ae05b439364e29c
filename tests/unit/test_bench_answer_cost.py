"""bench.probes.answer_cost: every format answers through the real wire formats with the values json.dumps would give,
and a packed answer is many times smaller than float JSON (bytes are exact; speed is never asserted)."""

from __future__ import annotations

from bench.probes import answer_cost


def test_each_format_is_measured_and_binary_is_over_20x_smaller_than_float_json():
    costs = answer_cost.measure(answer_cost.FORMATS, n=3, repeat=1)
    by_name = {c.name: c for c in costs}
    assert list(by_name) == [f.name for f in answer_cost.FORMATS]
    float_json = by_name["ours, float JSON"].bytes_per_text
    assert float_json / by_name["ours, binary"].bytes_per_text >= 20
    assert float_json / by_name["OpenAI, base64"].bytes_per_text >= 3
    assert all(c.us_per_text > 0 and c.json_us_per_text for c in costs)
    assert answer_cost.table(costs).count("\n") == len(costs) + 1
