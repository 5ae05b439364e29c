"""The openvino engine's bfloat16 refusal (a pure test over what OpenVINO reports): bfloat16 is served only where
OpenVINO lists BF16 among the CPU's capabilities, compiled the graph in bf16, and runs its matrix products in bf16."""

from __future__ import annotations

from collections import Counter

from bucketing.engines.openvino_engine import PRECISIONS, bf16_refusal

CAPABILITIES = ["BF16", "WINOGRAD", "FP32", "INT8", "BIN", "EXPORT_IMPORT"]  # this AMD EPYC's (avx512_bf16, no AMX)


def test_bf16_is_served_where_openvino_runs_the_products_in_bf16():
    assert bf16_refusal(CAPABILITIES, "bf16", Counter({"bf16": 36})) is None


def test_each_reason_is_one_line_naming_the_way_out():
    without = [c for c in CAPABILITIES if c != "BF16"]
    lines = [
        bf16_refusal(without, "f32", Counter({"f32": 36})),
        bf16_refusal(CAPABILITIES, "f32", Counter({"f32": 36})),
        bf16_refusal(CAPABILITIES, "bf16", Counter({"f32": 36})),
        bf16_refusal(CAPABILITIES, "bf16", Counter()),
    ]
    assert "lists no BF16 among this CPU's capabilities (WINOGRAD, FP32" in str(lines[0])
    assert "compiled the graph in f32, not bf16" in str(lines[1])
    assert "none of the compiled graph's matrix products runs in bf16 (36 in f32)" in str(lines[2])
    assert "(none found)" in str(lines[3])
    for line in lines:
        assert line is not None and "\n" not in line
        assert line.startswith("handler.dtype bfloat16 on engine openvino: ")
        assert line.endswith("; use dtype float32, or engine torch")


def test_every_cpu_dtype_has_its_precision_hint():
    from bucketing.engines.precision import CPU_DTYPES

    assert {d: PRECISIONS[d] for d in CPU_DTYPES} == {"float32": "f32", "bfloat16": "bf16"}
